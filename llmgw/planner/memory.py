"""Per-GPU arithmetic: what each rank holds, and the longest context that still fits.

For one GPU of a candidate the budget is ``usable_fraction x card memory``,
and it must hold that GPU's share of the weights, the runtime's overhead on
that GPU, and the KV cache of the context. Two rules, each learnt from an
estimate that said Llama-3.3-70B at bf16 does not fit on two 80 GB cards
(people run it every day):

* the overhead is charged per GPU from that GPU's share (its slice of each
  layer's activations, its own CUDA context), never from the whole model;
* the usable fraction is the one place slack is reserved. For vLLM it is
  exactly the engine's ``--gpu-memory-utilization``, whose budget vLLM fills
  with weights, activations and KV cache itself, so the overhead constants
  below are the engine's real consumers and carry no margin of their own.

Host memory is the other place weights sit. vLLM keeps none there; llama.cpp
keeps the input embedding on the CPU always, and a CPU replica (no GPU) holds
its weights, KV cache and overhead all in host memory, where the same
arithmetic applies to the node's memory instead of a card's (``host_weights``;
the KV cache and overhead of a CPU replica are its one load's).

KV bytes per token are what the engines allocate, layer by layer:

* vLLM (vllm/v1/kv_cache_interface.py): a layer's page holds, per token,
  ``num_kv_heads_per_rank x (head_size + head_size_v) x dtype`` bytes, in
  blocks of 16 tokens; with fewer KV heads than ranks each rank keeps one
  (linear.py replicates them). MLA layers cache the latent
  ``kv_lora_rank + qk_rope_head_dim`` once per token, replicated on every
  rank. A sliding-window layer needs ``cdiv(min(window - 1 +
  max_num_batched_tokens, context), 16) + 1`` blocks whatever the context
  (SlidingWindowSpec.max_memory_usage_bytes), and vLLM admits a context
  when the sum over layers fits (check_enough_kv_cache_memory).
* llama.cpp (src/llama-kv-cache.cpp): each layer has a K row of
  ``n_head_kv x n_embd_head_k`` and a V row of ``n_head_kv x n_embd_head_v``
  per cell, of ggml row size (f16: 2 bytes a value, q8_0: 34 per 32); MLA
  models cache K only (kv_lora_rank + rope, no V). The context is padded
  to 256 cells. Sliding-window layers of Gemma 2/3 and gpt-oss live in a
  second cache of ``pad256(min(n_ctx, window + n_ubatch))`` cells
  (src/llama-kv-cache-iswa.cpp) unless ``swa_full`` is set, which is the
  library default that llama-cpp-python inherits: there the window saves
  nothing. llama.cpp reads Mistral's and Phi-3's window but runs them with
  full attention, so their cache grows with the context in llama.cpp and
  not in vLLM.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import msgspec

from llmgw.planner.arch import Architecture
from llmgw.planner.quant import row_bytes
from llmgw.planner.tensors import Tensor, layer_devices, rank_fraction

GiB = 1024**3
# Families whose sliding window llama.cpp implements (LLAMA_SWA_TYPE_STANDARD
# with a per-layer pattern); it runs the others' window as full attention.
LLAMA_CPP_SWA_FAMILIES = frozenset({"gemma2", "gemma3", "gpt_oss"})


class EngineSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What an engine does with memory, as far as the planner needs to know.

    ``runtime_bytes``: CUDA context, cuBLAS workspaces and captured CUDA graphs
    on each GPU. ``comm_bytes``: NCCL and all-reduce buffers on each GPU when
    more than one GPU serves the replica. Activations are the batch's hidden
    states through the widest point of a layer, at ``activation_value_bytes``
    each (vLLM computes in bf16, llama.cpp in f32), plus fp32 logits for
    ``logits_rows`` rows of the vocabulary.
    """

    name: str
    split: str                  # "tensor" (vLLM) or "layer" (llama.cpp)
    default_usable_fraction: float
    runtime_bytes: int
    comm_bytes: int
    activation_value_bytes: int
    logits_rows: int
    ubatch: int                 # llama.cpp n_ubatch; vLLM sizes its batch by card (batch_tokens)
    kv_block: int               # vLLM block size; llama.cpp pads n_ctx to this
    swa_full: bool = False
    kv_dtypes: tuple[str, ...] = ()


