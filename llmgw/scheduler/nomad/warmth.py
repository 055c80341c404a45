"""Which nodes hold which weights, and the batch jobs that fetch and sweep them (pure).

A 70B replica on an empty node spends most of its start copying 140 GB. Nomad can
prefer nodes by their metadata, and a node's metadata can change at run time
(``/v1/client/metadata``, Nomad ≥ 1.5); this module decides what that metadata
should say and renders the jobs that change what the caches hold. ``caches`` does
the I/O.

**Who writes the metadata.** Writing a node's dynamic metadata takes ``node:write``
(nomad/client_meta_endpoint.go ``NodeMeta.Apply``, checked again on the node in
client/meta_endpoint.go ``NodeMeta.Apply``). No narrower capability exists: the node
policy has one level for the whole fleet, and the same ``node:write`` drains nodes,
marks them ineligible and purges them. The two candidates were:

* the fetcher, with a token of its own: every fetch task on every node — a
  container that also talks to a mirror — would hold a capability over the whole
  fleet, through a workload identity or a token in a Variable every fetch reads;
* the control plane, after it sees a fetch task finish: one process, which already
  holds ``submit-job`` in its namespace (it can already run any container on any
  node there), holds it.

The control plane writes it: the capability lives in one place that is already
trusted with more, and the tasks on the nodes hold no token at all. The cost is
latency — the key appears a reconcile pass after the fetch ends rather than at
once — which matters little: the next replica of that model is rarely placed in
the seconds between. Reads of a sweep report go through the client fs API,
``read-fs`` in llmgw's namespace (command/agent/fs_endpoint.go, ``cat/``).

**What the metadata says.** ``llmgw_cache_<model>`` = the tag of the cache entry the
model's fetch fills (``llmgw.weights.cache.tag`` of its path, which is the model's
mirror path: a mirror version never changes). A finished fetch proves the entry is
there, so it sets keys and never clears one; a sweep report is the node's whole
content, so it sets what is there and clears every ``llmgw_cache_*`` key naming
something that is not — which is how a key that lies (stale, edited by hand) is
corrected. A lie in between costs one start with a download: the fetcher checks the
entry's checksum and fetches what is missing.

**Prefetch and sweep jobs** are batch jobs pinned to the nodes chosen
(``${node.unique.id}`` ``set_contains_any`` the IDs, ``distinct_hosts``), one
allocation a node. A batch allocation that completed is not run again, and a new
version of the job runs everywhere again (scheduler/reconciler/reconcile_cluster.go
``filterOldTerminalAllocs``), so each run is a new version (its ``llmgw_run`` meta).
They do not carry ``llmgw_managed``: the reconciler must not take them for a model's
service job, and their IDs cannot be a model's ``llmgw-<model>``.

**A prefetch's ID is a Variable path.** Its fetch reads the model's credentials from the
Variable ``nomad/jobs/<job ID>``, the one path its workload identity may read without a
policy (acl/acl.go ``matchingVariablesCapabilitySet``). Nomad refuses a Variable path
with a dot (nomad/structs/variables.go ``validVariablePath``: ``[a-zA-Z0-9-_~/]``), so the
ID is ``llmgw_prefetch_<model>``: valid as a path, and — the underscore — outside the
``llmgw-`` prefix of the service jobs, whose Variables (``nomad/jobs/llmgw-*``) a
prefetch's grant must not reach, and which ``llmgw-prefetch-<model>`` would share with a
model named ``prefetch-<model>``. The sweep reads no Variable and keeps ``llmgw.cache-sweep``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import msgspec

from llmgw.catalog.adapter import Adapter
from llmgw.catalog.model import Model
from llmgw.config import NomadConfig
from llmgw.scheduler.base import NodeView
from llmgw.scheduler.nomad import jobspec as js
from llmgw.scheduler.nomad import wire
from llmgw.scheduler.nomad.render import (
    CACHE_DIR,
    CACHE_META_PREFIX,
    CACHE_VOLUME,
    ENGINE_TASK,
    FETCH_TASK,
    META_MODEL,
    META_WEIGHTS,
    Need,
    adapter_fetch_of,
    cache_key,
    fetch_of,
    fetch_task,
    weights_entry,
)
from llmgw.weights import cache

PREFETCH_PREFIX = "llmgw_prefetch_"
SWEEP_JOB = "llmgw.cache-sweep"
PREFETCH_GROUP = "fetch"
SWEEP_GROUP = "sweep"
META_KIND = "llmgw_kind"
META_RUN = "llmgw_run"
REPORT_FILE = "alloc/llmgw-cache.json"
_SWEEP_CPU_MHZ, _SWEEP_MEMORY_MB = 200, 256


def prefetch_job_id(model: str) -> str:
    return f"{PREFETCH_PREFIX}{model}"


def model_of_prefetch(job: str) -> str | None:
    return job[len(PREFETCH_PREFIX):] if job.startswith(PREFETCH_PREFIX) else None


def prefetch_refusal(model: Model, mirror: str | None) -> str | None:
    """Why ``model``'s weights cannot be fetched ahead onto nodes, or None when they can."""
    if model.external:
        return f"model {model.name!r} is external (upstream); no node holds its weights"
    if weights_entry(model, mirror) is None:
        return (f"model {model.name!r} has no mirrorable source: its weights come from the "
                "Hugging Face Hub and no mirror is configured, so vLLM downloads them inside "
                "the replica and there is nothing to fetch ahead; set mirror: in server.yaml "
                f"and `llmgw mirror add` the model")
    return None


