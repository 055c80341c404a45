"""What Nomad answers, as typed structs: the subset of each response llmgw reads.

Unlike the request structs in ``jobspec``, these are lenient on purpose.
Nomad encodes responses from its server structs with go-codec, which omits
zero-valued fields of allocations, evaluations and ports (docs/nomad-api.md,
"General wire conventions"), and adds fields between versions; so every field
has a default and unknown keys are ignored. A response that is not JSON of
the expected shape at all still fails to decode, and the client turns that
into an error naming the Nomad address.

Sections marked § are those of docs/nomad-api.md.
"""

from __future__ import annotations

import msgspec


class _R(msgspec.Struct, kw_only=True, frozen=True, gc=False):
    """Base: unknown fields ignored, every field defaulted.

    ``gc=False``: decoded answers are trees (no instance refers back to
    another), so the garbage collector need not track them. A fleet view
    decodes ~100,000 of these; tracked, the collections they trigger cost
    more than the decoding (bench/nomad_fleet.py).
    """


# ---- jobs -------------------------------------------------------------------

class TaskGroupSummary(_R, frozen=True):
    Queued: int = 0
    Complete: int = 0
    Failed: int = 0
    Running: int = 0
    Starting: int = 0
    Lost: int = 0
    Unknown: int = 0


class JobSummary(_R, frozen=True):
    JobID: str = ""
    Summary: dict[str, TaskGroupSummary] = {}


class JobListStub(_R, frozen=True):
    ID: str
    Name: str = ""
    Namespace: str = ""
    Type: str = ""
    Stop: bool = False
    Status: str = ""
    Meta: dict[str, str] | None = None
    JobSummary: JobSummary | None = None
    CreateIndex: int = 0
    ModifyIndex: int = 0
    JobModifyIndex: int = 0   # moves with every new job version (a /scale too)


class JobUILink(_R, frozen=True):
    Label: str = ""
    Url: str = ""   # the server struct's spelling; a request says URL (§1.9)


class JobUI(_R, frozen=True):
    Description: str = ""
    Links: list[JobUILink] | None = None


class JobVersion(_R, frozen=True):
    """The part of ``GET /v1/job/:id`` read to learn which version is current, and the
    ``ui`` block it shows (which the job list leaves out)."""

    ID: str = ""
    Version: int = 0
    JobModifyIndex: int = 0
    UI: JobUI | None = None


class DeploymentState(_R, frozen=True):
    ProgressDeadline: int = 0
    RequireProgressBy: str = ""
    DesiredTotal: int = 0
    PlacedAllocs: int = 0
    HealthyAllocs: int = 0
    UnhealthyAllocs: int = 0


class Deployment(_R, frozen=True):
    """``GET /v1/deployments`` (§5.2 item 5). ``JobSpecModifyIndex`` and ``JobCreateIndex``
    are the job's ``JobModifyIndex`` and ``CreateIndex`` when the deployment was made
    (nomad/structs/deployment.go ``NewDeployment``): equal to the job's now, it is the
    deployment of the job's current version."""

    ID: str
    JobID: str = ""
    JobVersion: int = 0
    JobSpecModifyIndex: int = 0
    JobCreateIndex: int = 0
    Status: str = ""
    StatusDescription: str = ""
    TaskGroups: dict[str, DeploymentState] | None = None
    CreateIndex: int = 0
    ModifyIndex: int = 0


class RegisterResponse(_R, frozen=True):
    EvalID: str = ""
    JobModifyIndex: int = 0
    Warnings: str = ""


class ValidateResponse(_R, frozen=True):
    DriverConfigValidated: bool = False
    ValidationErrors: list[str] | None = None
    Error: str = ""
    Warnings: str = ""


class AllocationMetric(_R, frozen=True):
    NodesEvaluated: int = 0
    NodesFiltered: int = 0
    NodesInPool: int = 0
    NodePool: str = ""
    NodesAvailable: dict[str, int] | None = None
    ClassFiltered: dict[str, int] | None = None
    ConstraintFiltered: dict[str, int] | None = None
    NodesExhausted: int = 0
    ClassExhausted: dict[str, int] | None = None
    DimensionExhausted: dict[str, int] | None = None
    QuotaExhausted: list[str] | None = None
    CoalescedFailures: int = 0


class PlanResponse(_R, frozen=True):
    JobModifyIndex: int = 0
    FailedTGAllocs: dict[str, AllocationMetric] | None = None
    Warnings: str = ""


class TaskGroupScaleStatus(_R, frozen=True):
    Desired: int = 0
    Placed: int = 0
    Running: int = 0
    Healthy: int = 0
    Unhealthy: int = 0