ENGINES: dict[str, EngineSpec] = {
    # vLLM serve defaults: gpu_memory_utilization 0.9, max_num_seqs 256, block 16.
    # Grounding for the overhead: vLLM's memory profiler (its log in
    # vllm-project/vllm#10511) reports for Llama-3-8B on an 80 GB card an
    # activation peak of 1.26 GiB, where the model below gives 1.06 GiB, and
    # non-torch memory (CUDA context, NCCL) from 0.2 GiB on PCIe cards to 1.8
    # GiB on an H100. These are estimates, not the engine's own numbers; the
    # KV and weight arithmetic above them is exact.
    "vllm": EngineSpec(name="vllm", split="tensor", default_usable_fraction=0.9,
                       runtime_bytes=1 * GiB, comm_bytes=GiB // 2, activation_value_bytes=2,
                       logits_rows=256, ubatch=0, kv_block=16,
                       kv_dtypes=("fp16", "bf16", "fp8")),
    # llama-server defaults: n_ubatch 512, flash attention auto (on for CUDA),
    # SWA cache capped (swa_full false), one sequence.
    "llama.cpp": EngineSpec(name="llama.cpp", split="layer", default_usable_fraction=0.9,
                            runtime_bytes=GiB // 2, comm_bytes=0, activation_value_bytes=4,
                            logits_rows=512, ubatch=512, kv_block=256,
                            kv_dtypes=("fp16", "bf16", "q8_0")),
    # The same llama.cpp through llama-cpp-python (the embedded mode's server):
    # the library default swa_full=true allocates full-size SWA caches.
    "llama-cpp-python": EngineSpec(name="llama-cpp-python", split="layer",
                                   default_usable_fraction=0.9, runtime_bytes=GiB // 2,
                                   comm_bytes=0, activation_value_bytes=4, logits_rows=512,
                                   ubatch=512, kv_block=256, swa_full=True,
                                   kv_dtypes=("fp16", "bf16", "q8_0")),
}

_KV_TYPE = {"fp16": "f16", "bf16": "bf16", "q8_0": "q8_0"}


def batch_tokens(engine: EngineSpec, card_bytes: int) -> int:
    """Tokens one forward pass processes at most: vLLM's max_num_batched_tokens.

    vLLM's `serve` default is 8192 on cards of 70 GiB and more and 2048 below;
    llama.cpp processes n_ubatch tokens at a time.
    """
    if engine.split == "layer":
        return engine.ubatch
    return 8192 if card_bytes >= 70 * GiB else 2048


@dataclass(frozen=True, slots=True)
class GpuLoad:
    """One GPU of a candidate: what it holds before any context, and what context costs.

    ``kv_per_token`` is the cost of each token of context in layers whose cache
    grows with it; ``kv_window_per_token`` the per-token cost of capped
    sliding-window layers, which hold at most ``window`` tokens (+ the batch).
    """

    weights: int
    overhead: int
    kv_per_token: int
    kv_window_per_token: int