def holds(node_meta: Mapping[str, str] | None, models: Iterable[Model],
          mirror: str | None, adapters: Iterable[Adapter] = ()) -> list[str]:
    """The models (and adapters) whose weights a node's metadata says it holds."""
    meta = node_meta or {}
    out = []
    for m in models:
        entry = None if m.external else weights_entry(m, mirror)
        if entry is not None and meta.get(cache_key(m.name)) == cache.tag(entry):
            out.append(m.name)
    for a in adapters:
        found = adapter_fetch_of(a, mirror)
        if found is not None and meta.get(cache_key(a.name)) == cache.tag(found[1]):
            out.append(a.name)
    return out


def keys_for(tags: Iterable[str], models: Iterable[Model], mirror: str | None,
             adapters: Iterable[Adapter] = ()) -> dict[str, str]:
    """The metadata a node holding the entries tagged ``tags`` carries: every model and
    adapter using one of them (two models of one source share an entry)."""
    present = set(tags)
    out = {}
    for m in models:
        entry = None if m.external else weights_entry(m, mirror)
        if entry is not None and cache.tag(entry) in present:
            out[cache_key(m.name)] = cache.tag(entry)
    for a in adapters:
        found = adapter_fetch_of(a, mirror)
        if found is not None and cache.tag(found[1]) in present:
            out[cache_key(a.name)] = cache.tag(found[1])
    return out


def changes(meta: Mapping[str, str] | None, wanted: Mapping[str, str], *,
            complete: bool) -> dict[str, str | None]:
    """The ``/v1/client/metadata`` body bringing ``meta`` to ``wanted``; ``complete``: the
    node holds nothing else, so other ``llmgw_cache_*`` keys are cleared."""
    have = meta or {}
    out: dict[str, str | None] = {k: v for k, v in wanted.items() if have.get(k) != v}
    if complete:
        out.update({k: None for k in have if k.startswith(CACHE_META_PREFIX)
                    and k not in wanted})
    return out


def _exit_code(e: wire.TaskEvent) -> int:
    raw = (e.Details or {}).get("exit_code")
    return int(raw) if raw is not None and raw.lstrip("-").isdigit() else e.ExitCode


def fetched(a: wire.Allocation, task: str = FETCH_TASK) -> bool:
    """The allocation's fetch task exited 0: every file it fetched is verified and in
    place under its final name.

    Only the exit code says so. A stop kills a task mid-download and leaves it ``dead``
    and not ``Failed``, its events ``Killing``, ``Terminated`` with the signal's exit code
    (143 for SIGTERM), ``Killed`` (client/allocrunner/taskrunner/task_runner.go
    ``handleKill``, ``emitExitResultEvent``): judged by state alone, such a node would be
    marked warm with half the weights. ``llmgw fetch`` exits 0 only after it checked each
    file — its sha256 (``--sha256`` or the mirror's ``.sha256``), or the length the mirror
    announced where the mirror publishes no sum — and renamed it into place
    (``llmgw.weights.fetch``)."""
    state = (a.TaskStates or {}).get(task)
    if state is None or state.State != "dead" or state.Failed:
        return False
    exits = [e for e in state.Events or () if e.Type == "Terminated"]
    return bool(exits) and _exit_code(exits[-1]) == 0


def _fits(need: Need, n: NodeView) -> bool:
    return (n.gpus_free >= need.gpus and n.cores_free >= need.cores
            and n.memory_free >= need.memory)


def eligible(need: Need, n: NodeView) -> bool:
    """A node a replica of ``need`` could ever run on: the weights are worth having there."""
    if not n.schedulable:
        return False
    if need.gpus:
        return (n.gpu_class == need.gpu_class and n.gpus_total >= need.gpus
                and (need.fabric is None or n.fabric == need.fabric))
    return (need.gpu_nodes or (n.gpu_class is None and not n.gpus_total)) and \
        (need.fabric is None or n.fabric == need.fabric)


def choose_nodes(need: Need, nodes: Sequence[NodeView], warm: set[str], count: int
                 ) -> list[NodeView]:
    """``count`` nodes to prefetch onto: able to run the model and not yet warm for it,
    those with room for a replica now first, then the emptiest."""
    pool = [n for n in nodes if eligible(need, n) and n.id not in warm]
    pool.sort(key=lambda n: (not _fits(need, n), -n.gpus_free, -n.memory_free, n.name))
    return pool[:max(0, count)]


