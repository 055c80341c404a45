"""Building the catalog in force: the whole set of models, validated together.

This is a pure function over typed values: no I/O, no clock. Every change to
the catalog (an add, a removal, a scale) builds the *whole* next catalog here
before anything is written, because the rules that matter span models — a
name is unique, a fallback names a model that exists — and a change that is
persisted and then refused on the next start would be a model that looks
added and never appears.

Building also applies defaults, so the catalog holds the models as they will
run (``scaling.max`` filled in), not as they were written.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import unquote, urlsplit

import msgspec

from llmgw.catalog.adapter import Adapter, check_adapters, check_lora
from llmgw.catalog.engines import SCHEDULED, Capability
from llmgw.catalog.fingerprint import fingerprint
from llmgw.catalog.model import GpuClass, Model, Profile, Scaling, UpstreamAuth
from llmgw.catalog.names import check_name
from llmgw.catalog.source import HfSource, PathSource, PkgSource, UrlSource
from llmgw.errors import DefinitionError
from llmgw.redact import MASK, redact_url


class Runtime(msgspec.Struct, frozen=True, kw_only=True):
    """What the catalog will run on, as far as a definition's validity depends on it.

    On Nomad a source must be something a node can fetch: a local path or an
    installed package names a file on the control plane's machine, which no
    node has, and a Hugging Face file reaches llama.cpp (or vLLM, which
    downloads whole repositories only) through the mirror alone. Those facts
    follow from the configuration, so such a model is refused when it is
    loaded or added. The embedded scheduler's refusal of remote sources is
    not made here: it is a fact about this machine, reported by the scheduler
    as "cannot run here", so one catalog file can be rehearsed on a laptop
    with its GPU models shown as such rather than refused.
    """

    scheduler: Literal["local", "nomad"] = "local"
    mirror: str | None = None


class Provenance(msgspec.Struct, frozen=True, kw_only=True):
    """Where a model in force was defined: declared in configuration, or added at run
    time through the API or the admin site, and by whom."""

    origin: Literal["declared", "runtime"] = "declared"
    added_by: str | None = None


DECLARED = Provenance()


@dataclass(frozen=True)
class Catalog:
    """The validated set of models in force, with defaults applied.

    ``provenance`` names the models added at run time; every other model was
    declared in configuration.
    """

    models: Mapping[str, Model]
    gpu_classes: Mapping[str, GpuClass] = field(default_factory=dict)
    provenance: Mapping[str, Provenance] = field(default_factory=dict)
    # LoRA adapters by name (``llmgw.catalog.adapter``), and which were added at run time.
    adapters: Mapping[str, Adapter] = field(default_factory=dict)
    adapter_provenance: Mapping[str, Provenance] = field(default_factory=dict)

    def get(self, name: str) -> Model | None:
        return self.models.get(name)

    def served(self, name: str) -> tuple[Model, Adapter | None] | None:
        """What a request's ``model`` names: a model, or an adapter and its base."""
        model = self.models.get(name)
        if model is not None:
            return model, None
        adapter = self.adapters.get(name)
        if adapter is None:
            return None
        base = self.models.get(adapter.base)
        return (base, adapter) if base is not None else None

    def adapters_of(self, base: str) -> list[Adapter]:
        return sorted((a for a in self.adapters.values() if a.base == base),
                      key=lambda a: a.name)

    def origin(self, name: str) -> Provenance:
        return self.provenance.get(name, DECLARED)

    def __iter__(self) -> Iterator[Model]:
        return iter(self.models.values())

    def __len__(self) -> int:
        return len(self.models)

    def __contains__(self, name: object) -> bool:
        return name in self.models

    def fallback_chain(self, model: Model) -> list[Model]:
        """``model``, then its fallbacks depth-first: each fallback followed at once by
        its own chain, every model at most once.

        A request is answered whenever some model reachable through fallbacks
        can answer it; the nearest alternatives are tried first (A's first
        fallback B, then B's fallbacks, before A's second fallback).
        """
        if not model.fallbacks:
            return [model]
        chain: list[Model] = []
        seen: set[str] = set()
        stack = [model]
        while stack:
            m = stack.pop()
            if m.name in seen:
                continue
            seen.add(m.name)
            chain.append(m)
            stack.extend(fb for name in reversed(m.fallbacks)
                         if (fb := self.models.get(name)) is not None and name not in seen)
        return chain

    def fingerprint(self, name: str, profile: str) -> str | None:
        model = self.models.get(name)
        p = model.profile(profile) if model else None
        return fingerprint(model, p) if model and p else None


