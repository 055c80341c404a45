"""The server's configuration file (server.yaml, C0) and its environment overrides.

Loaded and validated completely before the server binds its port (STYLE 10):
a wrong key is an error naming the file and the key path, never a default that
silently applies. The declared models are validated as a catalog here too, so
a server with a broken ``models:`` list does not start.

Every range and cross-field check of the file lives here (and in
``build_catalog`` for the models): what the schedulers and the gateway are
built from is already valid, so their constructors check nothing.

Environment variables override connection settings only (``LLMGW_DATABASE_URL``,
``LLMGW_LISTEN``, ``LLMGW_ADMIN_TOKENS``, ``NOMAD_ADDR``, ``NOMAD_TOKEN``,
``NOMAD_NAMESPACE``, ``NOMAD_REGION``, ``NOMAD_CACERT``, ``NOMAD_CLIENT_CERT``,
``NOMAD_CLIENT_KEY``, ``LLMGW_HF_TOKEN``), so that secrets need not live in the file.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

import msgspec

from llmgw.catalog.adapter import Adapter
from llmgw.catalog.build import Runtime, build_catalog
from llmgw.catalog.decode import decode_yaml
from llmgw.catalog.model import GpuClass, Model
from llmgw.catalog.units import Duration, Size
from llmgw.errors import ConfigError, DefinitionError
from llmgw.redact import redact_url

GiB = 1024**3
MiB = 1024**2
GiB = 1024**3


class _Conf(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    pass


class NomadConfig(_Conf, frozen=True):
    """Connection to a Nomad cluster and how jobs are rendered for it."""

    address: str = "http://127.0.0.1:4646"
    token: str | None = None
    namespace: str = "default"
    region: str | None = None
    ca_cert: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    tls_skip_verify: bool = False
    datacenters: list[str] = msgspec.field(default_factory=lambda: ["*"])
    node_pool: str | None = None
    # Engine images and the node-local cache the prestart fetcher fills.
    vllm_image: str = "vllm/vllm-openai:v0.8.5"
    llama_cpp_image: str = "ghcr.io/ggml-org/llama.cpp:server"
    fetcher_image: str = "ghcr.io/llmgw/llmgw:0.1.0"
    cache_volume: str = "llmgw-model-cache"
    # The uid (or uid:gid) the fetch and sweep tasks run as, declared on each task: the
    # cache volume's host directory must be owned by it, since Nomad never creates or
    # chowns a host volume's path (README "Nomad mode"; render.fetch_task argues it).
    fetch_user: str = "10001"
    fabric_meta_key: str = "llmgw_fabric"
    # The Hugging Face token vLLM downloads gated hf:// models with when there is no
    # mirror; handed to jobs through Nomad Variables, never in the job itself.
    hf_token: str | None = None
    timeout: float = 10.0
    # Reserved by a GPU profile that leaves cpu_cores or memory out, per GPU:
    # Nomad's own defaults (100 MHz, 300 MB) get an engine killed as it loads.
    cores_per_gpu: int = 4
    memory_per_gpu: Size = Size(32 * GiB, "32GiB")
    # The least each job's deployment deadlines are: a model whose weights take
    # longer to pull, fetch and load gets more (render.deadlines sizes them).
    # Nomad's defaults (5m, 10m) fail the deployment of a large model.
    healthy_deadline: Duration = Duration(3600, "1h")
    progress_deadline: Duration = Duration(7200, "2h")
    # How long the Docker driver may pull an engine image; its own default (5m)
    # fails a first pull of vLLM's ~10 GB image on an ordinary link.
    image_pull_timeout: Duration = Duration(1800, "30m")
    # What one replica fetches per second from the mirror (or the Hub), used to
    # size the deadlines of a model from the bytes it has to download.
    download_rate: Size = Size(100 * MiB, "100MiB")
    # The most each node's weight cache may hold: a sweep evicts least-recently-used
    # weights no running or starting replica uses beyond it. None: never evict.
    cache_max: Size | None = None
    # How often the cache of every node is swept (and its metadata checked against it).
    cache_sweep: Duration = Duration(900, "15m")


class LocalConfig(_Conf, frozen=True):
    """The embedded scheduler: child processes on this machine."""

    cpu_cores: int | None = None     # defaults to the machine's
    memory: Size | None = None       # defaults to the machine's
    # The engines' ports. One another program listens on, or another llmgw of this user
    # holds (each is claimed with a lock file under ``<tmp>/llmgw-ports-<uid>``), is skipped.
    port_range: tuple[int, int] = (28000, 28999)
    # Where the embedded scheduler keeps what outlives a restart: its replicas'
    # holdings of cards and cores, for costs (``scheduler.local.journal``). None: kept in
    # memory only, so an unclean stop loses what they held since the meter's last pass.
    state_dir: str | None = None
    # The Python that runs the engines (it needs llama-cpp-python, or vLLM);
    # defaults to the one running llmgw.
    python: str | None = None
    # SIGTERM, then SIGKILL after this long, when a replica is stopped.
    stop_grace: Duration = Duration(10, "10s")
    # How long a starting engine may take to answer its health check (a
    # large model loading from a slow disk) before it is restarted.
    start_timeout: Duration = Duration(1800, "30m")


class SchedulerConfig(_Conf, frozen=True):
    kind: Literal["local", "nomad"] = "local"
    nomad: NomadConfig = NomadConfig()
    local: LocalConfig = LocalConfig()


class GatewayConfig(_Conf, frozen=True):
    max_body_size: Size = Size(16 * 1024**2, "16MiB")
    # What one connection may cost before a request reaches llmgw (llmgw.connection):
    # the largest header line and request head (431 beyond them), how long a
    # client may take to send its head, pause its body, or keep an idle
    # connection, and how many connections may be open (503 beyond it).
    max_header_size: Size = Size(16 * 1024, "16KiB")
    max_head_size: Size = Size(64 * 1024, "64KiB")
    head_timeout: Duration = Duration(10, "10s")
    body_timeout: Duration = Duration(30, "30s")
    keepalive_timeout: Duration = Duration(5, "5s")
    max_connections: int = 4096
    # Open connections from one client address whose caller has not authenticated (an
    # API key or admin token); a new one past it is answered 503 and closed.
    max_unauthenticated_per_client: int = 256
    # From a request's head to the last byte of its body, whatever its pace.
    body_deadline: Duration = Duration(600, "10m")
    # How long a failed replica is kept out of rotation before it is retried.
    eject_for: Duration = Duration(10, "10s")
    # Each further failure after it comes back doubles that, up to this.
    eject_max: Duration = Duration(120, "2m")
    # Replicas of one model tried for a request before moving to its fallbacks.
    max_attempts: int = 3
    # How often a gateway records that an on-demand model is in use (store writes).
    activity_interval: Duration = Duration(5, "5s")
    # How often the keys file is checked for changes.
    keys_check_interval: Duration = Duration(1, "1s")
    # How long a stored Response can be retrieved or continued (previous_response_id).
    responses_retention: Duration = Duration(86400, "24h")
    # Largest audio upload (/v1/audio/transcriptions, /translations), spooled to disk.
    max_upload_size: Size = Size(25 * 1024**2, "25MiB")
    # Largest file for /v1/files (a batch's input), kept in the store.
    max_file_size: Size = Size(200 * 1024**2, "200MiB")
    # Lines of batches in flight at once (across all batches, on the one worker).
    batch_concurrency: int = 4
    # How often each replica's engine /metrics is read, and how long one read may take.
    signal_interval: Duration = Duration(1, "1s")
    signal_timeout: Duration = Duration(0.5, "500ms")
    # How often the scaler publishes this gateway's load and (holding its lease) decides.
    scale_interval: Duration = Duration(2, "2s")
    # A streaming request held for a replica (admission queue, on-demand start) gets an
    # SSE comment this often, so proxies and clients do not time it out; 0: never.
    keepalive_interval: Duration = Duration(5, "5s")
    # How long a request for a LoRA adapter is held while the adapter loads into a replica
    # (or waits for an adapter slot to free); beyond it, 503.
    adapter_load_wait: Duration = Duration(120, "2m")
    # The usage ledger: one record per request, written to the store in batches.
    ledger: bool = True
    # How often the ledger's buffer is written (also the lag of token budgets).
    ledger_interval: Duration = Duration(1, "1s")
    # ... and how often while records of a key or team with a token budget wait.
    budget_interval: Duration = Duration(0.2, "200ms")
    # How long the store keeps a gateway's slice of a token budget without a renewal:
    # what a gateway that died gives back after, and how long one cut off from the store
    # serves from its slice before the budget's when_store_down applies.
    budget_lease_ttl: Duration = Duration(30, "30s")
    # Records held in memory while the store is unreachable; beyond it, with a journal,
    # the newer ones wait on disk only; without one, the oldest are dropped.
    ledger_buffer: int = 100_000
    # Each gateway process journals its usage records (and batch lines' answers) on local
    # disk before the store has them (``gateway.journal``), so a killed process or a store
    # outage of any length loses none: replayed at the next start. Off: they wait in
    # memory only, and a SIGKILL loses what the store did not have yet.
    journal: bool = True
    # Where. None: the store's directory on this host (``Store.state_dir``): beside a
    # SQLite file (``llmgw.db.d/journal``), else ``$XDG_STATE_HOME/llmgw/<digest of the
    # database URL>/journal``. Give a directory of its own where that is not kept.
    journal_dir: str | None = None
    # The most the journal may hold on disk; a record past it is dropped (and counted).
    journal_max: Size = Size(1024**3, "1GiB")
    # How long raw records are kept (the hourly roll-ups are kept for good).
    usage_retention: Duration = Duration(90 * 86400, "90d")


class CostsConfig(_Conf, frozen=True):
    # What one CPU core reserved by a CPU model costs per hour (GPU cards:
    # gpu_classes.<name>.price_per_hour).
    cpu_core_per_hour: Annotated[float, msgspec.Meta(gt=0, le=1e6)] | None = None
    # The account that carries GPU (and CPU) time no request used.
    overhead_account: str = "overhead"
    # How often the scheduler's holdings (each replica's cards and cores, from
    # reservation to release) are recorded (one process, by lease).
    meter_interval: Duration = Duration(60, "1m")


class MetricsConfig(_Conf, frozen=True):
    # Whether /metrics and the OpenAPI document (/api/docs) answer without an
    # admin token. On by default: Prometheus scrapes without credentials, and
    # neither shows a secret; turn it off where the port is reachable by
    # people who should not see the catalog's names and traffic.
    public: bool = True


class AdminToken(_Conf, frozen=True):
    name: str
    token: str


class SourceCheckConfig(_Conf, frozen=True):
    """Where the source check may go (``llmgw.weights.reach``): beside the mirror and
    public addresses, the hosts and networks named here; never those denied; and on a
    server listening beyond loopback, local paths under ``local_roots`` only."""

    allow_hosts: list[str] = []
    deny_hosts: list[str] = []
    local_roots: list[str] = []


class ServerConfig(_Conf, frozen=True):
    listen: str = "127.0.0.1:8080"
    database: str = "sqlite:///llmgw.db"
    scheduler: SchedulerConfig = SchedulerConfig()
    gpu_classes: dict[str, GpuClass] = {}
    mirror: str | None = None
    keys_file: str | None = None
    admin_tokens: list[AdminToken | str] = []
    gateway: GatewayConfig = GatewayConfig()
    metrics: MetricsConfig = MetricsConfig()
    costs: CostsConfig = CostsConfig()
    source_check: SourceCheckConfig = SourceCheckConfig()
    # Where people reach this server (its admin site), as a browser would: each Nomad
    # job's UI block links to the model's page under it. None: no such link.
    public_url: str | None = None
    # A dashboard for one model, linked from each job's UI block; ``{model}`` is
    # replaced with the model's name (e.g. a Grafana URL with ``var-model={model}``).
    dashboard_url: str | None = None
    models: list[Model] = []
    # LoRA adapters served on the models above (``llmgw.catalog.adapter``).
    adapters: list[Adapter] = []

    @property
    def runtime(self) -> Runtime:
        """What the catalog's validity depends on in this configuration."""
        return Runtime(scheduler=self.scheduler.kind, mirror=self.mirror)

    def admin_token_names(self) -> dict[str, str]:
        """Token → the identity recorded for changes made with it."""
        out: dict[str, str] = {}
        for i, t in enumerate(self.admin_tokens):
            if isinstance(t, AdminToken):
                out[t.token] = t.name
            else:
                out[t] = "admin" if len(self.admin_tokens) == 1 else f"admin-{i}"
        return out


