"""Pools of identical hardware, and every way to run the model on each.

A replica never spans two nodes, and never two fabrics: eight free cards
split across two fabrics are not eight cards for a model that needs eight,
and merging them would plan something that starts, passes its health checks
and hangs on its first all-reduce. So hardware is grouped by (gpu class,
fabric), and a candidate's GPU count is bounded by the largest node of its
pool.

Every candidate is listed, not one answer: with cards to spare you want the
full-precision fit; with one card free you want to know a quantised one
exists. Choosing between them is the operator's job. Fitting candidates come
first, fewest GPUs and highest precision leading; each non-fitting one says
why.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from llmgw.catalog.decode import decode_value
from llmgw.catalog.units import Size, format_size
from llmgw.errors import DefinitionError
from llmgw.planner.arch import Architecture
from llmgw.planner.memory import (
    EngineSpec,
    GpuLoad,
    max_context,
    window_bytes,
)
from llmgw.planner.quant import GGUF_QUANTS, QUANTIZATIONS
from llmgw.planner.tensors import VOCAB_PADDING
from llmgw.scheduler.base import Fleet


class PoolSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Identical machines on one fabric. ``gpus_per_node`` is the largest node's count.

    A CPU pool has ``gpus_per_node`` 0 and ``memory`` (host bytes of its
    largest node) instead of ``gpu_memory``. ``free_gpus_per_node`` is the
    most GPUs free on one node now; None for hardware that is not there yet.
    """

    name: str
    gpus_per_node: int
    gpu_memory: int | None = None
    memory: int | None = None
    fabric: str | None = None
    gpu_class: str | None = None
    nodes: int = 1
    free_gpus_per_node: int | None = None


class Candidate(msgspec.Struct, frozen=True, kw_only=True):
    """One way to run the model: a quantisation on an engine over ``gpus`` of one node.

    Where the weights sit: ``weights_bytes_per_gpu`` on the most loaded GPU,
    ``host_bytes`` in host memory, and ``weights_bytes_total`` everywhere the
    replica holds them, every GPU and the host summed. The total counts each
    copy in memory, so it exceeds the checkpoint where a copy is made:
    tensor-parallel ranks that replicate a tensor, and llama.cpp's output
    layer of a tied model, a second copy of the token embedding
    (memory.output_copy).

    A CPU candidate (``gpus`` 0) has no GPU: its weights are all
    ``host_bytes``, ``weights_bytes_per_gpu`` is 0, and ``memory_per_gpu``
    and ``overhead_bytes_per_gpu`` are the node's host memory and the
    runtime's overhead there.
    """

    quantization: str
    engine: str
    gpus: int
    pool: str
    gpu_class: str | None
    fabric: str | None
    memory_per_gpu: int
    weights_bytes_per_gpu: int
    weights_bytes_total: int
    host_bytes: int
    overhead_bytes_per_gpu: int
    kv_bytes_per_token: int
    kv_window_bytes: int
    max_context: int
    fits: bool
    reason: str | None
    free_now: bool | None
    # A base serving adapters: its slots' reservation on each GPU (counted in the
    # overhead above) and its host cache of whole adapters.
    lora_bytes_per_gpu: int = 0
    lora_host_bytes: int = 0


_POOL_RE = re.compile(r"^(?P<name>[A-Za-z0-9][\w.-]*)=(?P<count>-?\d+)[xX](?P<mem>[^@]+)"
                      r"(?:@(?P<fabric>[\w.:-]+))?$")