class JobScaleStatus(_R, frozen=True):
    JobID: str = ""
    JobModifyIndex: int = 0
    JobStopped: bool = False
    TaskGroups: dict[str, TaskGroupScaleStatus] = {}


class Evaluation(_R, frozen=True):
    ID: str
    Status: str = ""
    StatusDescription: str = ""
    TriggeredBy: str = ""
    JobID: str = ""
    JobModifyIndex: int = 0      # the job version's index the evaluation was made for
    BlockedEval: str = ""
    FailedTGAllocs: dict[str, AllocationMetric] | None = None
    QueuedAllocations: dict[str, int] | None = None
    CreateIndex: int = 0
    ModifyIndex: int = 0
    CreateTime: int = 0


class JobMeta(_R, frozen=True):
    """The part of a job that an allocation's copy is read for."""

    ID: str = ""
    Version: int = 0
    Meta: dict[str, str] | None = None


# ---- allocations ------------------------------------------------------------

class AllocatedCpu(_R, frozen=True):
    CpuShares: int = 0
    ReservedCores: list[int] | None = None


class AllocatedMemory(_R, frozen=True):
    MemoryMB: int = 0
    MemoryMaxMB: int = 0


class AllocatedDevice(_R, frozen=True):
    Vendor: str = ""
    Type: str = ""
    Name: str = ""
    DeviceIDs: list[str] | None = None


class AllocatedTaskResources(_R, frozen=True):
    Cpu: AllocatedCpu = AllocatedCpu()
    Memory: AllocatedMemory = AllocatedMemory()
    Devices: list[AllocatedDevice] | None = None


class TaskLifecycle(_R, frozen=True):
    Hook: str = ""
    Sidecar: bool = False


class PortMapping(_R, frozen=True):
    Label: str = ""
    Value: int = 0
    To: int = 0
    HostIP: str = ""


class AllocatedShared(_R, frozen=True):
    DiskMB: int = 0
    Ports: list[PortMapping] | None = None


class AllocatedResources(_R, frozen=True):
    Tasks: dict[str, AllocatedTaskResources] | None = None
    TaskLifecycles: dict[str, TaskLifecycle | None] | None = None
    Shared: AllocatedShared = AllocatedShared()


class TaskEvent(_R, frozen=True):
    Type: str = ""
    Time: int = 0
    DisplayMessage: str = ""
    # An exit result's (``Terminated``): also in Details as "exit_code"
    # (nomad/structs/structs.go ``SetExitCode``)
    ExitCode: int = 0
    Details: dict[str, str] | None = None


class TaskState(_R, frozen=True):
    State: str = ""
    Failed: bool = False
    Restarts: int = 0
    Events: list[TaskEvent] | None = None
    # RFC 3339; Go's zero time (year 1) until the task finished.
    FinishedAt: str = ""


class Allocation(_R, frozen=True):
    """An allocation stub (``/v1/job/:id/allocations``, ``/v1/allocations``) or the
    full allocation (``/v1/allocation/:id``, which adds ``Job``)."""

    ID: str
    Name: str = ""
    Namespace: str = ""
    NodeID: str = ""
    NodeName: str = ""
    JobID: str = ""
    JobVersion: int = 0
    TaskGroup: str = ""
    DesiredStatus: str = ""
    ClientStatus: str = ""
    ClientDescription: str = ""
    NextAllocation: str = ""
    TaskStates: dict[str, TaskState] | None = None
    AllocatedResources: AllocatedResources | None = None
    Job: JobMeta | None = None
    CreateIndex: int = 0
    ModifyIndex: int = 0
    CreateTime: int = 0       # Unix nanoseconds
    ModifyTime: int = 0


class CheckStatus(_R, frozen=True):
    """One entry of ``/v1/allocation/:id/checks`` (§4.4); ``Timestamp`` is Unix seconds."""

    ID: str = ""
    Check: str = ""
    Group: str = ""
    Mode: str = ""
    Output: str = ""
    Service: str = ""
    Task: str = ""
    Status: str = ""
    StatusCode: int = 0
    Timestamp: int = 0


class MemoryStats(_R, frozen=True):
    RSS: int = 0
    Cache: int = 0
    Swap: int = 0
    Usage: int = 0
    MaxUsage: int = 0
    Measured: list[str] | None = None


class ResourceUsage(_R, frozen=True):
    MemoryStats: MemoryStats | None = None


class AllocStats(_R, frozen=True):
    """``/v1/client/allocation/:id/stats``: the allocation's measured usage."""

    ResourceUsage: ResourceUsage | None = None
    Timestamp: int = 0


# ---- services ---------------------------------------------------------------

