"""The planner's one entry point, ``plan_model``, and the structs it speaks.

The same ``PlanRequest`` is built by ``llmgw ctl model plan`` and decoded by
``POST /api/v1/plan``, and both answer with the same ``PlanResult``. The
request carries the model's raw ``config.json`` and its parameter count, not
a derived Architecture: the config is read on the machine that can reach the
model (a local directory, or the Hub with the operator's token), while the
reasoning about it happens here, in one place, whichever side runs it. A
wire format of derived numbers would have to be versioned with every
architecture the planner learns; the config already is the model's own
format.

The parameter count cross-checks the shapes read from config.json. A
checkpoint that holds more (a vision tower, multi-token-prediction layers) is
charged the difference at 16 bits on vLLM, which loads vision towers; GGUF
files hold the text model only. ``--params`` is taken as the authority when
given. A pre-quantised checkpoint (AWQ, MXFP4) stores packed integers whose
element count is not a parameter count, so its shapes come from config.json.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal

import msgspec

from llmgw.errors import DefinitionError
from llmgw.planner.arch import Architecture, architecture_from_config
from llmgw.planner.candidates import (
    Candidate,
    PoolSpec,
    engine_quants,
    evaluate,
    gpu_counts,
    group_problem,
)
from llmgw.planner.lora import LoraMemory, lora_memory
from llmgw.planner.memory import (
    ENGINES,
    GpuLoad,
    capped_layers,
    gpu_loads,
    host_weights,
    kv_bytes,
)
from llmgw.planner.quant import QUANTIZATIONS, container, weights_by_tensor
from llmgw.planner.tensors import Tensor, inventory

KvDtype = Literal["fp16", "bf16", "fp8", "q8_0"]
EngineName = Literal["vllm", "llama.cpp", "llama-cpp-python"]
# safetensors dtypes that pack several weights into one element
PACKED_DTYPES = frozenset({"I32", "U32", "U8", "I4", "U4"})

__all__ = ["Candidate", "HostNeed", "PlanOptions", "PlanRequest", "PlanResult", "PoolSpec",
           "host_breakdown", "host_need", "plan_model"]


class PlanOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``usable_fraction`` None: the engine's own default (vLLM's 0.9)."""

    kv_dtype: KvDtype = "fp16"
    usable_fraction: float | None = None
    engine: EngineName | None = None
    min_context: int = 2048
    quantizations: list[str] = []
    # A base serving LoRA adapters (``llmgw.planner.lora``): slots on each GPU, their rank
    # bound, and the host cache (None: four times the slots). 0 slots: no adapters.
    lora_slots: int = 0
    lora_rank: int = 16
    lora_cpu_slots: int | None = None