def parse_pool(text: str) -> PoolSpec:
    """``NAME=COUNTxMEMORY[@FABRIC]``: COUNT cards of MEMORY each on one node.

    COUNT 0 is a CPU node with MEMORY of host memory, the PoolSpec the fleet
    path builds for a pool of CPU nodes.
    """
    match = _POOL_RE.match(text.strip())
    if match is None:
        raise DefinitionError(
            f"--pool {text!r} is not NAME=COUNTxMEMORY[@FABRIC]; write e.g. h100=8x80GB@ib-a "
            "(8 cards of 80 GB on one node, on fabric ib-a) or cpu=0x256GB (a node with no "
            "GPU and 256 GB of memory)", field="pool")
    count = int(match["count"])
    if count < 0:
        raise DefinitionError(
            f"--pool {text!r}: the GPU count must be at least 0 (0 for a CPU node), got "
            f"{count}", field="pool")
    what = "the memory per GPU" if count else "the host memory of a CPU node"
    try:
        memory = int(decode_value(match["mem"].strip(), Size, source=f"--pool {text!r}"))
    except DefinitionError as exc:
        raise DefinitionError(exc.message, field="pool") from None
    if memory <= 0:
        raise DefinitionError(f"--pool {text!r}: {what} must be more than 0", field="pool")
    if count == 0:
        return PoolSpec(name=match["name"], gpus_per_node=0, memory=memory,
                        fabric=match["fabric"], gpu_class=None)
    return PoolSpec(name=match["name"], gpus_per_node=count, gpu_memory=memory,
                    fabric=match["fabric"], gpu_class=match["name"])


def pools_from_fleet(fleet: Fleet) -> tuple[list[PoolSpec], list[str]]:
    """The fleet's pools as planner pools, and notes on pools that cannot be planned on."""
    by_name = {n.name: n for n in fleet.nodes}
    pools: list[PoolSpec] = []
    notes: list[str] = []
    for p in fleet.pools:
        nodes = [by_name[n] for n in p.nodes if n in by_name]
        usable = [n for n in nodes if n.schedulable and n.status == "ready"]
        if not usable:
            notes.append(f"pool {p.name} has no schedulable node; it is left out")
            continue
        gpus = max(n.gpus_total for n in usable)
        if gpus == 0:
            pools.append(PoolSpec(name=p.name, gpus_per_node=0,
                                  memory=max(n.memory_total for n in usable), fabric=p.fabric,
                                  gpu_class=None, nodes=len(usable), free_gpus_per_node=0))
            continue
        card = p.gpu_memory or max((n.gpu_memory or 0) for n in usable)
        if not card:
            notes.append(f"pool {p.name} reports no GPU memory; declare its gpu class "
                         "memory in server.yaml (gpu_classes) to plan on it")
            continue
        pools.append(PoolSpec(name=p.name, gpus_per_node=gpus, gpu_memory=card,
                              fabric=p.fabric, gpu_class=p.gpu_class, nodes=len(usable),
                              free_gpus_per_node=max(n.gpus_free for n in usable)))
    return pools, notes