class ServiceRegistration(_R, frozen=True):
    ID: str = ""
    ServiceName: str = ""
    Namespace: str = ""
    NodeID: str = ""
    Datacenter: str = ""
    JobID: str = ""
    AllocID: str = ""
    Tags: list[str] | None = None
    Address: str = ""
    Port: int = 0
    CreateIndex: int = 0
    ModifyIndex: int = 0


class ServiceStub(_R, frozen=True):
    ServiceName: str = ""
    Tags: list[str] | None = None


class NamespacedServices(_R, frozen=True):
    Namespace: str = ""
    Services: list[ServiceStub] | None = None


# ---- nodes ------------------------------------------------------------------

class Attribute(_R, frozen=True):
    Int: int | None = None
    Float: float | None = None
    String: str | None = None
    Bool: bool | None = None
    Unit: str = ""


class NodeDevice(_R, frozen=True):
    ID: str = ""
    Healthy: bool = False


class NodeDeviceResource(_R, frozen=True):
    Vendor: str = ""
    Type: str = ""
    Name: str = ""
    Instances: list[NodeDevice] | None = None
    Attributes: dict[str, Attribute] | None = None


class NodeCpu(_R, frozen=True):
    CpuShares: int = 0
    TotalCpuCores: int = 0
    ReservableCpuCores: list[int] | None = None


class NodeMemory(_R, frozen=True):
    MemoryMB: int = 0


class NodeResources(_R, frozen=True):
    Cpu: NodeCpu = NodeCpu()
    Memory: NodeMemory = NodeMemory()
    Devices: list[NodeDeviceResource] | None = None


class ReservedCpu(_R, frozen=True):
    CpuShares: int = 0
    ReservedCpuCores: list[int] | None = None


class ReservedResources(_R, frozen=True):
    Cpu: ReservedCpu = ReservedCpu()
    Memory: NodeMemory = NodeMemory()


class HostVolume(_R, frozen=True):
    Path: str = ""
    ReadOnly: bool = False


class DriverInfo(_R, frozen=True):
    """A task driver as the node fingerprinted it (nomad/structs/node.go ``DriverInfo``)."""

    Detected: bool = False
    Healthy: bool = False
    HealthDescription: str = ""


class Node(_R, frozen=True):
    """A node stub (``/v1/nodes?resources=true``) or a full node (``/v1/node/:id``,
    which adds ``Meta``)."""

    ID: str
    Name: str = ""
    Datacenter: str = ""
    NodeClass: str = ""
    NodePool: str = ""
    Status: str = ""
    SchedulingEligibility: str = ""
    Drain: bool = False
    Meta: dict[str, str] | None = None
    NodeResources: NodeResources | None = None
    ReservedResources: ReservedResources | None = None
    HostVolumes: dict[str, HostVolume] | None = None
    Drivers: dict[str, DriverInfo] | None = None
    ModifyIndex: int = 0


class NodeMetaResponse(_R, frozen=True):
    """``/v1/client/metadata``: the merged metadata and the dynamic part of it."""

    Meta: dict[str, str] | None = None
    Dynamic: dict[str, str | None] | None = None


# ---- ACL (§7; nomad/structs/acl.go) -----------------------------------------

class AclToken(_R, frozen=True):
    """``GET /v1/acl/token/self``: ``Type`` is ``client`` or ``management``; with ACLs
    off, Nomad's ``acls-disabled`` token (AccessorID ``acls-disabled``)."""

    AccessorID: str = ""
    Name: str = ""
    Type: str = ""
    Policies: list[str] | None = None
    Roles: list[dict[str, str]] | None = None


class PathRule(_R, frozen=True):
    PathSpec: str = ""
    Capabilities: list[str] | None = None


class VariablesRules(_R, frozen=True):
    Paths: list[PathRule] | None = None


class NamespaceRule(_R, frozen=True):
    Name: str = ""
    Policy: str = ""
    Capabilities: list[str] | None = None
    Variables: VariablesRules | None = None


class HostVolumeRule(_R, frozen=True):
    Name: str = ""
    Policy: str = ""
    Capabilities: list[str] | None = None


class LevelRule(_R, frozen=True):
    Policy: str = ""


class PolicyRules(_R, frozen=True):
    """acl.Policy as ``RulesJSON`` carries it: shorthand policies already expanded."""

    Namespaces: list[NamespaceRule] | None = None
    HostVolumes: list[HostVolumeRule] | None = None
    Node: LevelRule | None = None


class AclPolicy(_R, frozen=True):
    """``GET /v1/acl/policy/:name``; ``RulesJSON`` is the server's parse of ``Rules``."""

    Name: str = ""
    Rules: str = ""
    RulesJSON: PolicyRules | None = None
    JobACL: dict[str, str] | None = None
