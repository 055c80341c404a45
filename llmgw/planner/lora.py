"""LoRA adapter memory: what a base's adapter slots cost each GPU, and its host cache.

A LoRA adapter replaces a weight ``W`` (``d_out x d_in``) by ``W + B A``
with ``A`` of ``r x d_in`` and ``B`` of ``d_out x r``: ``r (d_in + d_out)``
parameters per adapted matrix (Hu et al., "LoRA: Low-Rank Adaptation of
Large Language Models", 2021, section 4.1). vLLM does not allocate per adapter: at
start it reserves, for every layer it can adapt, stacked tensors of
``max_loras`` slots at ``max_lora_rank`` — ``lora_a_stacked`` of
``max_loras x max_lora_rank x d_in`` and ``lora_b_stacked`` of
``max_loras x d_out x max_lora_rank`` in the model's dtype
(vllm/lora/layers/base_linear.py, ``create_lora_weights``) — so the cost is
fixed by the ``lora`` block, not by the adapters in use. The layers it
adapts in a decoder are the attention projections and the MLP (the packed
``qkv_proj`` and ``gate_up_proj``, ``o_proj``, ``down_proj``), from the
base's config.json:

* q: ``hidden -> heads x head_dim``; k, v: ``hidden -> kv_heads x head_dim``
  (``v_head_dim`` for v); o: ``heads x v_head_dim -> hidden``;
* gate, up: ``hidden -> intermediate``; down: ``intermediate -> hidden``.

So one slot is ``2 bytes x max_rank x num_layers x`` the sum over those
seven matrices of ``d_in + d_out``. With tensor parallelism vLLM shards
``B`` of the column-parallel layers (q, k, v, gate, up) and ``A`` of the
row-parallel ones (o, down) and keeps the other factor whole on every rank
(its default, without ``--fully-sharded-loras``); that is what one GPU holds.
A mixture-of-experts model's experts are counted as one dense MLP of
``intermediate_size``: vLLM adapts the shared projections, and an estimate
per expert would overstate models that do not adapt them.

The host cache (``--max-cpu-loras``) holds whole adapters, unsharded, in
host memory: ``cpu_slots x`` one adapter at ``max_rank``.

Worked example, Llama-3.1-8B (hidden 4096, 32 heads of 128, 8 KV heads,
intermediate 14336, 32 layers) at rank 16: per layer ``16 x (8192 + 5120 +
5120 + 8192 + 3 x 18432)`` = 1,310,720 parameters, 41.9 M over 32
layers, 80 MiB in bf16 per slot; four slots reserve 320 MiB on one GPU, and a
host cache of sixteen holds 1.25 GiB.
"""

from __future__ import annotations

import math

import msgspec

from llmgw.planner.arch import Architecture

DTYPE_BYTES = 2        # bf16/fp16: vLLM's lora_dtype "auto" is the model's dtype


class LoraMemory(msgspec.Struct, frozen=True, kw_only=True):
    """A base's adapter reservation with given slots, rank bound and host cache."""

    slots: int
    max_rank: int
    cpu_slots: int
    bytes_per_gpu: int       # every slot's stacked A and B on one GPU
    host_bytes: int          # the host cache, whole adapters


def _matrices(a: Architecture) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(d_in, d_out) of the adapted matrices of one layer: column-parallel, row-parallel."""
    q, kv, v = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim, \
        a.num_kv_heads * a.v_head_dim
    h, i = a.hidden_size, a.intermediate_size or a.moe_intermediate_size
    column = [(h, q), (h, kv), (h, v), (h, i), (h, i)]
    row = [(a.num_heads * a.v_head_dim, h), (i, h)]
    return column, row


def adapter_params(a: Architecture, rank: int) -> int:
    """Parameters of one adapter of ``rank`` on every adapted layer (unsharded)."""
    column, row = _matrices(a)
    return rank * a.num_layers * sum(d_in + d_out for d_in, d_out in [*column, *row])


def slot_bytes_per_gpu(a: Architecture, rank: int, tp: int = 1) -> int:
    """One slot's bytes on one of ``tp`` tensor-parallel GPUs."""
    column, row = _matrices(a)
    tp = max(tp, 1)
    per_layer = sum(d_in + math.ceil(d_out / tp) for d_in, d_out in column) + \
        sum(math.ceil(d_in / tp) + d_out for d_in, d_out in row)
    return DTYPE_BYTES * rank * a.num_layers * per_layer


def lora_memory(a: Architecture, slots: int, max_rank: int, cpu_slots: int,
                tp: int = 1) -> LoraMemory:
    return LoraMemory(slots=slots, max_rank=max_rank, cpu_slots=cpu_slots,
                      bytes_per_gpu=slots * slot_bytes_per_gpu(a, max_rank, tp),
                      host_bytes=cpu_slots * DTYPE_BYTES * adapter_params(a, max_rank))