def effective_scaling(s: Scaling) -> Scaling:
    """Scaling with ``max`` filled in: ``min``, or 1 for an on-demand model."""
    if s.max is not None:
        return s
    return msgspec.structs.replace(s, max=s.min if s.min > 0 else 1)


def _check_url(url: str, where: str) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise DefinitionError(f"{where}: {redact_url(url)!r} is not an http(s) URL",
                              field=where)
    if MASK in unquote(url):
        raise DefinitionError(
            f"{where}: {url!r} holds {MASK} where a credential was shown masked; write the "
            "URL without it and give the credential with upstream_auth (a header and the "
            "environment variable holding it)", field=where)


_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_HEADER_RE = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}$")   # an RFC 9110 token


def _check_auth(auth: UpstreamAuth) -> None:
    if not _ENV_RE.match(auth.env):
        raise DefinitionError(f"upstream_auth.env: {auth.env!r} is not an environment "
                              "variable name", field="upstream_auth.env")
    if not _HEADER_RE.match(auth.header) or auth.header.lower() in (
            "host", "content-length", "transfer-encoding", "connection"):
        raise DefinitionError(f"upstream_auth.header: {auth.header!r} cannot carry a "
                              "credential; use e.g. Authorization or X-Api-Key",
                              field="upstream_auth.header")
    if any(c in auth.prefix for c in "\r\n"):
        raise DefinitionError("upstream_auth.prefix: no line breaks",
                              field="upstream_auth.prefix")


def _check_source(m: Model, runtime: Runtime) -> None:
    """Refuse a source the scheduler in ``runtime`` can never use (see ``Runtime``)."""
    src = m.source
    if runtime.scheduler != "nomad" or src is None:
        return
    if isinstance(src, PathSource | PkgSource):
        what = "a local path" if isinstance(src, PathSource) else "an installed package"
        raise DefinitionError(
            f"source: {src.shown!r} is {what} on this machine, which a Nomad node cannot "
            "read; put the file on the mirror with `llmgw mirror add` and use its URL",
            field="source")
    if isinstance(src, HfSource) and not runtime.mirror:
        if m.engine != "vllm":
            raise DefinitionError(
                f"source: {src.shown!r} can only reach a llama.cpp replica through the "
                "mirror; set mirror in server.yaml and add the file with `llmgw mirror add`",
                field="source")
        if src.filename:
            raise DefinitionError(
                f"source: {src.shown!r} names one file, which vLLM cannot download by "
                "itself; set mirror in server.yaml and add it with `llmgw mirror add`",
                field="source")
    if isinstance(src, UrlSource) and src.is_directory and m.engine == "llama.cpp":
        raise DefinitionError(
            f"source: {src.shown!r} is a directory; llama.cpp loads one GGUF file, so name "
            "the file", field="source")


def _check_profile(
    p: Profile, where: str, gpu_classes: Mapping[str, GpuClass]
) -> None:
    if not p.name:
        raise DefinitionError(f"{where}.name: a profile needs a name", field=f"{where}.name")
    if p.gpus < 0:
        raise DefinitionError(
            f"{where}.gpus: {p.gpus} is negative; use 0 for a CPU profile", field=f"{where}.gpus"
        )
    if p.context < 1:
        raise DefinitionError(f"{where}.context: must be at least 1 token",
                              field=f"{where}.context")
    if p.cpu_cores is not None and p.cpu_cores < 1:
        raise DefinitionError(
            f"{where}.cpu_cores: {p.cpu_cores} is not a core count; omit it or give 1 or more",
            field=f"{where}.cpu_cores",
        )
    if p.memory is not None and p.memory <= 0:
        raise DefinitionError(f"{where}.memory: must be more than 0", field=f"{where}.memory")
    if p.gpus > 0:
        if p.gpu_nodes:
            raise DefinitionError(
                f"{where}.gpu_nodes: only a CPU profile (gpus: 0) chooses whether to use GPU "
                "nodes; a GPU profile runs on them by definition — remove gpu_nodes",
                field=f"{where}.gpu_nodes")
        if not p.gpu_class:
            raise DefinitionError(
                f"{where}.gpu_class: a profile with gpus: {p.gpus} must name a gpu class "
                f"(one of: {', '.join(sorted(gpu_classes)) or 'none defined in gpu_classes'})",
                field=f"{where}.gpu_class",
            )
        if p.gpu_class not in gpu_classes:
            known = (", ".join(sorted(gpu_classes))
                     or "none; add it under gpu_classes in server.yaml")
            raise DefinitionError(
                f"{where}.gpu_class: unknown gpu class {p.gpu_class!r} (known: {known})",
                field=f"{where}.gpu_class",
            )
    else:
        # A CPU replica is placed by its cores and memory like any other
        # resource; without them it would be placed anywhere and starve.
        missing = [k for k in ("memory", "cpu_cores") if getattr(p, k) is None]
        if missing:
            raise DefinitionError(
                f"{where}: a CPU profile (gpus: 0) must declare {' and '.join(missing)}; "
                "they are reserved on the node and cpu_cores becomes the engine's thread count",
                field=f"{where}.{missing[0]}",
            )
        if p.gpu_class is not None:
            raise DefinitionError(
                f"{where}.gpu_class: a CPU profile (gpus: 0) cannot name a gpu class; "
                "set gpus or remove gpu_class",
                field=f"{where}.gpu_class",
            )


