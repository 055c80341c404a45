"""The shape of a model entry, written once for both places a model is defined.

A model declared under ``models:`` in server.yaml and a file given to
``llmgw ctl model add -f`` are decoded into these same structs by the same
decoder (``llmgw.catalog.decode``), and a stored runtime model is kept as the
JSON encoding of the same struct. So an entry moves between configuration and
the store by copy and paste, and a field cannot mean something in one and
nothing in the other.

Every struct forbids unknown fields: a misspelt key is an error naming its
path, never a default that silently applies. Values are frozen; a change is a
new value (``msgspec.structs.replace``).
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from llmgw.catalog.engines import DIALECTS, Capability, Dialect, Engine, dialect_of
from llmgw.catalog.rules import rule
from llmgw.catalog.source import Source
from llmgw.catalog.units import Duration, Size

# llmgw-<name> must be a valid Nomad job ID and service name, which Nomad
# limits to [a-z0-9-], at most 63 characters, starting and ending alphanumeric
# (docs/nomad-api.md §1.2, "Service.Name"). "llmgw-" takes six of the 63.
NAME_PATTERN = r"^[a-z](?:[a-z0-9-]{0,55}[a-z0-9])?$(?!\n)"
MAX_NAME = 57
MODEL_NAME = rule(NAME_PATTERN, "a model name: 1 to 57 lowercase letters, digits and '-', "
                                "starting with a letter and not ending with '-' (it becomes "
                                "the Nomad job and service name llmgw-<name>)")
ModelName = Annotated[str, MODEL_NAME]

RoutingPolicy = Literal["prefix-affinity", "least-outstanding", "round-robin"]


class _Spec(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True,
            omit_defaults=True):
    """Base for human-written structs."""


class Lora(_Spec, frozen=True):
    """A base model's LoRA adapter capacity, fixed when its engine starts.

    ``slots``: adapters on the GPU at once (vLLM's ``--max-loras``);
    ``max_rank``: the largest adapter rank it takes (``--max-lora-rank``);
    ``cpu_slots``: adapters kept in host memory besides (``--max-cpu-loras``).
    Left out, each takes the default ``llmgw.catalog.adapter`` argues for.
    """

    slots: int | None = None
    max_rank: int | None = None
    cpu_slots: int | None = None


class Profile(_Spec, frozen=True):
    """One way to run a model: the hardware it needs and how the engine is started.

    ``gpus`` is the count on one node and the tensor-parallel size; 0 is a CPU
    profile, which must declare ``memory`` and ``cpu_cores``. The first
    profile whose needs the fleet can meet is used.

    Where replicas go (the Nomad scheduler; the embedded one has one machine):
    replicas of a model with more than one are spread across nodes and share a
    node only when no other has room; ``distinct_hosts: true`` forbids sharing
    outright, so a replica with no node of its own waits for one instead. A CPU
    profile runs only on nodes without GPUs — their cores and memory are what
    the GPU replicas there need — unless ``gpu_nodes: true``.
    """

    name: str
    gpu_class: str | None = None
    gpus: int = 0
    fabric: str | None = None
    quantization: str | None = None
    context: int = 4096
    cpu_cores: int | None = None
    memory: Size | None = None
    engine_args: list[str] = []
    env: dict[str, str] = {}
    distinct_hosts: bool = False
    gpu_nodes: bool = False
    # This profile's adapter capacity, instead of the model's ``lora`` block.
    lora: Lora | None = None


class Scaling(_Spec, frozen=True):
    """How many replicas run.

    A model runs at least ``min`` replicas and at most ``max`` (which
    defaults to ``min``, and to 1 when ``min`` is 0). Between the two the
    gateway's scaler follows the load: it aims at ``target`` requests per
    ready replica (running or waiting at the engine, plus queued in the
    gateway), scales up at once, and scales down only when the load has
    stayed low for ``scale_down_delay``. A model with ``min`` 0 is on demand:
    the first request loads one replica, the scaler may add more up to
    ``max`` while it is up, and it is stopped again after ``idle_timeout``
    without requests. ``wait`` is how long a request for a stopped on-demand
    model is held while a replica loads.
    """

    min: int = 1
    max: int | None = None
    target: int = 16
    scale_down_delay: Duration = Duration(300, "5m")
    idle_timeout: Duration = Duration(900, "15m")
    wait: Duration = Duration(600, "10m")
    # Keep the weights on this many nodes beyond those running a replica, so the next
    # replica (a scale-up, a replacement) starts without downloading them (Nomad only).
    prefetch: int = 0


class RoutingSpec(_Spec, frozen=True):
    """How the gateway picks a replica of this model, and when it holds requests back.

    ``policy``: ``prefix-affinity`` sends requests that share a prompt prefix
    (a chat's system prompt and first turn, a completion prompt's first
    ``prefix_bytes``) to the same replica, whose prefix cache then skips most
    of their prefill. A new conversation opens on the replica with the
    shortest prefill queue; its later turns follow it there until that
    queue is a few requests longer than the shortest. A later turn the
    gateway process did not place goes to its prefix's home on a hash ring
    unless that replica's prefill queue is over ``load_factor`` times the
    mean, when it passes on to the next one on the ring.
    ``least-outstanding``: the replica with the fewest requests in flight.
    ``round-robin``: each replica in turn.

    A replica is *saturated* when its engine reports more than
    ``max_waiting`` requests waiting, or the gateway has ``max_concurrency``
    requests in flight on it. When every replica is saturated, requests wait
    in the gateway, ``interactive`` keys before ``batch`` keys, at most
    ``queue_size`` of them and at most ``queue_wait`` each; beyond either a
    request is answered 429 with Retry-After.

    ``engine_metrics``: scrape each replica's ``/metrics`` (queue and cache
    state); on by default where the engine publishes them (vLLM, SGLang,
    llama.cpp — scheduled, or external with ``engine`` set), off for an
    external model that speaks ``openai``.

    ``resume_streams``: how many times one streaming request that breaks
    after it started is continued on another replica (``llmgw.gateway.resume``
    says which requests can be); 0 turns resumption off for the model.
    """

    policy: RoutingPolicy = "prefix-affinity"
    load_factor: float = 1.25
    prefix_bytes: int = 2048
    max_concurrency: int | None = None
    max_waiting: int = 5
    queue_size: int = 100
    queue_wait: Duration = Duration(60, "1m")
    engine_metrics: bool | None = None
    resume_streams: int = 2


class Timeouts(_Spec, frozen=True):
    """Gateway timeouts towards this model's replicas.

    There is deliberately no fixed idle timeout on a stream before its first
    token: a long prompt on a busy engine can take minutes to produce one.
    ``first_byte`` bounds that wait and is generous by default; ``idle``
    bounds the gap between two chunks once streaming has begun.

    ``drain``: how long a replica leaving on purpose (scale-down, rollout,
    idle scale-to-zero, removal, a Nomad node drain) keeps serving the
    requests it has after it stops receiving new ones, before its engine is
    stopped.
    """

    connect: Duration = Duration(10, "10s")
    first_byte: Duration = Duration(600, "10m")
    idle: Duration = Duration(300, "5m")
    drain: Duration = Duration(30, "30s")


class UpstreamAuth(_Spec, frozen=True):
    """How the gateway authenticates to an external model's ``upstream``.

    The secret is the gateway's environment variable ``env`` (set where the
    gateway runs, like any other credential of its host), sent as
    ``header: prefix + value`` on every request to the upstream. The URL
    itself then carries no credential, so nothing that shows it (an error a
    tenant reads, ``ctl model show``, the admin page, logs, the ledger) can
    leak one; only the variable's name is stored and shown.
    """

    env: str
    header: str = "Authorization"
    prefix: str = "Bearer "


class HealthCheck(_Spec, frozen=True):
    """Active health probes of an external model's ``upstream`` replicas.

    Every ``interval`` the gateway asks each replica for ``path`` (vLLM and
    llama.cpp's server answer ``/health``), waiting at most ``timeout``. A
    replica that cannot be reached or answers 5xx gets no requests until a
    probe succeeds again; one that comes back (a restart) gets requests again
    at once, without waiting out an ejection its failed requests earned. Any
    other answer, 404 included, shows the server is up. ``path: null`` turns
    probing off. Scheduled models are health-checked by their scheduler.
    """

    path: str | None = "/health"
    interval: Duration = Duration(5, "5s")
    timeout: Duration = Duration(2, "2s")


class Model(_Spec, frozen=True):
    """A catalog entry.

    A scheduled model has ``source``, ``engine`` (``vllm`` or ``llama.cpp``)
    and ``profiles``. An external model has ``upstream`` instead: base URLs of
    OpenAI-compatible servers that llmgw routes to without scheduling
    anything; its ``engine`` (``vllm``, ``llama.cpp``, ``sglang`` or
    ``openai``, the default) names their dialect, which decides the defaults
    and behaviours a replica of that engine gets (``llmgw.catalog.engines``).

    ``capabilities`` lists what the replicas serve themselves; the gateway
    refuses other endpoints with 400 before any replica is asked, except
    ``/v1/responses`` on a model that has ``chat`` but not ``responses``,
    which the gateway translates to chat completions.
    """

    name: ModelName
    source: Source | None = None
    engine: Engine | None = None
    profiles: list[Profile] = []
    scaling: Scaling = Scaling()
    routing: RoutingSpec = RoutingSpec()
    fallbacks: list[ModelName] = []
    upstream: list[str] = []
    upstream_auth: UpstreamAuth | None = None
    served_name: str | None = None
    timeouts: Timeouts = Timeouts()
    health: HealthCheck = HealthCheck()
    # None: the engine's defaults (``llmgw.catalog.build.default_capabilities``),
    # filled in when the catalog is built.
    capabilities: list[Capability] | None = None
    description: str = ""
    # Serves LoRA adapters (``llmgw.catalog.adapter``): how many, of what rank.
    lora: Lora | None = None

    @property
    def external(self) -> bool:
        return bool(self.upstream)

    @property
    def engine_model_name(self) -> str:
        """The ``model`` value the engine expects in a request body."""
        return self.served_name or self.name

    @property
    def dialect(self) -> Engine:
        """The dialect the replicas speak (``llmgw.catalog.engines``): the engine, or
        ``openai`` for an external model that names none."""
        return dialect_of(self.engine, self.external)

    @property
    def speaks(self) -> Dialect:
        """What the replicas' server does beyond OpenAI's API (``llmgw.catalog.engines``)."""
        return DIALECTS[self.dialect]

    @property
    def scrapes_engine(self) -> bool:
        """Whether the gateway reads this model's replicas' ``/metrics``: by default when
        their engine publishes the figures it reads."""
        flag = self.routing.engine_metrics
        return self.speaks.metrics if flag is None else flag

    def profile(self, name: str) -> Profile | None:
        return next((p for p in self.profiles if p.name == name), None)


class GpuClass(_Spec, frozen=True):
    """A kind of card: the device model string its nodes report, and its memory.

    ``device`` is matched exactly against what the NVIDIA device plugin
    reports (the NVML name, spaces included). ``memory`` is what the card
    really reports (an "80GB" H100 reports 81559 MiB), so a constraint derived
    from it matches the cards it is meant to.
    """

    device: str
    memory: Size
    vendor: str = "nvidia"
    # What one card costs per hour, in any currency (reports only say "cost").
    price_per_hour: Annotated[float, msgspec.Meta(gt=0, le=1e6)] | None = None
