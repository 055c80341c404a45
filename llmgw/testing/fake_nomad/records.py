"""The fake cluster's rows: nodes, allocations, evaluations, deployments, services.

These are the server's records, not wire bodies: ``wire.py`` renders them in Nomad's
Go-named JSON, with the quirks that belong to the wire (omitted zero values, ``Drain``
derived from the drain strategy). Keeping the two apart lets the scheduler and the
reconciler work with plain typed values.

The one exception is ``AllocMetric``: it is both a scheduler result and a wire body
(``FailedTGAllocs``, ``Allocation.Metrics``), so its fields are renamed to Nomad's keys
directly. Empty maps stay ``None`` because go-codec encodes a nil map as ``null``.

The job itself is kept as the canonical JSON tree (``dict``) rather than a struct:
it must round-trip every field a client sent (GET /v1/job returns it), and a few
hundred Go fields mirrored as Python classes would be a second schema to keep in step.
"""

from __future__ import annotations

from typing import Any

import msgspec

CLIENT_TERMINAL = frozenset({"complete", "failed", "lost"})
# Status descriptions, verbatim from nomad/structs/deployment.go and scheduler/structs/const.go
DEPLOYMENT_RUNNING = "Deployment is running"
DEPLOYMENT_SUCCESSFUL = "Deployment completed successfully"
DEPLOYMENT_FAILED_ALLOCS = "Failed due to unhealthy allocations"
DEPLOYMENT_PROGRESS_DEADLINE = "Failed due to progress deadline"
DEPLOYMENT_FAILED_BY_USER = "Deployment marked as failed"
DEPLOYMENT_NEWER_JOB = "Cancelled due to newer version of job"
DEPLOYMENT_STOPPED_JOB = "Cancelled because job is stopped"
ALLOC_NOT_NEEDED = "alloc not needed due to job update"
ALLOC_UPDATING = "alloc is being updated due to job update"
ALLOC_MIGRATING = "alloc is being migrated"
ALLOC_LOST = "alloc is lost since its node is down"
ALLOC_RESCHEDULED = "alloc was rescheduled because it failed"


class AllocMetric(msgspec.Struct, rename="pascal", kw_only=True):
    """structs.AllocMetric as the wire carries it (api/allocations.go AllocationMetric)."""

    nodes_evaluated: int = 0
    nodes_filtered: int = 0
    nodes_in_pool: int = 0
    node_pool: str = "default"
    nodes_available: dict[str, int] | None = None
    class_filtered: dict[str, int] | None = None
    constraint_filtered: dict[str, int] | None = None
    nodes_exhausted: int = 0
    class_exhausted: dict[str, int] | None = None
    dimension_exhausted: dict[str, int] | None = None
    quota_exhausted: list[str] | None = None
    resources_exhausted: dict[str, Any] | None = None
    scores: dict[str, float] | None = None
    allocation_time: int = 0
    coalesced_failures: int = 0
    score_meta_data: list[dict[str, Any]] | None = None

    def filter_node(self, node: Node, reason: str) -> None:
        self.nodes_filtered += 1
        if node.node_class:
            self.class_filtered = self.class_filtered or {}
            self.class_filtered[node.node_class] = self.class_filtered.get(node.node_class, 0) + 1
        self.constraint_filtered = self.constraint_filtered or {}
        self.constraint_filtered[reason] = self.constraint_filtered.get(reason, 0) + 1

    def exhaust_node(self, node: Node, dimension: str) -> None:
        self.nodes_exhausted += 1
        if node.node_class:
            self.class_exhausted = self.class_exhausted or {}
            self.class_exhausted[node.node_class] = self.class_exhausted.get(node.node_class, 0) + 1
        self.dimension_exhausted = self.dimension_exhausted or {}
        self.dimension_exhausted[dimension] = self.dimension_exhausted.get(dimension, 0) + 1


class DeviceInstance(msgspec.Struct, kw_only=True):
    id: str
    healthy: bool = True
    pci_bus_id: str = ""


