"""Whether each profile's ``memory`` reservation covers what one replica needs.

A reservation below the need is not refused (the operator may know better,
and a model may be added before its weights are final), but it is said at
add time, with both numbers: a CPU replica of llama.cpp that is short of
memory is killed by the out-of-memory killer, or thrashes, the first time
its KV cache fills, and nothing in the engine's start-up says why. On GPUs
llama.cpp still keeps the input embedding in host memory. vLLM keeps
nothing there, so its profiles never warn.

``reservation_warnings`` is pure: the facts about the weights (``ModelFacts``,
read by ``inputs.read_facts``) and the model in, sentences out. It follows
the engine that will run the model: llama.cpp (llama-server) on Nomad, and
llama-cpp-python in the embedded mode, whose default keeps full-size caches
for sliding-window layers. The KV cache is counted at the engines' default
f16; ``engine_args`` that change it (a quantised cache, ``--swa-full``,
several parallel sequences) are not read.

Which quantisation a profile runs: a GGUF file's own mix, whatever the
profile says (llama.cpp loads the file as it is); for a checkpoint, the
profile's ``quantization`` (vLLM's ``--quantization``), else the format the
checkpoint is stored in. A profile the planner cannot size (a mix it has no
figures for, an engine that cannot run it) is skipped with the reason,
never guessed at.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec

from llmgw.catalog.model import Model, Profile
from llmgw.catalog.units import format_size
from llmgw.errors import DefinitionError
from llmgw.planner.arch import architecture_from_config
from llmgw.planner.plan import EngineName, HostNeed, ParameterCount, host_breakdown
from llmgw.planner.quant import QUANTIZATIONS

# vLLM's --quantization names for the formats the planner knows.
_VLLM_METHODS = {"awq_marlin": "awq", "gptq_marlin": "gptq", "experts_int8": "int8"}


class ModelFacts(msgspec.Struct, frozen=True, kw_only=True):
    """What the planner knows of a model's weights, and where it read it.

    ``config`` is a config.json (for a GGUF file, the one its header stands
    for). ``file_type`` is llama.cpp's name for a GGUF file's mix and None for
    a checkpoint; ``quantization`` the planner's name for that mix, None when
    it has no figures for it.
    """

    where: str
    config: dict[str, Any]
    parameters: ParameterCount | None = None
    gguf: bool = False
    file_type: str | None = None
    quantization: str | None = None


class ReservationCheck(msgspec.Struct, frozen=True, kw_only=True):
    """Sentences for the operator, and why any profile with memory was not checked."""

    warnings: list[str] = []
    skipped: list[str] = []


def engine_name(model: Model, *, embedded: bool) -> EngineName | None:
    """The engine the planner models for ``model``: llama.cpp runs as llama-server on Nomad
    and as llama-cpp-python in the embedded mode."""
    if model.engine == "vllm":
        return "vllm"
    if model.engine == "llama.cpp":
        return "llama-cpp-python" if embedded else "llama.cpp"
    return None


def profile_quantization(profile: Profile, facts: ModelFacts) -> str:
    """The planner's name for what ``profile`` runs; DefinitionError when it has none."""
    if facts.gguf:
        if facts.quantization is None:
            mix = facts.file_type or "not recorded in the file (no general.file_type)"
            raise DefinitionError(
                f"the GGUF file's mix is {mix}, which the planner has no figures for",
                field="quantization")
        return facts.quantization
    stated = profile.quantization
    if stated is None:
        fmt = architecture_from_config(facts.config, source=facts.where).checkpoint_format
        return fmt if fmt in QUANTIZATIONS else "bf16"
    lowered = stated.lower()
    name = _VLLM_METHODS.get(lowered) or next(
        (q for q in QUANTIZATIONS if q.lower() == lowered), None)
    if name is None:
        raise DefinitionError(
            f"quantization {stated!r} is not one the planner has figures for; it knows "
            f"{', '.join(QUANTIZATIONS)}", field="quantization")
    return name


def _up(n: int) -> str:
    """``format_size``, rounded up at its last digit: a figure to raise a reservation to."""
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    value, i = float(n), 0
    while value >= 1024 and i < len(units) - 1:
        value /= 1024
        i += 1
    if i == 0:
        return f"{n}B"
    return f"{math.ceil(value * 10) / 10:.1f}{units[i]}"


def _sentence(p: Profile, reserved: int, need: HostNeed, engine: EngineName) -> str:
    head = (f"profile {p.name} reserves {format_size(reserved)} but one replica needs "
            f"{format_size(need.total)} of host memory")
    if p.gpus:
        return (f"{head} (the input embedding, {format_size(need.weights)}, which {engine} "
                f"keeps in host memory even with every layer on the GPU); raise memory to at "
                f"least {_up(need.total)}")
    return (f"{head} (weights {format_size(need.weights)}, KV cache for {p.context} tokens "
            f"{format_size(need.kv_cache)}, runtime {format_size(need.runtime)}); raise memory "
            f"to at least {_up(need.total)}, or lower context")


def reservation_warnings(model: Model, facts: ModelFacts, *, embedded: bool,
                         ) -> ReservationCheck:
    """A warning for each profile whose ``memory`` is below one replica's host need."""
    engine = engine_name(model, embedded=embedded)
    checked = [p for p in model.profiles if p.memory is not None]
    if engine is None or not checked:
        return ReservationCheck()
    warnings: list[str] = []
    skipped: list[str] = []
    for p in checked:
        assert p.memory is not None
        try:
            quantization = profile_quantization(p, facts)
            need = host_breakdown(facts.config, engine=engine, quantization=quantization,
                                  gpus=p.gpus, context=p.context, parameters=facts.parameters,
                                  model=facts.where)
        except DefinitionError as exc:
            skipped.append(f"profile {p.name}: {exc.message}")
            continue
        if int(p.memory) < need.total:
            warnings.append(_sentence(p, int(p.memory), need, engine))
    return ReservationCheck(warnings=warnings, skipped=skipped)
