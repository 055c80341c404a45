"""LoRA adapters: catalog entries of their own kind, each a fine-tune served on a base model.

An adapter is not a model. It has no profile, no replicas and no job: it is a
few hundred megabytes of low-rank deltas that a running replica of its
``base`` loads into one of its adapter *slots* when a request names it
(``llmgw.gateway.adapters``). So adding, removing or editing an adapter never
changes a base's fingerprint and never restarts its replicas; what does is
the base's ``lora`` block — how many slots, of what rank, and how many more
adapters the engine keeps in host memory — because that is fixed when the
engine starts (vLLM's ``--max-loras``, ``--max-lora-rank``,
``--max-cpu-loras``, llmgw.scheduler.local.engines). A base serves adapters
only when it has that block: enabling LoRA costs every replica memory and
some speed (vLLM reserves the slots' weights up front), so it is never
turned on behind an operator's back by the first adapter added.

Names share one space with models: a client puts either in ``model``, so an
adapter may not be called like a model, and configuration wins a conflict
between a declared and a runtime adapter as it does for models
(``llmgw.modelsvc``). A base may not be removed while adapters name it.

What each engine can do with an adapter (README "Adapters"):

* vLLM loads and unloads adapters at run time through ``/v1/load_lora_adapter``
  and ``/v1/unload_lora_adapter`` when started with ``--enable-lora`` and the
  environment switch ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``
  (vllm/entrypoints/openai/api_server.py; docs "LoRA Adapters", "Dynamically
  serving LoRA Adapters"), and a request picks its adapter by ``model``.
* llama.cpp's server (llama-server, on Nomad) loads the adapters it is given
  at start (``--lora FILE``, ``--lora-scaled FILE SCALE``); ``/lora-adapters``
  only changes their scales, and a request's ``lora`` field (a list of
  ``{id, scale}``) sets the scales for that request (tools/server/README.md).
  It cannot load an adapter while it runs: serving one would restart every
  replica of the base at each adapter change, against the rule above.
* llama-cpp-python's server (the embedded mode's llama.cpp) takes one
  ``lora_path`` per model entry at start (its ``ModelSettings``) and selects
  none per request; each adapter would be another copy of the base.

So a llama.cpp base is refused (``check_adapters``), saying why; serve the
base with vLLM to serve its fine-tunes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated

import msgspec

from llmgw.catalog.model import Lora, Model, ModelName, Profile, _Spec
from llmgw.catalog.names import check_name
from llmgw.catalog.source import HfSource, PathSource, PkgSource, Source, UrlSource
from llmgw.errors import DefinitionError

# vLLM's own defaults where a base's ``lora`` block leaves a size out
# (vllm/config/lora.py: max_lora_rank 16, max_loras 1; max_cpu_loras defaults to
# max_loras). llmgw asks for four slots rather than vLLM's one: with one slot
# two adapters alternating on a replica reload on every request. The CPU cache
# holds four times the slots: an adapter evicted from a slot comes back from
# host memory in milliseconds instead of from disk, and at rank 16 on an 8B
# base an adapter is 80 MiB of host memory (``llmgw.planner.lora``).
DEFAULT_SLOTS = 4
DEFAULT_MAX_RANK = 16
CPU_SLOTS_PER_SLOT = 4
# The ranks vLLM accepts for --max-lora-rank (vllm/config/lora.py, MaxLoRARanks).
VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


class Adapter(_Spec, frozen=True):
    """A LoRA fine-tune clients ask for by ``name``, served on replicas of ``base``.

    ``source`` is where its weights are (a directory holding
    ``adapter_config.json`` and the weights), in the forms a model's source
    takes. ``rank``: its LoRA rank, as in ``adapter_config.json`` (``r``);
    checked against the base's ``lora.max_rank``. ``pinned``: kept loaded on
    every replica of the base, never evicted.
    """

    name: ModelName
    base: ModelName
    source: Source
    rank: Annotated[int, msgspec.Meta(ge=1)] | None = None
    pinned: bool = False
    description: str = ""


class LoraSizes(msgspec.Struct, frozen=True, kw_only=True):
    """A base's adapter capacity with one profile, defaults applied (what the engine gets)."""

    slots: int
    max_rank: int
    cpu_slots: int