class DeviceGroup(msgspec.Struct, kw_only=True):
    """One NodeDeviceResource: all instances of one (vendor, type, model) on a node."""

    vendor: str
    type: str
    name: str
    attributes: dict[str, dict[str, Any]]  # wire form: {"memory": {"Int": 81559, "Unit": "MiB"}}
    instances: list[DeviceInstance]


class HostVolume(msgspec.Struct, kw_only=True):
    """A client's ``host_volume``: its path, and the directory there as the node has it.
    Nomad's API shows only the path and ``read_only``; the owner and mode are the node's,
    and decide whether a task's user can write through the mount."""

    path: str
    read_only: bool = False
    owner: int = 10001      # what the README's `install -d -o 10001` makes
    mode: int = 0o755
    exists: bool = True


class Node(msgspec.Struct, kw_only=True):
    id: str
    name: str
    address: str
    datacenter: str = "dc1"
    node_class: str = ""
    node_pool: str = "default"
    status: str = "ready"
    eligibility: str = "eligible"
    drain: bool = False
    attributes: dict[str, str] = {}
    meta: dict[str, str] = {}
    cpu_model: str = ""
    sockets: int = 1
    core_mhz: int = 3000
    core_ids: list[int] = []
    reserved_cores: list[int] = []
    reserved_cpu_shares: int = 0
    memory_mb: int = 0
    reserved_memory_mb: int = 0
    disk_mb: int = 0
    reserved_disk_mb: int = 0
    devices: list[DeviceGroup] = []
    drivers: list[str] = msgspec.field(default_factory=lambda: ["docker", "exec"])
    host_volumes: dict[str, HostVolume] = {}
    min_dynamic_port: int = 20000
    max_dynamic_port: int = 32000
    create_index: int = 0
    modify_index: int = 0
    status_updated_at: int = 0
    # The server's RPC connection to this node's client, as requests forwarded there
    # (allocation checks and stats) see it: answered after rpc_delay seconds, with a
    # 500 of rpc_error when set (FakeNomad.set_node_rpc).
    rpc_delay: float = 0.0
    rpc_error: str = ""
    # Dynamic metadata (``/v1/client/metadata``, ``clientapi``): the agent's own ``meta``
    # once the first dynamic write set it apart (None until then), and the keys written.
    static_meta: dict[str, str] | None = None
    dynamic_meta: dict[str, str | None] = {}
    # The client's own copy of its metadata, ahead of ``meta`` (the servers') until the
    # client's batched re-register lands at ``meta_due`` (Unix ns on the fake's clock; 0:
    # nothing pending). ``clientapi`` explains.
    client_meta: dict[str, str] | None = None
    meta_due: int = 0

    @property
    def schedulable(self) -> bool:
        """docs/nomad-api.md §3.3 item 6: ready, eligible and not draining."""
        return self.status == "ready" and self.eligibility == "eligible" and not self.drain


class PortMapping(msgspec.Struct, kw_only=True):
    label: str
    value: int
    to: int
    host_ip: str


class AllocDevice(msgspec.Struct, kw_only=True):
    vendor: str
    type: str
    name: str
    device_ids: list[str]


class TaskAlloc(msgspec.Struct, kw_only=True):
    """AllocatedTaskResources of one task, plus its lifecycle stage for Comparable()."""

    cpu_shares: int = 0
    reserved_cores: list[int] = []
    memory_mb: int = 0
    memory_max_mb: int = 0
    devices: list[AllocDevice] = []
    stage: str = "main"  # main | prestart | sidecar | poststart | poststop


class TaskState(msgspec.Struct, kw_only=True):
    state: str = "pending"
    failed: bool = False
    restarts: int = 0
    started_at: str | None = None
    finished_at: str | None = None
    events: list[dict[str, Any]] = []