def kv_layer_bytes(a: Architecture, engine: EngineSpec, kv_dtype: str, tp: int) -> int:
    """KV bytes per token of one attention layer on one GPU."""
    if engine.split == "tensor":
        width = 1 if kv_dtype == "fp8" else 2
        if a.is_mla:
            return (a.kv_lora_rank + a.qk_rope_head_dim) * width
        per_rank = max(1, a.num_kv_heads // tp)
        return per_rank * (a.head_dim + a.v_head_dim) * width
    ggml = _KV_TYPE[kv_dtype]
    if a.is_mla:
        return row_bytes(ggml, a.kv_lora_rank + a.qk_rope_head_dim)
    return (row_bytes(ggml, a.num_kv_heads * a.head_dim)
            + row_bytes(ggml, a.num_kv_heads * a.v_head_dim))


def capped_layers(a: Architecture, engine: EngineSpec) -> list[bool]:
    """Per layer: does this engine bound its cache by the sliding window?"""
    if a.sliding_window is None:
        return [False] * a.num_layers
    if engine.split == "layer" and (engine.swa_full or a.family not in LLAMA_CPP_SWA_FAMILIES):
        return [False] * a.num_layers
    return [k == "sliding" for k in a.layer_kinds]


def _activation_width(a: Architecture, tp: int) -> int:
    """Values per token alive at a layer's widest point, on one GPU."""
    q = a.num_heads // tp * a.head_dim
    kv = max(1, a.num_kv_heads // tp) * (a.head_dim + a.v_head_dim)
    attn_out = a.num_heads // tp * a.v_head_dim
    if a.is_moe:
        ffn = a.experts_per_token * a.moe_intermediate_size // tp
        ffn += a.shared_experts * a.moe_intermediate_size // tp
        if a.dense_layers:
            ffn = max(ffn, a.intermediate_size // tp)
    else:
        ffn = a.intermediate_size // tp
    return 2 * a.hidden_size + q + kv + attn_out + 3 * ffn


def overhead(a: Architecture, engine: EngineSpec, tp: int, card_bytes: int, *,
             holds_output: bool, gpu: bool = True) -> int:
    """The runtime's own memory on one GPU, computed from that GPU's share."""
    tokens = batch_tokens(engine, card_bytes)
    width = _activation_width(a, tp if engine.split == "tensor" else 1)
    total = tokens * width * engine.activation_value_bytes
    if holds_output:
        total += engine.logits_rows * a.vocab_size * 4
    if gpu:
        total += engine.runtime_bytes
        if tp > 1:
            total += engine.comm_bytes
    return total


def gpu_loads(a: Architecture, inv: list[Tensor], sizes: list[int], engine: EngineSpec,
              gpus: int, kv_dtype: str, card_bytes: int) -> list[GpuLoad]:
    """The load of every GPU of a replica (one entry for a CPU replica, gpus=0)."""
    per_layer = kv_layer_bytes(a, engine, kv_dtype, max(gpus, 1))
    capped = capped_layers(a, engine)
    if engine.split == "tensor":
        share = sum(math.ceil(s * rank_fraction(t, a, gpus))
                    for t, s in zip(inv, sizes, strict=True))
        n_capped = sum(capped)
        return [GpuLoad(weights=share,
                        overhead=overhead(a, engine, gpus, card_bytes, holds_output=True),
                        kv_per_token=per_layer * (a.num_layers - n_capped),
                        kv_window_per_token=per_layer * n_capped)]
    devices = max(gpus, 1)
    place = layer_devices(a.num_layers, devices)
    weights = [0] * devices
    for t, s in zip(inv, sizes, strict=True):
        if t.layer < 0:
            # llama.cpp keeps the input embedding in host memory (host_weights
            # counts it there); the output norm travels with the output layer.
            if t.role == "token_embd" and gpus > 0:
                continue
            dev = place[a.num_layers]
        else:
            dev = place[t.layer]
        weights[dev] += s
    weights[place[a.num_layers]] += output_copy(a, inv, sizes, gpus)
    out: list[GpuLoad] = []
    last = place[a.num_layers]
    for d in range(devices):
        mine = [i for i in range(a.num_layers) if place[i] == d]
        n_capped = sum(1 for i in mine if capped[i])
        out.append(GpuLoad(
            weights=weights[d],
            overhead=overhead(a, engine, 1, card_bytes, holds_output=d == last, gpu=gpus > 0),
            kv_per_token=per_layer * (len(mine) - n_capped),
            kv_window_per_token=per_layer * n_capped))
    return out


def output_copy(a: Architecture, inv: list[Tensor], sizes: list[int], gpus: int) -> int:
    """Bytes of the second copy of a tied embedding that llama.cpp loads as the output layer.

    A tied model's GGUF has no output.weight; the loader creates the output
    layer from token_embd with TENSOR_DUPLICATED (src/llama-model.cpp,
    load_tensors), at the type token_embd has in the file, which llama-quant.cpp
    chose by the output head's rules. The copy is made whenever the output
    layer lands in another buffer than the input embedding
    (llama-model-loader.cpp, create_tensor, reuses the tensor only within one
    buffer type): always when the output layer is on a GPU, since the input
    embedding never is. On a CPU replica it is made when one of the CPU
    backend's extra buffer types has a matrix-product kernel for the output's
    type on that CPU and so takes the output layer into a buffer of its own.
    A tied embedding here is q6_K or q8_0. In the llama.cpp that
    llama-cpp-python 0.3.16 vendors, the AMX buffer takes both
    (ggml-cpu/amx/common.h, qtype_has_amx_kernels): Gemma 3 270M at q4_K_M
    on an AMX Xeon has token_embd repacked into the AMX buffer as the output
    layer, its q8_0 original kept for the input. The repacking buffer takes
    neither (ggml-cpu/repack.cpp takes q4_0, q4_K, iq4_nl and q2_K, by CPU
    feature), so an AVX-512 EPYC or an ARM server shares one copy, and this
    counts one embedding more than it holds there: the side to err on, since
    the planner cannot tell the CPU and too little is an out-of-memory. No
    CPU backend repacks a 16-bit embedding.
    """
    if not a.tie_embeddings:
        return 0
    for t, s in zip(inv, sizes, strict=True):
        if t.role == "token_embd":
            quantised = s < t.params * 2  # fewer than 16 bits a weight
            return s if gpus > 0 or quantised else 0
    return 0


def host_weights(a: Architecture, inv: list[Tensor], sizes: list[int], engine: EngineSpec,
                 gpus: int) -> int:
    """Weight bytes one replica keeps in host memory.

    vLLM copies every weight into GPU memory. llama.cpp keeps the input
    embedding on the CPU whatever it offloads (load_tensors assigns the input
    layer to the CPU device unconditionally); a CPU replica holds all of its
    weights there, with a tied model's output copy (``output_copy``).
    """
    if engine.split == "tensor":
        return 0
    if gpus == 0:
        return sum(sizes) + output_copy(a, inv, sizes, gpus)
    return sum(s for t, s in zip(inv, sizes, strict=True) if t.role == "token_embd")


def kv_bytes(load: GpuLoad, a: Architecture, engine: EngineSpec, context: int,
             card_bytes: int) -> int:
    """KV cache the engine allocates on this GPU for one sequence of ``context`` tokens."""
    window = a.sliding_window or 0
    if engine.split == "tensor":
        block = engine.kv_block
        full = -(-context // block) * block * load.kv_per_token
        if not load.kv_window_per_token:
            return full
        held = min(window - 1 + batch_tokens(engine, card_bytes), context)
        return full + (-(-held // block) + 1) * block * load.kv_window_per_token
    pad = engine.kv_block
    cells = -(-context // pad) * pad
    full = cells * load.kv_per_token
    if not load.kv_window_per_token:
        return full
    swa_cells = -(-min(cells, window + engine.ubatch) // 256) * 256
    return full + swa_cells * load.kv_window_per_token


def window_bytes(load: GpuLoad, a: Architecture, engine: EngineSpec, context: int,
                 card_bytes: int) -> int:
    """The part of ``kv_bytes`` held by window-capped layers (constant once past the window)."""
    no_window = GpuLoad(weights=0, overhead=0, kv_per_token=load.kv_per_token,
                        kv_window_per_token=0)
    return (kv_bytes(load, a, engine, context, card_bytes)
            - kv_bytes(no_window, a, engine, context, card_bytes))


def max_context(load: GpuLoad, a: Architecture, engine: EngineSpec, budget: int,
                card_bytes: int) -> int:
    """Largest context (tokens, at most max_position_embeddings) whose KV fits ``budget``."""
    limit = a.max_position_embeddings
    if budget <= 0 or kv_bytes(load, a, engine, 1, card_bytes) > budget:
        return 0
    if kv_bytes(load, a, engine, limit, card_bytes) <= budget:
        return limit
    lo, hi = 1, limit  # kv(lo) fits, kv(hi) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if kv_bytes(load, a, engine, mid, card_bytes) <= budget:
            lo = mid
        else:
            hi = mid
    if engine.split == "layer":
        # llama.cpp allocates whole 256-cell steps; report a context it will accept as n_ctx.
        lo = lo // engine.kv_block * engine.kv_block or lo
    return lo
