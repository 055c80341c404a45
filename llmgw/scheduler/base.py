"""The interface every scheduler backend implements, and the values it reports.

Two backends stand behind it: Nomad (production, ``llmgw.scheduler.nomad``) and
the embedded local scheduler (``llmgw.scheduler.local``). The Protocol is split
by caller: the gateway sees ``Routing`` and the control plane ``Control``, so
neither can reach past what it needs, and neither can tell which scheduler
runs — which is what lets the embedded mode be a faithful rehearsal of the
production one.

Placement has two failure kinds, kept apart on purpose:

* a profile no node could *ever* satisfy (no such GPU, unknown fabric, more
  cores than any machine has) is a definition error at add time
  (``PlacementError``), because waiting would wait forever;
* a profile that fits the fleet but not its free capacity right now is
  accepted, and the model reports ``waiting_for_capacity`` with the reason
  until it is placed.
"""

from __future__ import annotations

from typing import Literal, Protocol, runtime_checkable

import msgspec

from llmgw.catalog.adapter import Adapter
from llmgw.catalog.build import Catalog
from llmgw.catalog.model import Model

ReplicaState = Literal["pending", "starting", "running", "failed", "stopping", "stopped"]


class Replica(msgspec.Struct, frozen=True, kw_only=True):
    """One running (or trying to run) copy of a model."""

    id: str
    model: str
    profile: str
    fingerprint: str          # the one it was started with; "" when unknown
    node: str
    state: ReplicaState
    healthy: bool             # passes its health check now: may receive traffic
    address: str | None = None  # base URL of the engine, e.g. http://10.0.3.17:24117
    reserved_memory: int | None = None   # bytes
    measured_memory: int | None = None   # bytes, from allocation stats / the process
    restarts: int = 0
    message: str = ""         # last failure, with the engine's last output lines
    # Where a starting replica is: pulling image, fetching weights 42%, loading, healthy
    phase: str = ""


class Holding(msgspec.Struct, frozen=True, kw_only=True):
    """One replica's hold on cards and cores, from placement until the scheduler freed them.

    What costs are computed from: a Nomad allocation from its ``CreateTime``
    until its client reported it terminal, a local engine from its
    reservation until its release; starting, loading, restarting and draining
    included, since the cards are held all along.
    """

    id: str                   # unique across the scheduler's history (allocation ID)
    model: str
    gpu_class: str            # "" for a CPU replica, or a card no gpu class names
    gpus: int
    cores: float              # reserved cores; counted only for a replica without cards
    start: float              # Unix seconds
    end: float | None = None  # None: still held


class ModelStatus(msgspec.Struct, frozen=True, kw_only=True):
    """What the backend knows about one model, shown by the API and the CLI."""

    desired: int = 0
    ready: int = 0
    waiting_for_capacity: str | None = None
    last_placement_failure: str | None = None
    last_error: str | None = None
    crash_loop: bool = False
    # Why it runs fewer replicas than ``desired``, when it does
    shortfall: str | None = None
    # The scheduler's last rollout of the model's current version failed, and what followed
    deployment_failed: str | None = None
    # The scheduler refuses llmgw's own credentials something this model needs: which
    # capability, on what, from which token, and where to grant it
    refused: str | None = None
    # The last prefetch of its weights (scaling.prefetch) could not be started, and why
    prefetch_error: str | None = None


class ScalerDecision(msgspec.Struct, frozen=True, kw_only=True):
    """The gateway scaler's latest count for a model and why (published in the store).

    ``kind``: ``load`` (following it), ``min`` or ``max`` (held at the range's
    end), ``stabilising`` (lower load, inside scale_down_delay), ``loading``
    (waiting for replicas asked for), ``capacity`` (the scheduler has no room).
    ``since``: seconds since the count last changed, when known.
    """

    desired: int
    kind: str
    reason: str
    since: float | None = None


class ScalerDecisions(msgspec.Struct, frozen=True):
    models: dict[str, ScalerDecision]


