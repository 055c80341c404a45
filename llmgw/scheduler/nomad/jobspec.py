"""The Nomad job payload llmgw sends, as typed structs with Nomad's own field names.

Field names are the Go field names of ``api.Job`` and friends (docs/nomad-api.md,
"General wire conventions"), so the encoded JSON is exactly what
``PUT /v1/jobs`` decodes. Only the fields llmgw sets exist here. That is a
guard as much as a convenience: Nomad silently drops a key it does not know
and applies the default, so a misspelt field in a dict would surface as a job
that runs with 300 MB of memory; a misspelt attribute here is a type error.

Every struct omits the fields left at ``None`` (or empty), so what is not
stated falls to Nomad's documented default (§1.2) rather than to a value
copied here that could drift from it. The one default we must never let
Nomad fill is ``CPU``: it adds ``CPU: 100`` only when neither ``CPU`` nor
``Cores`` is set, and both set is a validation error (§1.3), so ``Resources``
refuses to hold both.

Durations are ``int`` nanoseconds (§"General wire conventions"); use ``ns()``.

Sections marked § are those of docs/nomad-api.md.
"""

from __future__ import annotations

from typing import Any

import msgspec

NS_PER_SECOND = 1_000_000_000


def ns(seconds: float) -> int:
    """A duration in the integer nanoseconds Nomad's JSON expects."""
    return round(seconds * NS_PER_SECOND)