# What no llama.cpp server can answer, and what the embedded one (llama-cpp-
# python 0.3, llama_cpp/server/app.py: /v1/chat/completions, /v1/completions,
# /v1/embeddings) cannot either; the C++ llama-server adds /v1/rerank,
# /v1/responses and /v1/audio/transcriptions (tools/server/server.cpp).
_NEVER_LLAMA_CPP: frozenset[str] = frozenset({"speech", "score"})
_EMBEDDED_LLAMA_CPP: frozenset[str] = frozenset({"chat", "completions", "embeddings"})


def default_capabilities(m: Model) -> list[Capability]:
    """What ``m`` serves when its entry names no ``capabilities``: its dialect's defaults
    (``llmgw.catalog.engines``), the same for a scheduled and an external replica."""
    return list(m.speaks.capabilities)


def _check_capabilities(m: Model, runtime: Runtime) -> list[Capability]:
    if m.capabilities is None:
        return default_capabilities(m)
    caps = m.capabilities
    if not caps:
        raise DefinitionError(
            "capabilities: an empty list leaves the model nothing to serve; list what it "
            "does (chat, completions, responses, embeddings, rerank, score, audio, speech) "
            "or remove the key for the engine's defaults", field="capabilities")
    for i, cap in enumerate(caps):
        if cap in caps[:i]:
            raise DefinitionError(f"capabilities[{i}]: {cap!r} is listed twice",
                                  field=f"capabilities[{i}]")
    if m.engine == "llama.cpp":
        # The embedded server is the one llmgw starts; an external llama.cpp may be either.
        embedded = runtime.scheduler == "local" and not m.external
        for i, cap in enumerate(caps):
            if cap in _NEVER_LLAMA_CPP or (embedded and cap not in _EMBEDDED_LLAMA_CPP):
                server = ("the embedded llama.cpp server (llama-cpp-python) answers chat, "
                          "completions and embeddings" if embedded else
                          "llama.cpp's server has no such endpoint")
                raise DefinitionError(
                    f"capabilities[{i}]: {cap!r} cannot be served by a llama.cpp replica: "
                    f"{server}; serve it with a vLLM model or an external upstream",
                    field=f"capabilities[{i}]")
    return list(caps)


def _check_health(m: Model) -> None:
    h = m.health
    if h.path is not None and not h.path.startswith("/"):
        raise DefinitionError(f"health.path: {h.path!r} must start with / (e.g. /health)",
                              field="health.path")
    for key in ("interval", "timeout"):
        if getattr(h, key) <= 0:
            raise DefinitionError(f"health.{key}: must be more than 0", field=f"health.{key}")
    if h.timeout > h.interval:
        raise DefinitionError(
            f"health.timeout ({h.timeout}) is longer than health.interval ({h.interval}); a "
            "probe would still be waiting when the next is due", field="health.timeout")