# Where the scaler publishes them: store.reports(SCALER_REPORT, ...), one row.
SCALER_REPORT = ("scaler", "decisions")


class ProbeReport(msgspec.Struct, frozen=True, kw_only=True):
    """What one gateway's active probes of external models' upstreams last found
    (published in the store, a row per gateway): per model, the upstreams it probes
    and those failing their probe (credentials masked)."""

    probed: dict[str, int] = {}
    down: dict[str, list[str]] = {}


# Where each gateway publishes it: store.reports(PROBES_REPORT, ...), keyed by gateway.
PROBES_REPORT = "probes"


class NodeView(msgspec.Struct, frozen=True, kw_only=True):
    """One machine of the fleet, totals and free capacity as the scheduler counts them."""

    name: str
    id: str
    status: str               # ready, down, draining, ineligible, ...
    schedulable: bool
    gpu_class: str | None
    gpu_device: str | None
    fabric: str | None
    gpus_total: int
    gpus_free: int
    gpu_memory: int | None    # bytes per card, as the node reports it
    cores_total: int
    cores_free: int
    memory_total: int         # bytes
    memory_free: int
    # Why jobs will not come here though its numbers say they fit (e.g. its cards
    # report less memory than their gpu class declares)
    warning: str | None = None
    # The models whose weights this node's cache holds (a replica starts here without
    # downloading them), and the adapters (a replica here loads one without a fetch)
    warm: list[str] = []


class Pool(msgspec.Struct, frozen=True, kw_only=True):
    """Nodes grouped by (gpu class, fabric): a replica never spans two pools."""

    name: str
    gpu_class: str | None
    fabric: str | None
    gpu_memory: int | None
    nodes: list[str]
    gpus_total: int
    gpus_free: int
    largest_free_gpus_on_a_node: int


class Fleet(msgspec.Struct, frozen=True, kw_only=True):
    nodes: list[NodeView]
    pools: list[Pool]
    warnings: list[str] = []    # configuration the fleet contradicts, and the fix


class PrefetchNode(msgspec.Struct, frozen=True, kw_only=True):
    """One node a prefetch brings a model's weights to."""

    node: str
    state: Literal["queued", "fetching", "done", "failed"]
    percent: float | None = None   # of the weights on disk, while fetching
    message: str = ""


class Prefetch(msgspec.Struct, frozen=True, kw_only=True):
    """A model's weights fetched onto nodes ahead of its replicas, and where they are."""

    model: str
    nodes: list[PrefetchNode] = []
    warm: list[str] = []       # every node holding the weights now, replicas' included
    message: str = ""


class BackendHealth(msgspec.Struct, frozen=True, kw_only=True):
    """``ok``: the scheduler answers. ``refused``: it answers but refuses llmgw's own
    credentials something (which capability, and the fix) — no outage, and the gateway
    routes as ever, but models that need it do not start."""

    ok: bool
    message: str = ""
    since: float | None = None
    refused: str | None = None


class Routing(Protocol):
    """What the gateway needs of a scheduler: where a model's healthy replicas are,
    word when that may have changed, and a replica count to run. Every read is from the
    backend's cache, so the request path never waits on the scheduler."""

    def endpoints(self, model: str) -> list[str]:
        """Base URLs of the model's healthy replicas, from the backend's cache (no I/O)."""

    def profile_of(self, address: str) -> str | None:
        """The profile the replica at ``address`` (an endpoint) runs, when the backend
        knows it; from its cache (no I/O). The ledger records that profile's GPU class."""

    async def wait_changed(self, timeout: float) -> None:  # noqa: ASYNC109 (a wake-up, not a deadline)
        """Return when the set of endpoints may have changed, or after ``timeout``."""

    def adapter_warm(self, adapter: Adapter, address: str) -> bool:
        """Whether the disk the replica at ``address`` reads already holds ``adapter``'s
        weights, from the backend's cache (no I/O): the gateway prefers to load an
        adapter where it need not be fetched first."""

    async def stage_adapter(self, adapter: Adapter, address: str, *,
                            again: bool = False) -> None:
        """Bring ``adapter``'s weights onto the disk the replica at ``address`` reads,
        before the gateway asks the engine to load it from there; ``again``: the engine
        found nothing at the path, so fetch even where they were thought to be.
        UnavailableError, saying why, when they cannot be brought there."""

    async def set_demand(self, model: str, replicas: int) -> None:
        """Run ``replicas`` copies of the model, kept within ``[scaling.min, scaling.max]``.

        The gateway's two scaling paths call this: the on-demand path for a
        min-0 model (1 starts it, 0 stops it) and the load-based scaler
        between min and max. The count holds until the next call; a catalog
        change clamps it into the new range. The backend may accept the call
        before the scheduler has acted (``status().desired`` and ``ready``
        show the progress).
        """

    def status(self, model: str) -> ModelStatus: ...

    def health(self) -> BackendHealth:
        """Whether the scheduler answers (Nomad reachable), from the backend's cache (no
        I/O); the gateway exports it for alerting (``llmgw_scheduler_up``)."""