class _Wire(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Base: encoded with Go field names; unset fields are left out."""


class Constraint(_Wire, frozen=True, kw_only=True):
    LTarget: str = ""   # distinct_hosts has none
    Operand: str  # no JSON default: Nomad refuses a constraint without one (§1.2)
    RTarget: str = ""


class Affinity(_Wire, frozen=True):
    """Prefer nodes that meet the condition; ``Weight`` in [-100, 100], never 0 (§1.2)."""

    LTarget: str
    Operand: str
    RTarget: str
    Weight: int


class Spread(_Wire, frozen=True):
    """Prefer placements that even out ``Attribute``'s values (no targets: even spread)."""

    Attribute: str
    Weight: int


class RequestedDevice(_Wire, frozen=True):
    Name: str
    Count: int
    Constraints: list[Constraint] = []


class Resources(_Wire, frozen=True):
    """A task's reservation. ``Cores`` (whole exclusive cores) or ``CPU`` (MHz), never both."""

    Cores: int | None = None
    CPU: int | None = None
    MemoryMB: int | None = None
    Devices: list[RequestedDevice] = []

    def __post_init__(self) -> None:
        if self.Cores and self.CPU:
            raise ValueError(
                "a Nomad task can reserve Cores or CPU, not both "
                "(Nomad: Task can only ask for 'cpu' or 'cores' resource, not both.)"
            )


class Port(_Wire, frozen=True):
    Label: str
    To: int | None = None


class NetworkResource(_Wire, frozen=True):
    Mode: str
    DynamicPorts: list[Port] = []


class CheckRestart(_Wire, frozen=True):
    Limit: int
    Grace: int
    IgnoreWarnings: bool = False


class ServiceCheck(_Wire, frozen=True):
    Name: str
    Type: str
    Path: str
    Interval: int
    Timeout: int
    Method: str | None = None
    CheckRestart: CheckRestart | None = None


class Service(_Wire, frozen=True):
    Name: str
    Provider: str  # required in practice: the default is "consul" (§1.5, surprise 1)
    PortLabel: str
    Tags: list[str] = []
    Checks: list[ServiceCheck] = []


class UpdateStrategy(_Wire, frozen=True):
    MaxParallel: int
    HealthCheck: str
    MinHealthyTime: int
    HealthyDeadline: int
    ProgressDeadline: int
    AutoRevert: bool
    Canary: int = 0
    Stagger: int | None = None


class MigrateStrategy(_Wire, frozen=True):
    MaxParallel: int
    HealthCheck: str
    MinHealthyTime: int
    HealthyDeadline: int


class RestartPolicy(_Wire, frozen=True):
    Attempts: int
    Interval: int
    Delay: int
    Mode: str


class ReschedulePolicy(_Wire, frozen=True):
    Unlimited: bool
    Delay: int
    DelayFunction: str
    MaxDelay: int
    Attempts: int | None = None
    Interval: int | None = None


class VolumeRequest(_Wire, frozen=True):
    """A group's claim on a node's host volume (``client { host_volume ... }``)."""

    Name: str
    Type: str
    Source: str
    ReadOnly: bool


class VolumeMount(_Wire, frozen=True):
    Volume: str
    Destination: str
    ReadOnly: bool


class TaskLifecycle(_Wire, frozen=True):
    Hook: str
    Sidecar: bool


class Template(_Wire, frozen=True):
    EmbeddedTmpl: str
    DestPath: str
    ChangeMode: str | None = None
    Envvars: bool = False


class Task(_Wire, frozen=True, kw_only=True):
    Name: str
    Driver: str
    User: str = ""   # the Docker driver's `--user`; "" leaves the image's USER
    Config: dict[str, Any]
    Env: dict[str, str] = {}
    Services: list[Service] = []
    Templates: list[Template] = []
    Resources: Resources | None = None
    Lifecycle: TaskLifecycle | None = None
    VolumeMounts: list[VolumeMount] = []
    KillTimeout: int | None = None
    ShutdownDelay: int | None = None


class TaskGroup(_Wire, frozen=True):
    Name: str
    Count: int
    Constraints: list[Constraint] = []
    Affinities: list[Affinity] = []
    Spreads: list[Spread] = []
    Networks: list[NetworkResource] = []
    Services: list[Service] = []
    Volumes: dict[str, VolumeRequest] = {}
    Tasks: list[Task] = []
    Update: UpdateStrategy | None = None
    Migrate: MigrateStrategy | None = None
    RestartPolicy: RestartPolicy | None = None
    ReschedulePolicy: ReschedulePolicy | None = None


class JobUILink(_Wire, frozen=True):
    """A link on the job's page in the Nomad UI. ``URL`` in the request; the server
    keeps it as ``Url`` and answers with that spelling (§1.9)."""

    Label: str
    URL: str


class JobUIConfig(_Wire, frozen=True):
    """The job's ``ui`` block: a description (at most 1,000 bytes) and links (§1.9)."""

    Description: str = ""
    Links: list[JobUILink] = []


class Job(_Wire, frozen=True):
    ID: str
    Name: str
    Type: str
    Namespace: str | None = None
    Region: str | None = None
    Datacenters: list[str] = []
    NodePool: str | None = None
    Meta: dict[str, str] = {}
    UI: JobUIConfig | None = None
    TaskGroups: list[TaskGroup] = []


class JobRegisterRequest(_Wire, frozen=True):
    """``EnforceIndex`` with ``JobModifyIndex``: register only if the job is still at
    that index (a check-and-set, §1.1)."""

    Job: Job
    EnforceIndex: bool = False
    JobModifyIndex: int = 0


class JobPlanRequest(_Wire, frozen=True):
    Job: Job
    Diff: bool = False


class JobValidateRequest(_Wire, frozen=True):
    Job: Job


class ScalingRequest(_Wire, frozen=True):
    """``POST /v1/job/:id/scale`` (§5.3). ``Error`` is a bool on the wire, not a string."""

    Count: int
    Target: dict[str, str]
    Message: str = ""


_encoder = msgspec.json.Encoder()


def encode(value: _Wire) -> bytes:
    """The JSON body Nomad's HTTP API decodes."""
    return _encoder.encode(value)


def to_builtins(value: _Wire) -> Any:
    """Plain dicts and lists with Go field names (for python-nomad's ``json=`` and for printing)."""
    return msgspec.to_builtins(value)