def lora_of(model: Model, profile: Profile | None = None) -> Lora | None:
    """The ``lora`` block in force for ``profile`` of ``model`` (the profile's wins)."""
    if profile is not None and profile.lora is not None:
        return profile.lora
    return model.lora


def lora_sizes(model: Model, profile: Profile | None = None) -> LoraSizes | None:
    """The slots, rank bound and CPU cache ``profile`` of ``model`` runs with, or None
    when it serves no adapters."""
    lora = lora_of(model, profile)
    if lora is None:
        return None
    slots = lora.slots if lora.slots is not None else DEFAULT_SLOTS
    cpu = lora.cpu_slots if lora.cpu_slots is not None else slots * CPU_SLOTS_PER_SLOT
    return LoraSizes(slots=slots, max_rank=lora.max_rank or DEFAULT_MAX_RANK,
                     cpu_slots=max(cpu, slots))


def check_lora(lora: Lora, where: str) -> None:
    """Refuse a ``lora`` block vLLM would refuse at start."""
    if lora.slots is not None and lora.slots < 1:
        raise DefinitionError(f"{where}.slots: give 1 or more adapter slots",
                              field=f"{where}.slots")
    if lora.max_rank is not None and lora.max_rank not in VLLM_RANKS:
        raise DefinitionError(
            f"{where}.max_rank: {lora.max_rank} is not a rank vLLM accepts "
            f"({', '.join(map(str, VLLM_RANKS))})", field=f"{where}.max_rank")
    if lora.cpu_slots is not None and lora.slots is not None and lora.cpu_slots < lora.slots:
        raise DefinitionError(
            f"{where}.cpu_slots: {lora.cpu_slots} is fewer than slots ({lora.slots}); vLLM "
            "keeps every loaded adapter in its CPU cache too", field=f"{where}.cpu_slots")


def _refuse_base(adapter: Adapter, models: Mapping[str, Model], scheduler: str) -> Model:
    base = models.get(adapter.base)
    if base is None:
        known = ", ".join(sorted(models)) or "none"
        raise DefinitionError(f"base: there is no model {adapter.base!r} (models: {known})",
                              field="base")
    if base.external:
        raise DefinitionError(
            f"base: model {base.name!r} is external (upstream): llmgw cannot load adapters "
            "into a server it does not run; declare the adapter on that server and add it "
            "as a model of its own", field="base")
    if base.engine == "llama.cpp":
        server = ("the embedded llama.cpp server (llama-cpp-python) takes one adapter per "
                  "model at start and selects none per request" if scheduler == "local" else
                  "llama-server loads adapters only at start (--lora), so every adapter "
                  "change would restart the base's replicas")
        raise DefinitionError(
            f"base: model {base.name!r} runs on llama.cpp, and {server}; serve the base "
            "with vLLM to serve adapters", field="base")
    if base.lora is None and not any(p.lora is not None for p in base.profiles):
        raise DefinitionError(
            f"base: model {base.name!r} serves no adapters: add a `lora:` block to it "
            "(e.g. `lora: {slots: 4, max_rank: 16}`; its replicas restart once, with LoRA "
            "enabled)", field="base")
    return base


def _refuse_rank(adapter: Adapter, base: Model) -> None:
    if adapter.rank is None:
        return
    for p in base.profiles:
        sizes = lora_sizes(base, p)
        if sizes is not None and adapter.rank > sizes.max_rank:
            raise DefinitionError(
                f"rank: {adapter.rank} exceeds the maximum rank of base {base.name!r} "
                f"with profile {p.name!r} ({sizes.max_rank}, lora.max_rank); raise it there "
                "or use an adapter of lower rank", field="rank")