def _pinned(node_ids: Sequence[str]) -> list[js.Constraint]:
    return [js.Constraint(LTarget="${node.unique.id}", Operand="set_contains_any",
                          RTarget=",".join(node_ids)),
            js.Constraint(Operand="distinct_hosts", RTarget="true")]


def _batch(cfg: NomadConfig, jid: str, meta: dict[str, str], group: js.TaskGroup) -> js.Job:
    return js.Job(ID=jid, Name=jid, Type="batch", Namespace=cfg.namespace or None,
                  Region=cfg.region or None, Datacenters=list(cfg.datacenters),
                  NodePool=cfg.node_pool or None, Meta=meta, TaskGroups=[group])


def _volume(cfg: NomadConfig) -> dict[str, js.VolumeRequest]:
    return {CACHE_VOLUME: js.VolumeRequest(Name=CACHE_VOLUME, Type="host",
                                           Source=cfg.cache_volume, ReadOnly=False)}


def prefetch_job(model: Model, cfg: NomadConfig, mirror: str | None, node_ids: Sequence[str],
                 run: str, keys: tuple[str, ...] = ()) -> js.Job:
    """The batch job fetching ``model``'s weights onto each of ``node_ids`` once.

    ``keys``: the credentials its fetch reads from its own Variable (``credentials``).
    The caller checked ``prefetch_refusal``.
    """
    found = fetch_of(model, mirror)
    assert found is not None, prefetch_refusal(model, mirror)
    url, entry = found
    jid = prefetch_job_id(model.name)
    task = fetch_task(cfg, url, entry, jid, keys, prestart=False)
    group = js.TaskGroup(Name=PREFETCH_GROUP, Count=len(node_ids),
                         Constraints=_pinned(node_ids), Volumes=_volume(cfg), Tasks=[task])
    return _batch(cfg, jid, {META_KIND: "prefetch", META_MODEL: model.name,
                             META_WEIGHTS: cache.tag(entry), META_RUN: run}, group)


def sweep_job(cfg: NomadConfig, node_ids: Sequence[str], keep: Iterable[str], since: float,
              run: str) -> js.Job:
    """The batch job sweeping the caches of ``node_ids``: evicting over
    ``cfg.cache_max`` (when set) and reporting what each holds to its allocation dir."""
    args = ["cache", "sweep", CACHE_DIR, "--since", f"{since:.0f}",
            "--report", "${NOMAD_ALLOC_DIR}/" + REPORT_FILE.removeprefix("alloc/")]
    if cfg.cache_max is not None:
        args += ["--max-bytes", str(int(cfg.cache_max))]
    for entry in sorted(set(keep)):
        args += ["--keep", entry]
    # The fetch's user (render.fetch_task): the one that owns what it evicts.
    task = js.Task(Name=SWEEP_GROUP, Driver="docker", User=cfg.fetch_user,
                   Config={"image": cfg.fetcher_image, "command": "llmgw", "args": args},
                   Resources=js.Resources(CPU=_SWEEP_CPU_MHZ, MemoryMB=_SWEEP_MEMORY_MB),
                   VolumeMounts=[js.VolumeMount(Volume=CACHE_VOLUME, Destination=CACHE_DIR,
                                                ReadOnly=False)])
    group = js.TaskGroup(Name=SWEEP_GROUP, Count=len(node_ids), Constraints=_pinned(node_ids),
                         Volumes=_volume(cfg), Tasks=[task])
    return _batch(cfg, SWEEP_JOB, {META_KIND: "sweep", META_RUN: run}, group)


class Phase(msgspec.Struct, frozen=True):
    """Where a starting replica is, in words, and the fetch's share done when known."""

    name: str               # pulling image, fetching weights, loading, healthy, …
    percent: float | None = None

    @property
    def text(self) -> str:
        return f"{self.name} {self.percent:.0f}%" if self.percent is not None else self.name


def _pulling(state: wire.TaskState | None) -> bool:
    """The Docker driver's "Downloading image" event is the task's last
    (drivers/docker/driver.go ``createImage``), and the task has not started."""
    if state is None or state.State != "pending":
        return False
    events = [e for e in state.Events or () if e.Type != "Received"]
    return bool(events) and events[-1].DisplayMessage.startswith("Downloading image")


def phase(a: wire.Allocation, healthy: bool, percent: float | None = None) -> Phase:
    """A replica's phase from its allocation's task states and events; ``percent``: what
    the fetch's progress file says, while it runs."""
    if a.ClientStatus in ("complete", "failed", "lost") or a.DesiredStatus != "run":
        return Phase(a.ClientStatus if a.DesiredStatus == "run" else "stopping")
    if healthy:
        return Phase("healthy")
    states = a.TaskStates or {}
    fetch, engine = states.get(FETCH_TASK), states.get(ENGINE_TASK)
    if _pulling(fetch) or _pulling(engine):
        return Phase("pulling image")
    if fetch is not None and fetch.State == "running":
        return Phase("fetching weights", percent)
    if engine is not None and engine.State == "running":
        return Phase("loading")
    if a.ClientStatus == "pending" and not states:
        return Phase("placed")
    return Phase("starting")
