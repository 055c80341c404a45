"""Credentials a replica needs, delivered through Nomad Variables, never through the job.

A mirror behind a password, a source URL with ``user:password@`` and the Hugging Face
token of a gated model all reach a task the same way: llmgw writes them as items of the
Nomad Variable ``nomad/jobs/<job>``, and the task reads them with a ``template``
(``env = true``) under its workload identity, which may read its own job's path and no
other job's (acl/acl.go ``matchingVariablesCapabilitySet``). So the rendered job, its
fingerprint and spec hash, the cache directory and the engine's command line hold a
path and a key name, never a secret, and rotating a password rewrites the Variable and
nothing else: no new job version, no replaced allocation.

**llmgw writes the Variable itself** (its token holds ``write`` on
``nomad/jobs/llmgw-*``, nomad/llmgw-policy.hcl) rather than asking the operator to
``nomad var put`` it, for three reasons. Models are added at runtime, through the API
and the admin page, by people who need no Nomad access; a password typed there must
land somewhere at once. A template reading a Variable that does not exist keeps the
task waiting (``Missing: nomad.var.block(…)``) with nothing in llmgw saying why, so the
Variable must exist before the job is registered, which only llmgw can order. And the
mirror's password is one setting shared by every job; rotating it is one edit and a
restart, not one command per model. The cost is one capability more on llmgw's token,
scoped to its own jobs' paths.

Where each secret lives: the mirror's password in server.yaml's ``mirror`` URL (the
operator's file, like the database URL) and the Hub token in
``scheduler.nomad.hf_token`` (or ``LLMGW_HF_TOKEN``), both in memory and written to each
job's Variable; a password in a model's source URL in that Variable **only** — the
store and every view hold ``user:***@`` (``llmgw.catalog.source.UrlSource``), so after
it is written llmgw itself no longer knows it. Writing the definition back with
``***`` keeps the password Nomad holds; a job whose Variable lacks it is refused with
the way out, rather than registered to wait forever.

Items: ``LLMGW_FETCH_USERINFO`` (``user:password``, percent-encoded as in a URL, so the
rendered ``KEY=value`` line needs no quoting) for ``llmgw fetch``, and ``HF_TOKEN`` for
vLLM downloading from the Hub itself.
"""

from __future__ import annotations

import threading
from typing import Protocol
from urllib.parse import urlsplit

import msgspec

from llmgw.catalog.source import HfSource, Source, UrlSource, userinfo_of
from llmgw.config import NomadConfig
from llmgw.errors import DefinitionError

FETCH_USERINFO = "LLMGW_FETCH_USERINFO"
HF_TOKEN = "HF_TOKEN"  # noqa: S105 (the name of an item, not a token)


class Sourced(Protocol):
    """What credentials are decided from: a model, or an adapter fetched like one."""

    @property
    def name(self) -> str: ...

    @property
    def source(self) -> Source | None: ...


class Needs(msgspec.Struct, frozen=True):
    """The Variable items each task reads (by task role), and the values llmgw knows."""

    fetch: tuple[str, ...] = ()
    engine: tuple[str, ...] = ()
    known: dict[str, str] = {}

    @property
    def keys(self) -> set[str]:
        return {*self.fetch, *self.engine}


def variable_path(job_id: str) -> str:
    """The Variable a job's tasks read: their workload identity may read it."""
    return f"nomad/jobs/{job_id}"


def needs(model: Sourced, cfg: NomadConfig, mirror: str | None) -> Needs:
    """What ``model``'s job reads from its Variable, decided from its source alone."""
    src = model.source
    if isinstance(src, UrlSource) and src.userinfo is not None:
        known = {FETCH_USERINFO: src.userinfo} if src.password_known else {}
        return Needs(fetch=(FETCH_USERINFO,), known=known)
    if isinstance(src, HfSource) and mirror:
        info = userinfo_of(mirror)
        if info is not None and urlsplit(mirror).password is not None:
            return Needs(fetch=(FETCH_USERINFO,), known={FETCH_USERINFO: info})
        return Needs()
    if isinstance(src, HfSource) and cfg.hf_token:
        return Needs(engine=(HF_TOKEN,), known={HF_TOKEN: cfg.hf_token})
    return Needs()


def template(job_id: str, keys: tuple[str, ...]) -> str:
    """The ``env = true`` template that turns the Variable's items into environment."""
    lines = "".join(f"{k}={{{{ .{k} }}}}\n" for k in keys)
    return f'{{{{ with nomadVar "{variable_path(job_id)}" }}}}\n{lines}{{{{ end }}}}\n'


class Variable(msgspec.Struct):
    """The part of Nomad's variable answer read here (nomad/structs/variables.go)."""

    Items: dict[str, str] = {}
    ModifyIndex: int = 0


class VariableStore(Protocol):
    """What is needed of ``llmgw.scheduler.nomad.client.NomadClient``."""

    def read_variable(self, path: str) -> Variable | None: ...

    def write_variable(self, path: str, items: dict[str, str], cas: int) -> bool: ...


class Keeper:
    """Makes each job's Variable hold what its templates read; blocking (run it off the
    event loop). What it last saw per path is remembered, so a pass over an unchanged
    catalog asks Nomad nothing, while a restarted llmgw with a rotated password reads
    each path once and rewrites what changed."""

    def __init__(self, store: VariableStore, cfg: NomadConfig, mirror: str | None) -> None:
        self._store = store
        self._cfg = cfg
        self._mirror = mirror
        self._seen: dict[str, dict[str, str]] = {}
        self._lock = threading.Lock()

    def ensure(self, model: Sourced, job_id: str, *, fallback_job: str | None = None
               ) -> str | None:
        """Write what is missing or changed; the Variable's path when the job reads one.
        ``fallback_job``: a job whose Variable supplies what this one lacks (a prefetch
        job reads the credentials its model's replicas read). DefinitionError when it
        would read an item nobody can supply."""
        wants = needs(model, self._cfg, self._mirror)
        if not wants.keys:
            return None
        path = variable_path(job_id)
        with self._lock:
            seen = self._seen.get(path)
        if seen is not None and wants.keys <= set(seen) and \
                all(seen.get(k) == v for k, v in wants.known.items()):
            return path
        for _ in range(3):   # a write lost to a concurrent one is read again
            current = self._store.read_variable(path) or Variable()
            items = {**current.Items, **wants.known}
            if fallback_job is not None and wants.keys - set(items):
                other = self._store.read_variable(variable_path(fallback_job)) or Variable()
                items = {**{k: v for k, v in other.Items.items() if k in wants.keys}, **items}
            missing = sorted(wants.keys - set(items))
            if missing:
                raise DefinitionError(
                    f"model {model.name!r}: its source names a user whose password Nomad does "
                    f"not hold (no {', '.join(missing)} in the Variable {path}, namespace "
                    f"{self._cfg.namespace!r}); give the model again with the password in "
                    "the URL (it is kept in that Variable, never in llmgw's store)",
                    field="source")
            if items == current.Items or self._store.write_variable(path, items,
                                                                     current.ModifyIndex):
                with self._lock:
                    self._seen[path] = items
                return path
        raise DefinitionError(f"model {model.name!r}: the Variable {path} kept changing while "
                              "llmgw wrote it; try again", field="source")