def _refuse_source(adapter: Adapter, base: Model, scheduler: str, mirror: str | None) -> None:
    """The checks ``llmgw.catalog.build`` makes of a model's source, for an adapter.

    A replica loads an adapter from its node's disk, never from the Hub, so a
    Hub adapter reaches a Nomad node only through the mirror.
    """
    src = adapter.source
    if scheduler == "nomad":
        if isinstance(src, PathSource | PkgSource):
            raise DefinitionError(
                f"source: {src.shown!r} is on this machine, which a Nomad node cannot read; "
                "put the adapter on the mirror with `llmgw mirror add` and use its URL",
                field="source")
        if isinstance(src, HfSource) and not mirror:
            raise DefinitionError(
                f"source: {src.shown!r} would be downloaded from the Hub by each replica; set "
                "mirror in server.yaml and add it with `llmgw mirror add`", field="source")
    if scheduler == "local" and isinstance(src, HfSource | UrlSource):
        raise DefinitionError(
            f"source: {src.shown!r} is remote, and the embedded scheduler's engines read "
            "adapters from this machine's disk; download it (adapter_config.json and its "
            "weights) and give the directory's path", field="source")
    if isinstance(src, PkgSource):
        raise DefinitionError(
            f"source: {src.shown!r}: an adapter is a directory (adapter_config.json and its "
            "weights), not a packaged model file; give its path or URL", field="source")
    if base.engine == "vllm" and isinstance(src, UrlSource) and not src.is_directory:
        raise DefinitionError(
            f"source: {src.shown!r} names one file; vLLM loads an adapter from a directory "
            "holding adapter_config.json, so end the URL with '/'", field="source")


def check_adapters(adapters: Iterable[Adapter], models: Mapping[str, Model], *,
                   scheduler: str = "local", mirror: str | None = None) -> dict[str, Adapter]:
    """Validate ``adapters`` against the models they are served on; DefinitionError naming
    the adapter and the field of the first problem."""
    def check_one(a: Adapter) -> None:
        check_name(a.name, "adapter name")
        if a.name in models:
            raise DefinitionError(
                f"name: {a.name!r} is a model's name; clients put either in `model`, so "
                "an adapter needs a name of its own", field="name")
        base = _refuse_base(a, models, scheduler)
        _refuse_rank(a, base)
        _refuse_source(a, base, scheduler, mirror)

    out: dict[str, Adapter] = {}
    for a in adapters:
        try:
            check_one(a)
        except DefinitionError as exc:
            raise DefinitionError(f"adapter {a.name!r}: {exc.message}", field=exc.field) \
                from None
        if a.name in out:
            raise DefinitionError(f"adapter {a.name!r} is defined twice", field="name")
        out[a.name] = a
    return out


def adapters_of(adapters: Mapping[str, Adapter], base: str) -> list[Adapter]:
    """The adapters served on ``base``, by name."""
    return sorted((a for a in adapters.values() if a.base == base), key=lambda a: a.name)


def decode_adapter_file(data: bytes | str, *, source: str) -> Adapter:
    """A ``ctl adapter add -f`` file: one adapter, the shape of an ``adapters:`` item."""
    from llmgw.catalog.decode import decode_yaml

    return decode_yaml(data, Adapter, source=source)


# The switch vLLM's API server reads before it mounts /v1/load_lora_adapter and
# /v1/unload_lora_adapter (vllm/envs.py, VLLM_ALLOW_RUNTIME_LORA_UPDATING; the
# routes are added in vllm/entrypoints/openai/api_server.py only when it is set).
RUNTIME_LORA_ENV = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}


def vllm_lora_launch(model: Model, profile: Profile) -> tuple[list[str], dict[str, str]]:
    """The vLLM flags and environment a replica of ``profile`` serves adapters with
    (none when the model has no ``lora`` block). Both schedulers use this one list."""
    sizes = lora_sizes(model, profile)
    if sizes is None:
        return [], {}
    return (["--enable-lora", "--max-loras", str(sizes.slots),
             "--max-lora-rank", str(sizes.max_rank),
             "--max-cpu-loras", str(sizes.cpu_slots)], dict(RUNTIME_LORA_ENV))