class Alloc(msgspec.Struct, kw_only=True):
    id: str
    namespace: str
    eval_id: str
    name: str
    node_id: str
    node_name: str
    job_id: str
    job_version: int
    job: dict[str, Any]
    task_group: str
    tasks: dict[str, TaskAlloc]
    disk_mb: int = 0
    ports: list[PortMapping] = []
    desired_status: str = "run"
    desired_description: str = ""
    client_status: str = "pending"
    client_description: str = ""
    task_states: dict[str, TaskState] = {}
    deployment_id: str = ""
    healthy: bool | None = None
    health_time: str | None = None
    # DesiredTransition.Reschedule: the deployment watcher lets an unhealthy alloc of an
    # active, progress-based deployment be replaced (deployment_watcher.go handleAllocUpdate)
    reschedule_allowed: bool = False
    previous_allocation: str = ""
    next_allocation: str = ""
    followup_eval_id: str = ""
    reschedule_events: list[dict[str, Any]] = []
    migrate: bool = False
    metrics: AllocMetric = msgspec.field(default_factory=AllocMetric)
    memory_usage: int | None = None
    # Files in the allocation's directory on its node, by path (``alloc/…``,
    # ``<task>/local/…``): what ``/v1/client/fs/cat`` reads (``clientapi``).
    files: dict[str, bytes] = {}
    create_index: int = 0
    modify_index: int = 0
    alloc_modify_index: int = 0
    create_time: int = 0
    modify_time: int = 0

    @property
    def client_terminal(self) -> bool:
        """ClientTerminalStatus: what docs/nomad-api.md §3.3 excludes from used capacity."""
        return self.client_status in CLIENT_TERMINAL

    @property
    def terminal(self) -> bool:
        return self.client_terminal or self.desired_status != "run"

    @property
    def index(self) -> int:
        return int(self.name.rsplit("[", 1)[1].rstrip("]"))


class Eval(msgspec.Struct, kw_only=True):
    id: str
    namespace: str
    priority: int
    type: str
    triggered_by: str
    job_id: str
    job_modify_index: int = 0
    node_id: str = ""
    deployment_id: str = ""
    status: str = "pending"
    status_description: str = ""
    previous_eval: str = ""
    next_eval: str = ""
    blocked_eval: str = ""
    failed_tg_allocs: dict[str, AllocMetric] | None = None
    queued_allocations: dict[str, int] | None = None
    class_eligibility: dict[str, bool] | None = None
    escaped_computed_class: bool = False
    snapshot_index: int = 0
    create_index: int = 0
    modify_index: int = 0
    create_time: int = 0
    modify_time: int = 0


class GroupDeployment(msgspec.Struct, kw_only=True):
    auto_revert: bool = False
    auto_promote: bool = False
    progress_deadline: int = 0
    require_progress_by: int = 0  # Unix ns on the fake's clock; 0 = not started
    desired_total: int = 0
    placed_allocs: int = 0
    healthy_allocs: int = 0
    unhealthy_allocs: int = 0


class Deployment(msgspec.Struct, kw_only=True):
    id: str
    namespace: str
    job_id: str
    job_version: int
    job_modify_index: int
    job_spec_modify_index: int
    job_create_index: int
    task_groups: dict[str, GroupDeployment]
    status: str = "running"
    status_description: str = DEPLOYMENT_RUNNING
    create_index: int = 0
    modify_index: int = 0
    create_time: int = 0
    modify_time: int = 0

    @property
    def active(self) -> bool:
        """Deployment.Active (nomad/structs/deployment.go)."""
        return self.status in ("running", "paused", "blocked", "unblocking", "initializing",
                               "pending")


class ServiceReg(msgspec.Struct, kw_only=True):
    id: str
    service_name: str
    namespace: str
    node_id: str
    datacenter: str
    job_id: str
    alloc_id: str
    tags: list[str]
    address: str
    port: int
    create_index: int = 0
    modify_index: int = 0


class CheckResult(msgspec.Struct, kw_only=True):
    """One entry of GET /v1/allocation/:id/checks (nomad/structs/checks.go)."""

    id: str
    check: str
    group: str
    mode: str
    service: str
    task: str = ""
    status: str = "pending"
    status_code: int = 0
    output: str = ""
    timestamp: int = 0


class JobRecord(msgspec.Struct, kw_only=True):
    """The current version of a job plus every earlier one, newest last."""

    namespace: str
    id: str
    spec: dict[str, Any]
    versions: list[dict[str, Any]]
    create_index: int
    modify_index: int
    job_modify_index: int
    scaling_events: dict[str, list[dict[str, Any]]] = {}