def tp_problem(a: Architecture, tp: int) -> str | None:
    """Why vLLM refuses tensor-parallel size ``tp`` for this model, or None."""
    if a.num_heads % tp:
        return f"{a.num_heads} attention heads are not divisible by {tp}"
    if not a.is_mla:
        kv = a.num_kv_heads
        if (kv >= tp and kv % tp) or (kv < tp and tp % kv):
            return f"{kv} KV heads can be neither split nor replicated over {tp} GPUs"
    if (not a.is_moe or a.dense_layers) and a.intermediate_size % tp:
        return f"intermediate size {a.intermediate_size} is not divisible by {tp}"
    if a.is_moe and a.moe_intermediate_size % tp:
        return f"expert width {a.moe_intermediate_size} is not divisible by {tp}"
    padded = -(-a.vocab_size // VOCAB_PADDING) * VOCAB_PADDING
    if padded % tp:
        return f"the padded vocabulary ({padded}) is not divisible by {tp}"
    return None


def group_problem(a: Architecture, quant: str, tp: int) -> str | None:
    """AWQ/GPTQ need each rank's slice of a row-parallel input to be whole groups."""
    if quant not in ("awq", "gptq"):
        return None
    g = a.quant_group_size
    inputs = {"attention output": a.num_heads * a.v_head_dim}
    if not a.is_moe or a.dense_layers:
        inputs["down_proj"] = a.intermediate_size
    if a.is_moe:
        inputs["expert down_proj"] = a.moe_intermediate_size
    for what, width in inputs.items():
        if width % tp or (width // tp) % g:
            return (f"{quant} with group size {g}: the {what} input of {width} splits into "
                    f"{width // tp} per GPU at {tp} GPUs, not a whole number of groups")
    return None


def engine_quants(a: Architecture, engine: str | None) -> list[tuple[str, str]]:
    """(engine, quantisation) pairs to plan. None: each format on the engine that serves it."""
    vllm = ["bf16", "fp8", "int8", "awq", "gptq"]
    gguf = list(GGUF_QUANTS)
    if a.checkpoint_format == "mxfp4":
        vllm.insert(1, "mxfp4")
    if a.is_moe:
        gguf.append("mxfp4")
    if engine is None:
        pairs = [("vllm", q) for q in vllm] + [("llama.cpp", q) for q in gguf]
    elif engine == "vllm":
        pairs = [("vllm", q) for q in vllm + list(GGUF_QUANTS)]
    else:
        pairs = [(engine, q) for q in ["bf16", *gguf]]
    order = list(QUANTIZATIONS)
    return sorted(pairs, key=lambda p: (order.index(p[1]), p[0]))


def gpu_counts(a: Architecture, engine: EngineSpec, pool: PoolSpec) -> list[int]:
    """GPU counts worth listing on ``pool``; 0 alone for a CPU pool (llama.cpp only)."""
    if pool.gpus_per_node == 0:
        return [0] if engine.split == "layer" else []
    top = pool.gpus_per_node
    if engine.split == "tensor":
        return [tp for tp in range(1, top + 1) if tp_problem(a, tp) is None]
    counts = {c for c in (1, 2, 4, 8, 16) if c <= top} | {top}
    return sorted(c for c in counts if c <= a.num_layers)


def evaluate(a: Architecture, loads: list[GpuLoad], host: int, engine: EngineSpec,
             quant: str, gpus: int, card: int, fraction: float, min_context: int,
             problem: str | None) -> dict[str, Any]:
    """Fit of one candidate on cards of ``card`` bytes: the numbers and the verdict.

    ``loads`` are the GPUs' (one for all vLLM ranks, which are alike; the
    node's own for a CPU replica) and ``host`` the weight bytes in host memory.
    """
    usable = int(card * fraction)
    worst = max(loads, key=lambda ld: ld.weights + ld.overhead)
    contexts = [max_context(ld, a, engine, usable - ld.weights - ld.overhead, card)
                for ld in loads]
    ctx = min(contexts)
    heaviest_kv = max(loads, key=lambda ld: ld.kv_per_token)
    reason: str | None = problem
    where = "per GPU" if gpus else "on the node"
    if reason is None and worst.weights + worst.overhead >= usable:
        reason = (f"weights {format_size(worst.weights)} + runtime overhead "
                  f"{format_size(worst.overhead)} {where} exceed the {format_size(usable)} "
                  f"usable ({fraction:.2f} of {format_size(card)})")
    elif reason is None and ctx < min_context:
        reason = (f"only {ctx} tokens of KV cache fit {where} after weights and overhead; "
                  f"at least {min_context} are needed")
    window = max(window_bytes(ld, a, engine, max(ctx, 1), card) for ld in loads)
    if gpus == 0:
        on_gpus = 0  # the one load is the host's, already counted in ``host``
    elif engine.split == "tensor":
        on_gpus = loads[0].weights * gpus
    else:
        on_gpus = sum(ld.weights for ld in loads)
    return {
        "quantization": quant,
        "engine": engine.name,
        "gpus": gpus,
        "memory_per_gpu": card,
        "weights_bytes_per_gpu": worst.weights if gpus else 0,
        "weights_bytes_total": on_gpus + host,
        "host_bytes": host,
        "overhead_bytes_per_gpu": worst.overhead,
        "kv_bytes_per_token": heaviest_kv.kv_per_token,
        "kv_window_bytes": window,
        "max_context": ctx,
        "fits": reason is None,
        "reason": reason,
    }