class SameDisk:
    """``Routing``'s adapter half for a backend whose replicas read an adapter from the
    path the catalog gives (this machine's disk): nothing to fetch, no replica warmer
    than another."""

    def adapter_warm(self, adapter: Adapter, address: str) -> bool:
        return False

    async def stage_adapter(self, adapter: Adapter, address: str, *,
                            again: bool = False) -> None:
        return None


class Control(Protocol):
    """What the control plane needs of a scheduler: apply the catalog, roll out,
    report replicas, fleet and health, and judge placement at add time."""

    async def start(self) -> None: ...

    async def close(self) -> None:
        """Stop watching. The local backend also stops its child processes."""

    async def check_placement(self, model: Model, catalog: Catalog) -> None:
        """Raise PlacementError if no node could ever run any profile of ``model``."""

    async def apply(self, catalog: Catalog) -> None:
        """Make the running set match ``catalog`` (register, scale, deregister).

        May return before the scheduler has acted (Nomad's reconciler runs the
        pass in its own loop); status and replicas show the progress.

        Does not replace running replicas whose profile changed; they show as
        stale until ``rollout``.
        """

    async def rollout(self, model: str) -> str | None:
        """Replace the model's replicas with ones running the current profile.

        Returns the name of the profile the new replicas run (the first one
        the fleet can meet, not necessarily the first listed), or None when no
        profile fits now.
        """

    async def replicas(self, model: str | None = None) -> list[Replica]: ...

    async def holdings(self) -> list[Holding]:
        """Every replica's hold on cards and cores that the scheduler still knows of:
        those held now, and those freed recently (Nomad forgets a terminal
        allocation at its garbage collection; the local scheduler after a day)."""

    def status(self, model: str) -> ModelStatus: ...

    async def fleet(self) -> Fleet: ...

    def health(self) -> BackendHealth: ...

    async def prefetch(self, model: str, *, nodes: list[str] | None = None,
                       count: int | None = None) -> Prefetch:
        """Bring the model's weights onto ``nodes`` (names or IDs), or onto ``count`` nodes
        that could run it and do not hold them yet, ahead of a scale-up. RefusedError
        when the model's weights cannot be fetched ahead (the reason says why)."""

    async def prefetch_status(self, model: str) -> Prefetch:
        """The model's latest prefetch, node by node, and which nodes hold its weights."""


@runtime_checkable
class ReplicaLogs(Protocol):
    """A backend that can show a replica's engine output (the admin console's replica
    page asks with ``isinstance``; a backend without it shows none)."""

    async def replica_log(self, replica: str, lines: int) -> list[str]:
        """The last ``lines`` lines the engine of replica ``replica`` (its ``Replica.id``)
        wrote, oldest first. ``NotFoundError`` when no replica has that id."""


class Backend(Routing, Control, Protocol):
    """A scheduler, both faces: what ``llmgw serve`` builds and hands to each caller.

    All methods are async and safe to call from the event loop.
    """