_TOKEN_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")
# An admin token opens every change to the catalog; a short one is guessable.
MIN_TOKEN_LENGTH = 8


def _check_tokens(cfg: ServerConfig, source: str) -> None:
    for token, name in cfg.admin_token_names().items():
        if len(token) < MIN_TOKEN_LENGTH:
            raise ConfigError(
                f"{source}: admin token {name!r} is {len(token)} characters long; use at least "
                f"{MIN_TOKEN_LENGTH} (e.g. the output of `openssl rand -base64 32`)",
                field="admin_tokens")


def _env_overrides(cfg: ServerConfig, env: Mapping[str, str]) -> ServerConfig:
    replace = msgspec.structs.replace
    if url := env.get("LLMGW_DATABASE_URL"):
        cfg = replace(cfg, database=url)
    if listen := env.get("LLMGW_LISTEN"):
        cfg = replace(cfg, listen=listen)
    if tokens := env.get("LLMGW_ADMIN_TOKENS"):
        parsed: list[AdminToken | str] = []
        for item in filter(None, (t.strip() for t in tokens.split(","))):
            # NAME=TOKEN only when NAME is a plain identifier and something
            # other than base64 padding follows: a bare base64 token ends in
            # "=", and splitting it there would make its secret the (logged)
            # name and its padding the token.
            name, sep, token = item.partition("=")
            if sep and _TOKEN_NAME.match(name) and token.strip("="):
                parsed.append(AdminToken(name=name, token=token))
            else:
                parsed.append(item)
        cfg = replace(cfg, admin_tokens=[*cfg.admin_tokens, *parsed])
    nomad = cfg.scheduler.nomad
    mapping = {
        "NOMAD_ADDR": "address", "NOMAD_TOKEN": "token", "NOMAD_NAMESPACE": "namespace",
        "NOMAD_REGION": "region", "NOMAD_CACERT": "ca_cert",
        "NOMAD_CLIENT_CERT": "client_cert", "NOMAD_CLIENT_KEY": "client_key",
        "LLMGW_HF_TOKEN": "hf_token",
    }
    changes = {attr: env[var] for var, attr in mapping.items() if env.get(var)}
    if changes:
        cfg = replace(cfg, scheduler=replace(cfg.scheduler, nomad=replace(nomad, **changes)))
    return cfg