def _check_routing(m: Model) -> None:
    r = m.routing
    if not r.load_factor >= 1.0:
        raise DefinitionError(
            f"routing.load_factor: {r.load_factor} lets no replica take its share; give 1 or "
            "more (1.25: a replica may carry a quarter more than the mean)",
            field="routing.load_factor")
    if r.prefix_bytes < 1:
        raise DefinitionError("routing.prefix_bytes: must be at least 1",
                              field="routing.prefix_bytes")
    if r.max_concurrency is not None and r.max_concurrency < 1:
        raise DefinitionError(
            f"routing.max_concurrency: {r.max_concurrency}; give 1 or more, or omit it for no "
            "limit in the gateway", field="routing.max_concurrency")
    if r.max_waiting < 0:
        raise DefinitionError("routing.max_waiting: must not be negative",
                              field="routing.max_waiting")
    if r.queue_size < 0:
        raise DefinitionError(
            "routing.queue_size: must not be negative (0: answer 429 at once when every "
            "replica is saturated)", field="routing.queue_size")
    if r.queue_wait <= 0:
        raise DefinitionError("routing.queue_wait: must be more than 0",
                              field="routing.queue_wait")
    if r.resume_streams < 0:
        raise DefinitionError(
            "routing.resume_streams: must not be negative (0: never resume a broken stream)",
            field="routing.resume_streams")


def check_model(m: Model, gpu_classes: Mapping[str, GpuClass],
                runtime: Runtime | None = None) -> Model:
    """Validate one model on its own and return it with defaults applied."""
    check_name(m.name)
    if m.external:
        # engine names the dialect of the upstream servers (llmgw.catalog.engines); source
        # and profiles would say how to run it, and nothing is run.
        if m.source is not None:
            raise DefinitionError(
                "source: an external model (upstream) is not scheduled; remove source "
                "or remove upstream",
                field="source",
            )
        if m.profiles:
            raise DefinitionError(
                "profiles: an external model (upstream) is not scheduled; remove profiles "
                "or remove upstream",
                field="profiles",
            )
        for i, url in enumerate(m.upstream):
            _check_url(url, f"upstream[{i}]")
        if m.upstream_auth is not None:
            _check_auth(m.upstream_auth)
    else:
        if m.upstream_auth is not None:
            raise DefinitionError("upstream_auth: only an external model (upstream) has "
                                  "one; remove it", field="upstream_auth")
        if not m.source:
            raise DefinitionError(
                "source: a scheduled model needs a source (hf://org/repo, a mirror URL or a "
                "local path), or upstream for an external model",
                field="source",
            )
        if m.engine is None:
            raise DefinitionError("engine: choose vllm or llama.cpp", field="engine")
        if m.engine not in SCHEDULED:
            raise DefinitionError(
                f"engine: {m.engine} is the dialect of an external model (upstream: its "
                "servers' URLs); llmgw runs vllm or llama.cpp itself", field="engine")
        _check_source(m, runtime or Runtime())
        if not m.profiles:
            raise DefinitionError(
                "profiles: a scheduled model needs at least one profile", field="profiles"
            )
        seen: set[str] = set()
        for j, p in enumerate(m.profiles):
            _check_profile(p, f"profiles[{j}]", gpu_classes)
            if p.name in seen:
                raise DefinitionError(
                    f"profiles[{j}].name: profile {p.name!r} appears twice",
                    field=f"profiles[{j}].name",
                )
            seen.add(p.name)
    s = m.scaling
    if s.min < 0:
        raise DefinitionError(f"scaling.min: {s.min} is negative", field="scaling.min")
    if s.prefetch < 0:
        raise DefinitionError(f"scaling.prefetch: {s.prefetch} is negative; write how many "
                              "nodes beyond those running a replica keep the weights",
                              field="scaling.prefetch")
    rt = runtime or Runtime()
    if s.prefetch and (m.external or (rt.scheduler == "nomad" and not rt.mirror
                                      and isinstance(m.source, HfSource))):
        why = ("the model is external (upstream): no node holds its weights" if m.external
               else "its weights come from the Hugging Face Hub and no mirror is configured, "
                    "so vLLM downloads them inside each replica; set mirror in server.yaml "
                    "and add them with `llmgw mirror add`")
        raise DefinitionError(f"scaling.prefetch: {s.prefetch} cannot be kept: {why}",
                              field="scaling.prefetch")
    if s.max is not None and s.max < s.min:
        raise DefinitionError(
            f"scaling.max: {s.max} is below scaling.min {s.min}", field="scaling.max"
        )
    if s.max is not None and s.max < 1:
        raise DefinitionError(
            "scaling.max: 0 means the model can never run; use min: 0 for an on-demand model",
            field="scaling.max",
        )
    if s.target < 1:
        raise DefinitionError(
            f"scaling.target: {s.target} requests per replica; give 1 or more",
            field="scaling.target")
    if s.scale_down_delay < 0:
        raise DefinitionError("scaling.scale_down_delay: must not be negative",
                              field="scaling.scale_down_delay")
    _check_routing(m)
    _check_health(m)
    if m.lora is not None or any(p.lora is not None for p in m.profiles):
        if m.external:
            raise DefinitionError(
                "lora: an external model (upstream) is not run by llmgw, so llmgw cannot "
                "size its adapter slots; remove lora", field="lora")
        if m.lora is not None:
            check_lora(m.lora, "lora")
        for j, p in enumerate(m.profiles):
            if p.lora is not None:
                check_lora(p.lora, f"profiles[{j}].lora")
    for i, fb in enumerate(m.fallbacks):
        if fb == m.name:
            raise DefinitionError(
                f"fallbacks[{i}]: model {m.name!r} cannot fall back to itself",
                field=f"fallbacks[{i}]",
            )
        if fb in m.fallbacks[:i]:
            raise DefinitionError(
                f"fallbacks[{i}]: {fb!r} is listed twice", field=f"fallbacks[{i}]"
            )
    capabilities = _check_capabilities(m, runtime or Runtime())
    return msgspec.structs.replace(m, scaling=effective_scaling(s), capabilities=capabilities)