class ParameterCount(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The checkpoint's element count (by safetensors dtype when known) and where it came from."""

    total: int
    source: str
    by_dtype: dict[str, int] = {}


class PlanRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What to plan: a model's config.json and parameter count; pools None = the live fleet."""

    model: str
    config: dict[str, Any]
    parameters: ParameterCount | None = None
    pools: list[PoolSpec] | None = None
    # A factory, not a shared default: the default holds a list, so it is unhashable.
    options: PlanOptions = msgspec.field(default_factory=PlanOptions)


class ArchitectureSummary(msgspec.Struct, frozen=True, kw_only=True):
    model_type: str
    layers: int
    hidden_size: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    sliding_window: int | None
    sliding_layers: int
    experts: int
    experts_per_token: int
    kv_lora_rank: int
    tie_embeddings: bool
    max_position_embeddings: int
    checkpoint_format: str


class PlanResult(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    architecture: ArchitectureSummary
    parameters: int
    parameters_in_config: int
    notes: list[str]
    candidates: list[Candidate]


def _summary(a: Architecture) -> ArchitectureSummary:
    return ArchitectureSummary(
        model_type=a.model_type, layers=a.num_layers, hidden_size=a.hidden_size,
        attention_heads=a.num_heads, kv_heads=1 if a.is_mla else a.num_kv_heads,
        head_dim=a.head_dim, sliding_window=a.sliding_window, sliding_layers=a.sliding_layers,
        experts=a.num_experts, experts_per_token=a.experts_per_token,
        kv_lora_rank=a.kv_lora_rank, tie_embeddings=a.tie_embeddings,
        max_position_embeddings=a.max_position_embeddings,
        checkpoint_format=a.checkpoint_format)


def _validate(o: PlanOptions) -> None:
    if o.usable_fraction is not None and not 0 < o.usable_fraction <= 1:
        raise DefinitionError(
            f"usable_fraction must be more than 0 and at most 1, got {o.usable_fraction}",
            field="usable_fraction")
    if o.min_context < 1:
        raise DefinitionError(f"min_context must be at least 1, got {o.min_context}",
                              field="min_context")
    unknown = [q for q in o.quantizations if q not in QUANTIZATIONS]
    if unknown:
        raise DefinitionError(
            f"unknown quantisation {', '.join(unknown)}; the planner knows "
            f"{', '.join(QUANTIZATIONS)}", field="quantizations")
    if o.engine is not None and o.kv_dtype not in ENGINES[o.engine].kv_dtypes:
        raise DefinitionError(
            f"{o.engine} has no {o.kv_dtype} KV cache; it offers "
            f"{', '.join(ENGINES[o.engine].kv_dtypes)}", field="kv_dtype")


def reconcile(n_config: int, count: ParameterCount | None) -> tuple[float, int, list[str]]:
    """(scale for config-derived weights, surplus parameters, notes)."""
    if count is None:
        return 1.0, 0, ["no parameter count was given; weights come from config.json's "
                        "shapes alone"]
    if count.total <= 0:
        raise DefinitionError(f"the parameter count must be positive, got {count.total}",
                              field="params")
    packed = sorted(d for d in count.by_dtype if d.upper() in PACKED_DTYPES)
    if packed and count.source != "--params":
        return 1.0, 0, [f"the checkpoint stores weights packed ({', '.join(packed)}), so its "
                        f"element count ({count.total:,}) is not a parameter count; the "
                        f"shapes in config.json ({n_config:,} parameters) are used"]
    ratio = count.total / n_config
    if abs(ratio - 1) <= 0.005:
        return 1.0, 0, []
    if ratio > 1:
        extra = count.total - n_config
        return 1.0, extra, [
            f"the checkpoint holds {extra:,} parameters beyond the text model config.json "
            f"describes ({n_config:,}), such as a vision tower or multi-token-prediction "
            "layers; vLLM candidates charge them at 16 bits, GGUF files leave them out"]
    if count.source == "--params":
        return ratio, 0, [f"--params {count.total:,} is {100 * (1 - ratio):.1f}% below the "
                          f"{n_config:,} parameters config.json describes; weights are scaled "
                          "to it"]
    return 1.0, 0, [f"config.json describes {n_config:,} parameters but the checkpoint "
                    f"holds {count.total:,}; planning with config.json's shapes"]


def _window_note(a: Architecture, engines: set[str]) -> str | None:
    if a.sliding_window is None or not a.sliding_layers:
        return None
    parts = []
    for name in sorted(engines):
        e = ENGINES[name]
        if any(capped_layers(a, e)):
            parts.append(f"{name} caps those layers' cache at the window")
        elif e.split == "layer" and e.swa_full:
            parts.append(f"{name} allocates them full-size (swa_full)")
        else:
            parts.append(f"{name} runs them as full attention")
    return (f"sliding window of {a.sliding_window} tokens on {a.sliding_layers} of "
            f"{a.num_layers} layers: " + "; ".join(parts))


_RANK = {q: i for i, q in enumerate(QUANTIZATIONS)}


def _order(c: Candidate) -> tuple[Any, ...]:
    return (not c.fits, c.gpus, _RANK[c.quantization], c.engine, c.pool)


def plan_model(request: PlanRequest, pools: list[PoolSpec], *,
               notes: list[str] | None = None) -> PlanResult:
    """Every candidate for ``request``'s model on ``pools``, fitting ones first."""
    o = request.options
    _validate(o)
    a = architecture_from_config(request.config, source=f"{request.model}: config.json")
    inv = inventory(a)
    n_config = sum(t.params for t in inv)
    scale, surplus, out_notes = reconcile(n_config, request.parameters)
    out_notes = [*(notes or []), *out_notes]
    pairs = engine_quants(a, o.engine)
    if o.quantizations:
        pairs = [p for p in pairs if p[1] in o.quantizations]
    dropped = sorted({e for e, _ in pairs if o.kv_dtype not in ENGINES[e].kv_dtypes})
    if dropped:
        out_notes.append(f"{', '.join(dropped)} has no {o.kv_dtype} KV cache; its candidates "
                         "are left out")
        pairs = [p for p in pairs if p[0] not in dropped]
    if a.checkpoint_format != "bf16":
        out_notes.append(
            f"this checkpoint is stored as {a.checkpoint_format}: vLLM serves that format from "
            "it; the other quantisations listed need a checkpoint made in them")
    window = _window_note(a, {e for e, _ in pairs})
    if window:
        out_notes.append(window)
    if not pools:
        out_notes.append("no pools to plan on: the fleet has none, or give --pool")
    cpu_pools = [p.name for p in pools if p.gpus_per_node == 0]
    if cpu_pools and any(ENGINES[e].split == "tensor" for e, _ in pairs):
        # One note rather than a non-fitting row per quantisation: vLLM needs an
        # NVIDIA GPU (the local scheduler refuses it on a machine without one), so
        # those rows could never fit and would bury the llama.cpp ones.
        out_notes.append(f"{', '.join(cpu_pools)} {'has' if len(cpu_pools) == 1 else 'have'} "
                         "no GPU: vLLM needs one, so only llama.cpp candidates are listed there")
    candidates = _candidates(a, inv, pools, pairs, o, scale, surplus)
    candidates.sort(key=_order)
    total = request.parameters.total if request.parameters else n_config
    return PlanResult(model=request.model, architecture=_summary(a), parameters=total,
                      parameters_in_config=n_config, notes=out_notes, candidates=candidates)


def _candidates(a: Architecture, inv: list[Tensor], pools: list[PoolSpec],
                pairs: list[tuple[str, str]], o: PlanOptions, scale: float, surplus: int,
                ) -> list[Candidate]:
    """Every (pool, engine, quantisation, GPU count). The arithmetic depends only on the
    card size, so pools of the same card share it; a 1,000-node fleet costs little more
    than its distinct card sizes."""
    sizes: dict[tuple[str, str], list[int]] = {}
    results: dict[tuple[str, str, int, int], dict[str, Any]] = {}
    counts: dict[tuple[str, int], list[int]] = {}
    out: list[Candidate] = []
    for pool in pools:
        card = pool.gpu_memory if pool.gpus_per_node else pool.memory
        if not card:
            continue
        for engine_name, quant in pairs:
            engine = ENGINES[engine_name]
            if (engine_name, pool.gpus_per_node) not in counts:
                counts[(engine_name, pool.gpus_per_node)] = gpu_counts(a, engine, pool)
            for gpus in counts[(engine_name, pool.gpus_per_node)]:
                key = (engine_name, quant, gpus, card)
                if key not in results:
                    fmt = container(quant, gguf_engine=engine.split == "layer")
                    if (fmt, quant) not in sizes:
                        sizes[(fmt, quant)] = weights_by_tensor(inv, quant, a, fmt)
                    loads, host = _replica(a, inv, sizes[(fmt, quant)], engine_name, gpus,
                                           o.kv_dtype, card, scale,
                                           surplus if fmt != "gguf" else 0)
                    lora = _lora(a, o, engine_name, gpus)
                    if lora is not None:
                        # Reserved by vLLM at start like its activations: before any KV.
                        loads = [dataclasses.replace(ld, overhead=ld.overhead + lora.bytes_per_gpu)
                                 for ld in loads]
                    fraction = o.usable_fraction or engine.default_usable_fraction
                    results[key] = evaluate(a, loads, host, engine, quant, gpus, card,
                                            fraction, o.min_context,
                                            group_problem(a, quant, gpus))
                    if lora is not None:
                        results[key].update(lora_bytes_per_gpu=lora.bytes_per_gpu,
                                            lora_host_bytes=lora.host_bytes)
                free = (None if pool.free_gpus_per_node is None
                        else pool.free_gpus_per_node >= gpus)
                out.append(Candidate(**results[key], pool=pool.name, gpu_class=pool.gpu_class,
                                     fabric=pool.fabric, free_now=free))
    return out


def _lora(a: Architecture, o: PlanOptions, engine: str, gpus: int) -> LoraMemory | None:
    """The adapter reservation of a vLLM candidate on ``gpus``, when the plan asks for one
    (llama.cpp serves no adapters here: ``llmgw.catalog.adapter``)."""
    if o.lora_slots <= 0 or ENGINES[engine].split != "tensor" or gpus == 0:
        return None
    cpu = o.lora_cpu_slots if o.lora_cpu_slots is not None else 4 * o.lora_slots
    return lora_memory(a, o.lora_slots, o.lora_rank, max(cpu, o.lora_slots), gpus)


def _replica(a: Architecture, inv: list[Tensor], sizes: list[int], engine: str, gpus: int,
             kv_dtype: str, card: int, scale: float, surplus: int,
             ) -> tuple[list[GpuLoad], int]:
    """The loads of a replica's GPUs (its node's, on a CPU) and its weight bytes on the host,
    scaled to the parameter count."""
    e = ENGINES[engine]
    loads = gpu_loads(a, inv, sizes, e, gpus, kv_dtype, card)
    host = host_weights(a, inv, sizes, e, gpus)
    if scale == 1.0 and not surplus:
        return loads, host
    extra = math.ceil(surplus * 2 / max(gpus, 1))
    return ([dataclasses.replace(ld, weights=math.ceil(ld.weights * scale) + extra)
             for ld in loads],
            math.ceil(host * scale))


class HostNeed(msgspec.Struct, frozen=True, kw_only=True):
    """One replica's host memory, by what holds it (bytes).

    ``weights``: what the engine keeps of the weights in host memory (all of
    them on a CPU); ``kv_cache`` and ``runtime`` (activations and logits) are
    counted only for a CPU replica, whose every byte is in host memory.
    """

    weights: int
    kv_cache: int = 0
    runtime: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.runtime


def host_breakdown(config: dict[str, Any], *, engine: EngineName, quantization: str,
                   gpus: int, context: int, parameters: ParameterCount | None = None,
                   kv_dtype: KvDtype = "fp16", model: str = "model") -> HostNeed:
    """Bytes of host memory one replica needs, by part: what a memory reservation must cover.

    ``config`` and ``parameters`` are what ``plan_model`` reads (a PlanRequest's,
    or ``resolve_model``'s ModelInput). On GPUs that is the weights the engine
    keeps on the host (a candidate's ``host_bytes``: llama.cpp's input
    embedding, nothing for vLLM); a CPU replica (``gpus`` 0) holds everything
    there, so it is its weights, the runtime's overhead and the KV cache of
    ``context`` tokens. No usable fraction is applied: this is the need itself.
    The process's own code and libraries are not counted.
    """
    a = architecture_from_config(config, source=f"{model}: config.json")
    if gpus < 0:
        raise DefinitionError(f"gpus must be 0 (a CPU replica) or more, got {gpus}",
                              field="gpus")
    if context < 1:
        raise DefinitionError(f"context must be at least 1 token, got {context}",
                              field="context")
    e = ENGINES[engine]
    if gpus == 0 and e.split == "tensor":
        raise DefinitionError(
            f"{engine} needs a GPU; give gpus of 1 or more, or plan a CPU replica on "
            "llama.cpp", field="gpus")
    offered = [q for name, q in engine_quants(a, engine) if name == engine]
    if quantization not in offered:
        raise DefinitionError(
            f"{engine} cannot serve {a.model_type} as {quantization!r}; it offers "
            f"{', '.join(offered)}", field="quantization")
    if kv_dtype not in e.kv_dtypes:
        raise DefinitionError(f"{engine} has no {kv_dtype} KV cache; it offers "
                              f"{', '.join(e.kv_dtypes)}", field="kv_dtype")
    inv = inventory(a)
    scale, surplus, _ = reconcile(sum(t.params for t in inv), parameters)
    fmt = container(quantization, gguf_engine=e.split == "layer")
    sizes = weights_by_tensor(inv, quantization, a, fmt)
    # The card size only sizes vLLM's batch, and vLLM keeps nothing on the host.
    loads, host = _replica(a, inv, sizes, engine, gpus, kv_dtype, 0, scale,
                           surplus if fmt != "gguf" else 0)
    if gpus:
        return HostNeed(weights=host)
    (node,) = loads
    return HostNeed(weights=host, kv_cache=kv_bytes(node, a, e, context, 0),
                    runtime=node.overhead)


def host_need(config: dict[str, Any], *, engine: EngineName, quantization: str, gpus: int,
              context: int, parameters: ParameterCount | None = None,
              kv_dtype: KvDtype = "fp16", model: str = "model") -> int:
    """``host_breakdown``'s total: bytes of host memory one replica needs."""
    return host_breakdown(config, engine=engine, quantization=quantization, gpus=gpus,
                          context=context, parameters=parameters, kv_dtype=kv_dtype,
                          model=model).total