def split_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` as (host, port); ConfigError when it is not one."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"listen: {listen!r} is not HOST:PORT (e.g. 127.0.0.1:8080)",
                          field="listen")
    return host.strip("[]") or "0.0.0.0", int(port)


# Nomad refuses a job unless MinHealthyTime < HealthyDeadline < ProgressDeadline,
# and llmgw's jobs wait this long healthy before a replica counts as placed.
MIN_HEALTHY_TIME = 30.0


def _check_nomad_tls(scheduler: SchedulerConfig) -> None:
    """The TLS settings llmgw connects to Nomad with can work together.

    Each refusal here is a setting the client would otherwise drop or ignore
    without a word, and Nomad would then refuse every call: servers with
    ``verify_https_client`` accept no caller without a certificate from their CA
    (helper/tlsutil/config.go ``IncomingTLSConfig``: RequireAndVerifyClientCert).
    Checked only where the connection is made: NOMAD_* variables exported for an
    operator's CLI must not stop a server that schedules locally.
    """
    if scheduler.kind != "nomad":
        return
    cfg = scheduler.nomad
    pairs = (("client_cert", "NOMAD_CLIENT_CERT"), ("client_key", "NOMAD_CLIENT_KEY"))
    (have, have_var), (lack, lack_var) = pairs if cfg.client_cert else pairs[::-1]
    if bool(cfg.client_cert) != bool(cfg.client_key):
        raise ConfigError(
            f"scheduler.nomad.{have} (or {have_var}) is set but scheduler.nomad.{lack} (or "
            f"{lack_var}) is not; a client certificate is presented with its key or not at "
            "all, so set both (e.g. the pair `nomad tls cert create -cli` writes) or neither",
            field=f"scheduler.nomad.{lack}")
    set_ = [k for k in ("ca_cert", "client_cert", "client_key") if getattr(cfg, k)]
    if set_ and urlsplit(cfg.address).scheme != "https":
        raise ConfigError(
            f"scheduler.nomad.address is {cfg.address} but {', '.join(set_)} "
            f"{'is' if len(set_) == 1 else 'are'} set, which only an https:// address uses; a "
            "Nomad with `tls { http = true }` answers https only, so write "
            f"https://{urlsplit(cfg.address).netloc}", field="scheduler.nomad.address")
    if cfg.tls_skip_verify and cfg.ca_cert:
        raise ConfigError(
            "scheduler.nomad.tls_skip_verify is true beside ca_cert: the CA is there to verify "
            "the servers' certificate and skipping verification ignores it; drop "
            "tls_skip_verify", field="scheduler.nomad.tls_skip_verify")


def _check_nomad(cfg: NomadConfig) -> None:
    if cfg.memory_per_gpu <= 0:
        raise ConfigError("scheduler.nomad.memory_per_gpu: must be more than 0",
                          field="scheduler.nomad.memory_per_gpu")
    if cfg.cores_per_gpu < 1:
        raise ConfigError("scheduler.nomad.cores_per_gpu: must be at least 1",
                          field="scheduler.nomad.cores_per_gpu")
    if not MIN_HEALTHY_TIME < cfg.healthy_deadline < cfg.progress_deadline:
        raise ConfigError(
            f"scheduler.nomad.healthy_deadline ({cfg.healthy_deadline}) must be longer than "
            f"{MIN_HEALTHY_TIME:.0f}s and shorter than progress_deadline "
            f"({cfg.progress_deadline}); Nomad refuses the job otherwise",
            field="scheduler.nomad.healthy_deadline",
        )
    if cfg.timeout <= 0:
        raise ConfigError("scheduler.nomad.timeout: must be more than 0 seconds",
                          field="scheduler.nomad.timeout")
    if cfg.image_pull_timeout < 1:
        raise ConfigError("scheduler.nomad.image_pull_timeout: must be at least 1s (the "
                          "Docker driver's pull gives up after it)",
                          field="scheduler.nomad.image_pull_timeout")
    if cfg.download_rate < MiB:
        raise ConfigError(
            f"scheduler.nomad.download_rate: {cfg.download_rate.text} per second is less "
            "than 1MiB; write what a node fetches from the mirror per second, e.g. 100MiB",
            field="scheduler.nomad.download_rate")
    if cfg.cache_max is not None and cfg.cache_max < GiB:
        raise ConfigError(
            f"scheduler.nomad.cache_max: {cfg.cache_max.text} is less than 1GiB, smaller than "
            "the weights of any model worth caching; write the bytes a node's cache volume "
            "may hold, e.g. 2TiB, or leave it out to never evict",
            field="scheduler.nomad.cache_max")
    if cfg.cache_sweep < 60:
        raise ConfigError(
            f"scheduler.nomad.cache_sweep: {cfg.cache_sweep.text} is shorter than a minute; "
            "each sweep submits a job to every node, so write e.g. 15m",
            field="scheduler.nomad.cache_sweep")


def _check_local(cfg: LocalConfig) -> None:
    low, high = cfg.port_range
    if not 1024 <= low <= high <= 65535:
        raise ConfigError(
            f"scheduler.local.port_range: {list(cfg.port_range)} is not a range of "
            "unprivileged ports [low, high] with 1024 <= low <= high <= 65535",
            field="scheduler.local.port_range")
    if cfg.cpu_cores is not None and cfg.cpu_cores < 1:
        raise ConfigError("scheduler.local.cpu_cores: must be at least 1",
                          field="scheduler.local.cpu_cores")
    if cfg.memory is not None and cfg.memory <= 0:
        raise ConfigError("scheduler.local.memory: must be more than 0",
                          field="scheduler.local.memory")


def _check_gateway(cfg: GatewayConfig) -> None:
    for key in ("max_body_size", "max_header_size", "max_head_size", "head_timeout",
                "body_timeout", "keepalive_timeout", "eject_for", "activity_interval",
                "keys_check_interval", "responses_retention", "max_upload_size", "max_file_size",
                "signal_interval", "signal_timeout", "scale_interval", "ledger_interval",
                "budget_interval", "budget_lease_ttl", "ledger_buffer", "usage_retention",
                "adapter_load_wait", "body_deadline", "max_unauthenticated_per_client",
                "journal_max"):
        if getattr(cfg, key) <= 0:
            raise ConfigError(f"gateway.{key}: must be more than 0", field=f"gateway.{key}")
    if cfg.budget_lease_ttl < 3 * cfg.budget_interval:
        raise ConfigError(
            f"gateway.budget_lease_ttl ({cfg.budget_lease_ttl}) is under three "
            f"budget_interval ({cfg.budget_interval}): a slice would lapse between two "
            "renewals; make it at least three times as long", field="gateway.budget_lease_ttl")
    if cfg.eject_max < cfg.eject_for:
        raise ConfigError(
            f"gateway.eject_max ({cfg.eject_max}) is shorter than gateway.eject_for "
            f"({cfg.eject_for}); a repeated failure would be ejected for less than the first",
            field="gateway.eject_max")
    if cfg.max_head_size < cfg.max_header_size:
        raise ConfigError(
            f"gateway.max_head_size ({cfg.max_head_size.text}) is smaller than "
            f"gateway.max_header_size ({cfg.max_header_size.text}); a head holds its header "
            "lines, so make it at least as large", field="gateway.max_head_size")
    if cfg.max_connections < 1:
        raise ConfigError("gateway.max_connections: must be at least 1",
                          field="gateway.max_connections")
    if cfg.max_attempts < 1:
        raise ConfigError("gateway.max_attempts: must be at least 1 (one try per request)",
                          field="gateway.max_attempts")
    if cfg.batch_concurrency < 1:
        raise ConfigError("gateway.batch_concurrency: must be at least 1, or batches never "
                          "run", field="gateway.batch_concurrency")


_PLACEHOLDER = re.compile(r"\{[^{}]*\}")


def _check_link(value: str, key: str, *, placeholders: bool = False) -> None:
    """A URL every reader of a Nomad job may follow: http(s), a host, no credentials."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{key}: {value!r} is not an http(s) URL with a host, e.g. "
                          "https://llmgw.example.com", field=key)
    if parts.username is not None or parts.password is not None:
        raise ConfigError(f"{key}: {redact_url(value)!r} carries credentials; every Nomad "
                          "job and everyone who can read one would see them, so give the URL "
                          "without user:password@", field=key)
    if not placeholders:
        if parts.query or parts.fragment:
            raise ConfigError(f"{key}: {value!r} has a query or fragment; give the base URL "
                              "the admin site is served under", field=key)
        return
    for found in _PLACEHOLDER.findall(value):
        if found != "{model}":
            raise ConfigError(f"{key}: {found} is not a placeholder llmgw fills; the only one "
                              "is {model}, the model's name", field=key)
    rest = _PLACEHOLDER.sub("", value)
    if "{" in rest or "}" in rest:
        raise ConfigError(f"{key}: {value!r} has an unmatched brace; write {{model}} where the "
                          "model's name goes", field=key)


def check_config(cfg: ServerConfig, source: str) -> None:
    """Every cross-field and range check of ``cfg``; ConfigError naming ``source`` and key."""
    _check_tokens(cfg, f"{source} (or LLMGW_ADMIN_TOKENS)")
    for check in (lambda: split_listen(cfg.listen), lambda: _check_nomad(cfg.scheduler.nomad),
                  lambda: _check_nomad_tls(cfg.scheduler),
                  lambda: _check_local(cfg.scheduler.local),
                  lambda: _check_gateway(cfg.gateway)):
        try:
            check()
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc.message}", field=exc.field) from None
    if cfg.mirror is not None:
        parts = urlsplit(cfg.mirror)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"{source}: mirror: {cfg.mirror!r} is not an http(s) URL",
                              field="mirror")
    try:
        if cfg.public_url is not None:
            _check_link(cfg.public_url, "public_url")
        if cfg.dashboard_url is not None:
            _check_link(cfg.dashboard_url, "dashboard_url", placeholders=True)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc.message}", field=exc.field) from None
    if not cfg.database.startswith(("sqlite://", "postgresql://", "postgres://")):
        raise ConfigError(
            f"{source}: database: {cfg.database!r} is neither sqlite:///PATH nor postgresql://…",
            field="database",
        )
    try:
        build_catalog(cfg.models, cfg.gpu_classes, cfg.runtime, adapters=cfg.adapters)
    except DefinitionError as exc:
        index = next((i for i, m in enumerate(cfg.models) if f"model {m.name!r}" in exc.message),
                     None)
        where = f"models[{index}]" if index is not None else "models"
        found = next((i for i, a in enumerate(cfg.adapters)
                      if exc.message.startswith(f"adapter {a.name!r}")), None)
        if found is not None:
            where = f"adapters[{found}]"
        raise ConfigError(f"{source}: {where}: {exc.message}", field=exc.field) from None


def load_config(path: str | Path, env: Mapping[str, str] | None = None) -> ServerConfig:
    """Read, decode and validate server.yaml; raises ConfigError naming file and key."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read the configuration file: {exc.strerror}") from None
    cfg = decode_yaml(data, ServerConfig, source=str(p))
    cfg = _env_overrides(cfg, os.environ if env is None else env)
    check_config(cfg, str(p))
    return cfg