def build_catalog(
    models: Iterable[Model], gpu_classes: Mapping[str, GpuClass] | None = None,
    runtime: Runtime | None = None, provenance: Mapping[str, Provenance] | None = None,
    adapters: Iterable[Adapter] = (),
    adapter_provenance: Mapping[str, Provenance] | None = None,
) -> Catalog:
    """Validate ``models`` (and the ``adapters`` served on them) together and return the
    catalog they make.

    Raises DefinitionError naming the model and the field of the first problem.
    """
    classes = dict(gpu_classes or {})
    for cname, gc in classes.items():
        if gc.memory <= 0:
            raise DefinitionError(f"gpu_classes.{cname}.memory: must be more than 0",
                                  field=f"gpu_classes.{cname}.memory")
    built: dict[str, Model] = {}
    for m in models:
        try:
            checked = check_model(m, classes, runtime)
        except DefinitionError as exc:
            raise DefinitionError(f"model {m.name!r}: {exc.message}", field=exc.field) from None
        if m.name in built:
            raise DefinitionError(f"model {m.name!r} is defined twice", field="name")
        built[m.name] = checked
    for m in built.values():
        for i, fb in enumerate(m.fallbacks):
            if fb not in built:
                raise DefinitionError(
                    f"model {m.name!r}: fallbacks[{i}]: there is no model {fb!r} to fall back to",
                    field=f"fallbacks[{i}]",
                )
    _refuse_cycles(built)
    kept = {name: p for name, p in (provenance or {}).items() if name in built}
    rt = runtime or Runtime()
    served = check_adapters(adapters, built, scheduler=rt.scheduler, mirror=rt.mirror)
    kept_adapters = {name: p for name, p in (adapter_provenance or {}).items()
                     if name in served}
    return Catalog(models=built, gpu_classes=classes, provenance=kept, adapters=served,
                   adapter_provenance=kept_adapters)


def _refuse_cycles(models: Mapping[str, Model]) -> None:
    """DefinitionError when following fallbacks can lead back to where it started.

    A cycle would not loop a request (each model is tried at most once), but
    it says nothing an acyclic list would not, and it is almost always a
    mistake: two models each written as the other's spare.
    """
    done: set[str] = set()
    for start in models:
        if start in done:
            continue
        # Iterative depth-first search: the path in progress, and where each
        # of its models is in its list of fallbacks.
        path: list[str] = [start]
        positions = [0]
        on_path = {start}
        while path:
            fallbacks = models[path[-1]].fallbacks
            i = positions[-1]
            if i == len(fallbacks):
                finished = path.pop()
                on_path.discard(finished)
                done.add(finished)
                positions.pop()
                continue
            positions[-1] = i + 1
            nxt = fallbacks[i]
            if nxt in on_path:
                loop = [*path[path.index(nxt):], nxt]
                raise DefinitionError(
                    f"model {path[-1]!r}: fallbacks[{i}]: falling back to {nxt!r} closes a "
                    f"cycle ({' → '.join(loop)}); fallbacks must not form one, so remove one "
                    "of these", field=f"fallbacks[{i}]")
            if nxt in done or nxt not in models:
                continue
            path.append(nxt)
            positions.append(0)
            on_path.add(nxt)


def dependants(catalog_models: Sequence[Model], name: str) -> list[str]:
    """Models that name ``name`` as a fallback."""
    return [m.name for m in catalog_models if name in m.fallbacks]
