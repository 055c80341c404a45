"""The gateway's ASGI entry: OpenAI-compatible inference under ``/v1/`` and ``/metrics``.

This is raw ASGI rather than a Litestar handler because it is the hot path:
every request pays for whatever sits here, and the work is small enough to
write out (find the key, read a bounded body, parse just ``model`` and
``stream``, hand over to the forwarder). ``bench/gateway_compare.py`` keeps
the measurement that justified it.

A request goes through, in this order: method; API key (401); the key's or
its team's token budget (429 ``insufficient_quota``, ``budgets``); the key's
rate limit (429, before the body is read, so a client over its limit costs
almost nothing); body size (413, from Content-Length when given, else while
reading); JSON with a string ``model`` and a boolean or absent ``stream``
(400); the model in the catalog in force (404); the key's allow-list (403);
the request's worst case reserved on its budgets' slices (429
``insufficient_quota``, ``slices``).
Then the capability check (400 when the model does not serve the endpoint;
fallbacks that do not are skipped, see ``capabilities``). Then, for an
on-demand model with no replica, the hold for a cold start; then admission
(``admission``): when every replica of the model is saturated the request
waits in the model's queue, or is answered 429. Then the forwarder answers it
from a replica of the model or a fallback, or says why not (502/503/504).

The endpoints beyond the JSON ones — Responses, audio uploads, files,
batches — are a table of path prefixes to handlers in their own modules,
which reach the core through ``exchange.Core``; the batch worker runs here
too, one across all gateway instances by the store's lease.

Beside the requests, each gateway process runs these loops: the engine
scraper (``signals``), which feeds routing and admission; the scaler
(``scaler``), one decider across every process; the batch worker; the
runtime teams and keys (``tenants``, followed from the store); the usage
ledger (``ledger``: every request's record, written in batches, and the
budgets' re-read after each write); and housekeeping (keys, on-demand idle
scale-down, pruning replica state).

Every answer carries ``x-request-id`` (``requestid``: the client's own when
sane, else a new one), which the request's log lines and its engine see too.

A client that disconnects cancels its request: a watcher on ``receive``
cancels the task serving it, which closes the upstream connection, so the
engine stops generating for nobody. The watcher starts once the request has
run ``WATCH_AFTER`` (50 ms): most answers are complete before, and a timer
costs the request a fraction of what a task does.

**Without a keys file**, inference is open only when the server listens on a
loopback address (a laptop, a test); on any other address every inference
request is refused with 401 saying how to create a key. An operator who
forgets ``keys_file`` on a cluster must not publish free GPU time to the
network, and one trying llmgw on a laptop should not need a key first.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Protocol

import msgspec

from llmgw.catalog.build import Catalog
from llmgw.catalog.model import Model
from llmgw.config import ServerConfig
from llmgw.errors import LlmgwError, StoreUnavailableError
from llmgw.gateway import requestid
from llmgw.gateway.adapters import AdapterManager
from llmgw.gateway.admission import AdmissionQueue, Ticket
from llmgw.gateway.audio import AudioEndpoint
from llmgw.gateway.batches import BatchesEndpoint
from llmgw.gateway.batchworker import BatchWorker
from llmgw.gateway.budgets import Budgets
from llmgw.gateway.capabilities import capable_chain
from llmgw.gateway.errors import (
    CatalogUnavailableError,
    ClientGone,
    InvalidKeyError,
    KeyRateLimitedError,
    Message,
    MethodNotAllowedError,
    ModelNotAllowedError,
    ModelNotFoundError,
    NoReplicaError,
    Receive,
    Scope,
    Send,
    UnknownPathError,
    error_json,
    send_error,
)
from llmgw.gateway.exchange import Call, Exchange, Executed
from llmgw.gateway.files import FilesEndpoint
from llmgw.gateway.holders import holder_name
from llmgw.gateway.journal import journal_location
from llmgw.gateway.keepalive import HeldStream
from llmgw.gateway.keys import OPEN_ACCESS, ApiKey, KeyRing, KeysFileWatcher, is_loopback
from llmgw.gateway.ledger import Ledger
from llmgw.gateway.metrics import CONTENT_TYPE, UNKNOWN_MODEL, GatewayMetrics, ModelMetrics
from llmgw.gateway.ondemand import OnDemand, is_on_demand
from llmgw.gateway.probes import UpstreamProber
from llmgw.gateway.proxy import Body, Forwarder, ForwardRequest, Usage
from llmgw.gateway.request import (
    DEFAULT_ANSWER_TOKENS,
    answer_tokens,
    header,
    mark_authenticated,
    parse_head,
    read_body,
    with_usage,
)
from llmgw.gateway.responses_api import ResponsesEndpoint
from llmgw.gateway.routing import UNLIMITED, Balancer
from llmgw.gateway.scaler import ModelLoad, Scaler
from llmgw.gateway.signals import SignalScraper
from llmgw.gateway.slices import Slices
from llmgw.gateway.tenants import TenantsFollower
from llmgw.redact import replica_id, tag_key
from llmgw.scheduler.base import PROBES_REPORT, Routing
from llmgw.store.base import OwnerId, RequestLog, Store, UsageRecord
from llmgw.tenancy import Priority

log = requestid.tagged(logging.getLogger("llmgw.gateway"))

# The scope of the request a task serves, so that authenticating its key can say so to
# the connection guard (``request.AUTHENTICATED``) however deep in a handler it happens.
_REQUEST_SCOPE: contextvars.ContextVar[Scope | None] = contextvars.ContextVar(
    "llmgw_request_scope", default=None)

INFERENCE_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/embeddings",
                             "/v1/rerank", "/v1/score", "/v1/audio/speech"})


class CatalogView(Protocol):
    """Where the gateway reads the catalog in force; it changes at runtime."""

    @property
    def catalog(self) -> Catalog: ...

    # Optionally also ``complete: bool``, False until the runtime models were read
    # from the store (a name missing from the catalog may then be a model that
    # exists); a view without it is always complete.


_encode = msgspec.json.Encoder().encode
# Retry-After for a model that may exist while the store cannot be read.
CATALOG_RETRY = 5.0


class _ModelCard(msgspec.Struct):
    id: str
    object: str = "model"
    created: int = 0
    owned_by: str = "llmgw"


class _AdapterCard(msgspec.Struct):
    """An adapter in ``/v1/models``: ``parent`` is its base, as vLLM lists one."""

    id: str
    parent: str
    object: str = "model"
    created: int = 0
    owned_by: str = "llmgw"


class _ModelList(msgspec.Struct):
    data: list[_ModelCard | _AdapterCard]
    object: str = "list"


class Gateway:
    """The OpenAI-compatible gateway as one ASGI application."""

    def __init__(self, config: ServerConfig, models: CatalogView, backend: Routing,
                 store: Store) -> None:
        gw = config.gateway
        self.config = config
        self.models = models
        self.backend = backend
        self.store = store
        self.max_body = int(gw.max_body_size)
        self.keepalive = float(gw.keepalive_interval)
        self._loop_time = _clock
        # A scrape stays good for three intervals: one missed scrape is noise.
        self.balancer = Balancer(gw.eject_for, gw.eject_max,
                                 signal_ttl=3 * float(gw.signal_interval))
        self.metrics = GatewayMetrics(self._replica_counts, self._live_figures)
        holder = holder_name(f"{id(self):x}")
        self._holder = holder
        self.ondemand = OnDemand(
            backend, store, self.metrics, holder, gw.activity_interval, self._loop_time)
        # Each attempt marks the model it is made on (a fallback that answers is
        # in flight, not the model that was asked for).
        self.forwarder = Forwarder(self.balancer, self.metrics, self.replicas,
                                   gw.max_attempts, self._loop_time,
                                   activity=_Attempts(self),
                                   tag_key=tag_key(config.admin_token_names()))
        self.queues: dict[str, AdmissionQueue] = {}
        self.adapters = AdapterManager(
            self.balancer, lambda: self.models.catalog, self.replicas, self._loop_time,
            scheduler=config.scheduler.kind, mirror=config.mirror,
            profile_of=backend.profile_of, load_wait=float(gw.adapter_load_wait),
            interval=float(gw.signal_interval),
            on_load=lambda base, name, outcome:
                self.metrics.adapter_loads.labels(base, name, outcome).inc(),
            stage=backend.stage_adapter, warm=backend.adapter_warm)
        self.forwarder.placer = self.adapters
        self.signals = SignalScraper(
            self.balancer, self._scrape_targets, self._loop_time,
            interval=float(gw.signal_interval), timeout=float(gw.signal_timeout),
            on_round=self._pump_all, on_page=self.adapters.on_page)
        self.prober = UpstreamProber(self.balancer, lambda: self.models.catalog,
                                     self._loop_time, on_change=self._pump_all)
        self.scaler = Scaler(backend, store, self.balancer, self.metrics, holder,
                             self._loop_time, float(gw.scale_interval), self._local_load)
        self.keys = KeyRing()
        self.keys_watcher: KeysFileWatcher | None = None
        self._keys_interval = float(gw.keys_check_interval)
        self.open_access = False
        self.tenants = TenantsFollower(store, self.keys.replace_runtime, owners=self._owners)
        if config.keys_file:
            self.keys_watcher = KeysFileWatcher(config.keys_file, self.keys)
            self.keys_watcher.load()
        elif is_loopback(config.listen):
            self.open_access = True
            log.warning("no keys_file configured: inference is open to anyone who can reach "
                        "%s (loopback only) until a key is created with `llmgw ctl key add`",
                        config.listen)
        else:
            log.warning("no keys_file configured and %s is not a loopback address: every "
                        "inference request will be refused; set keys_file", config.listen)
        self.ledger: Ledger | None = None
        if gw.ledger:
            self.ledger = Ledger(store, interval=float(gw.ledger_interval),
                                 capacity=gw.ledger_buffer, retention=float(gw.usage_retention),
                                 urgent_interval=float(gw.budget_interval),
                                 on_drop=self.metrics.ledger_dropped.inc,
                                 on_flush=self._refresh_budgets, on_cycle=self._ledger_gauges,
                                 journal_dir=journal_location(gw, store),
                                 journal_max=gw.journal_max,
                                 on_unjournaled=self.metrics.ledger_unjournaled.inc)
            self.budgets: Budgets | None = Budgets(store, self.ledger,
                                                   in_use=self.keys.budget_fields,
                                                   cost_in_use=self.keys.cost_budgeted)
            self.slices: Slices | None = Slices(
                store, self.ledger, holder, interval=float(gw.budget_interval),
                ttl=float(gw.budget_lease_ttl), clock=self._loop_time,
                on_renewal=lambda outcome: self.metrics.slice_renewals.labels(outcome).inc(),
                on_unchecked=lambda team, budget, outcome:
                    self.metrics.budget_unchecked.labels(team, budget, outcome).inc())
        else:
            self.budgets = None
            self.slices = None
        self._tasks: list[asyncio.Task[None]] = []
        self.batch_worker = BatchWorker(self, holder, key_by_id=self.key_by_id,
                                        keys_ready=self.tenants.loaded)
        audio = AudioEndpoint(self)
        # Path prefixes of the endpoints served by their own modules.
        self._routes: tuple[tuple[str, Handler], ...] = (
            ("/v1/responses", ResponsesEndpoint(self).handle),
            ("/v1/audio/transcriptions", audio.handle),
            ("/v1/audio/translations", audio.handle),
            ("/v1/files", FilesEndpoint(self).handle),
            ("/v1/batches", BatchesEndpoint(self, self.batch_worker).handle),
        )

    @property
    def catalog(self) -> Catalog:
        return self.models.catalog

    @property
    def state(self) -> Store:
        if not self.store.is_open:
            raise StoreUnavailableError(
                "the store is not open (it was unreachable when llmgw started, and is being "
                "retried): responses, files and batches are unavailable until it is; check "
                "database: in server.yaml")
        return self.store

    def now(self) -> float:
        return self._loop_time()

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self.keys_watcher is not None:
            self._tasks.append(asyncio.create_task(self._watch_keys(), name="llmgw-keys-watch"))
        self._tasks.append(asyncio.create_task(self.tenants.run(), name="llmgw-gw-tenants"))
        if self.ledger is not None:
            self._tasks.append(asyncio.create_task(self.ledger.run(), name="llmgw-gw-ledger"))
        if self.slices is not None:
            self._tasks.append(asyncio.create_task(self.slices.run(), name="llmgw-gw-slices"))
        self._tasks.append(asyncio.create_task(self._housekeeping(), name="llmgw-gw-idle"))
        self._tasks.append(asyncio.create_task(self.signals.run(), name="llmgw-gw-signals"))
        self._tasks.append(asyncio.create_task(self.adapters.run(), name="llmgw-gw-adapters"))
        self._tasks.append(asyncio.create_task(self._scale(), name="llmgw-gw-scaler"))
        self._tasks.append(asyncio.create_task(self.prober.run(), name="llmgw-gw-probes"))
        self._tasks.append(asyncio.create_task(self._pump_loop(), name="llmgw-gw-admission"))
        self.batch_worker.start()

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        await self.batch_worker.close()
        if self.ledger is not None:
            await self.ledger.close()
        if self.slices is not None:
            await self.slices.close()
        await self.ondemand.close()
        await self.forwarder.close()
        await self.adapters.close()
        await self.signals.close()
        await self.prober.close()

    async def publish_probes(self) -> None:
        """What this gateway's upstream probes found, for the control plane (one row)."""
        report = self.prober.report()
        if report.probed and self.store.is_open:
            await self.store.put_report(PROBES_REPORT, self._holder,
                                        msgspec.json.encode(report))

    async def _scale(self) -> None:
        while True:
            await asyncio.sleep(self.scaler.interval)
            try:
                await self.publish_probes()
            except Exception:
                log.exception("publishing the upstream probes failed; retrying on the next "
                              "tick")
            try:
                await self.scaler.tick(self.models.catalog)
            except Exception:
                log.exception("the scaler failed; retrying on the next tick")

    async def _pump_loop(self) -> None:
        """Admit queued requests when a replica comes back or a limit is lifted.

        Finished requests and scrapes admit at once; this catches what
        neither announces (an ejection ending, a replica joining).
        """
        while True:
            await asyncio.sleep(0.2)
            self._pump_all()

    async def _watch_keys(self) -> None:
        assert self.keys_watcher is not None
        while True:
            await asyncio.sleep(self._keys_interval)
            try:
                content = await asyncio.to_thread(self.keys_watcher.changed)
                if content is not None:
                    self.keys_watcher.apply(content)
                    self.metrics.key_reloads.inc()
            except Exception:
                log.exception("checking the keys file failed; keeping the keys in force")

    async def _housekeeping(self) -> None:
        while True:
            catalog = self.models.catalog
            await asyncio.sleep(self.ondemand.tick_interval(catalog))
            try:
                await self.ondemand.tick(self.models.catalog)
                live = {u for m in self.models.catalog for u in self.replicas(m)}
                self.balancer.prune(live, self._loop_time())
            except Exception:
                log.exception("gateway housekeeping failed; retrying on the next tick")

    # ------------------------------------------------------------ replicas

    def replicas(self, model: Model) -> list[str]:
        """The base URLs that may serve ``model`` now: its upstream list, or the scheduler's."""
        if model.upstream:
            down = self.prober.down
            return [u for u in model.upstream if u not in down] if down else model.upstream
        return self.backend.endpoints(model.name)

    def _replica_counts(self) -> Iterable[tuple[str, int, int]]:
        now = self._loop_time()
        for model in self.models.catalog:
            urls = self.replicas(model)
            yield model.name, len(urls), self.balancer.ejected_count(urls, now)

    def _scrape_targets(self) -> Iterable[str]:
        for model in self.models.catalog:
            if model.scrapes_engine:
                yield from self.replicas(model)

    def _live_figures(self) -> Iterable[tuple[str, tuple[str, ...], float]]:
        now = self._loop_time()
        for model in self.models.catalog:
            if not model.scrapes_engine:
                continue
            samples = [x for u in self.replicas(model)
                       if (x := self.balancer.sample(u, now)) is not None]
            if samples:
                yield ("llmgw_gateway_engine_requests", (model.name, "running"),
                       float(sum(x.running for x in samples)))
                yield ("llmgw_gateway_engine_requests", (model.name, "waiting"),
                       float(sum(x.waiting for x in samples)))
                kv = [x.kv_usage for x in samples if x.kv_usage is not None]
                if kv:
                    yield ("llmgw_gateway_engine_kv_cache_usage", (model.name,),
                           sum(kv) / len(kv))
        yield from self.scaler.figures()
        yield from self._scheduler_figures()
        if self.budgets is not None:
            for team, budget, share in self.budgets.shares(self.keys.teams()):
                yield "llmgw_gateway_budget_used_ratio", (team, budget), share
        if self.slices is not None:
            yield from self.slices.figures()

    def _scheduler_figures(self) -> Iterable[tuple[str, tuple[str, ...], float]]:
        """What the alerting rules page on: a model short of what it should run, its crash
        loop, and the scheduler out of reach. All from the backend's cache."""
        yield "llmgw_scheduler_up", (), 1.0 if self.backend.health().ok else 0.0
        for model in self.models.catalog:
            if model.external:
                continue
            status = self.backend.status(model.name)
            yield "llmgw_scheduler_desired_replicas", (model.name,), float(status.desired)
            yield "llmgw_scheduler_crash_loop", (model.name,), 1.0 if status.crash_loop else 0.0

    def _local_load(self) -> dict[str, ModelLoad]:
        """This process's requests per model: in flight at its replicas, and queued."""
        out: dict[str, ModelLoad] = {}
        for model in self.models.catalog:
            if model.external:
                continue
            in_flight = sum(self.balancer.outstanding(u) for u in self.replicas(model))
            queue = self.queues.get(model.name)
            queued = len(queue) if queue is not None else 0
            if in_flight or queued:
                out[model.name] = ModelLoad(in_flight, queued)
        return out

    # ------------------------------------------------------------ admission

    def _headroom(self, model: Model) -> float | None:
        """Requests the model's usable replicas take before all are saturated; None: no replica."""
        now = self._loop_time()
        r = model.routing
        total = 0.0
        usable = False
        for url in self.replicas(model):
            if self.balancer.is_ejected(url, now):
                continue
            usable = True
            total += self.balancer.headroom(url, now, r.max_concurrency, r.max_waiting)
        return total if usable else None

    def _queue(self, model: Model) -> AdmissionQueue:
        r = model.routing
        queue = self.queues.get(model.name)
        if queue is None:
            queue = self.queues[model.name] = AdmissionQueue(
                model.name, r.queue_size, float(r.queue_wait), self._loop_time)
        else:   # the catalog may have changed the limits
            queue.size, queue.wait = r.queue_size, float(r.queue_wait)
        return queue

    def _enter(self, model: Model, req: ForwardRequest) -> Ticket | None:
        """None: forward now. Else the request's place in the model's queue (429 when full)."""
        r = model.routing
        if r.max_concurrency is None and not model.scrapes_engine:
            return None
        headroom = self._headroom(model)
        if headroom is None:
            return None    # no replica: the forwarder answers (fallbacks, 503)
        queue = self._queue(model)
        if not len(queue) and headroom - queue.in_transit > 0:
            return None
        try:
            ticket = queue.join(req.priority, req.team, req.cost)
        except LlmgwError:
            self.metrics.rejected.labels(model.name, "queue_full").inc()
            raise
        queue.admit(headroom)
        return ticket

    def _pump(self, model: Model) -> None:
        queue = self.queues.get(model.name)
        if queue is None or not len(queue):
            return
        headroom = self._headroom(model)
        # With no replica left, waiting cannot help: let the forwarder answer.
        queue.admit(UNLIMITED if headroom is None else headroom)

    def _pump_all(self) -> None:
        catalog = self.models.catalog
        for name, queue in list(self.queues.items()):
            model = catalog.get(name)
            if model is None:
                if not len(queue):
                    del self.queues[name]
                continue
            if len(queue):
                self._pump(model)

    async def _wait_in_queue(self, ticket: Ticket, model: Model, mm: ModelMetrics) -> None:
        gauge = self.metrics.queued.labels(model.name, ticket.priority)
        gauge.inc()
        try:
            await ticket.wait()
        except LlmgwError:
            self.metrics.rejected.labels(model.name, "queue_timeout").inc()
            raise
        finally:
            gauge.dec()
        mm.queue_wait.observe(self._loop_time() - ticket.joined)

    # ------------------------------------------------------------ ASGI

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind != "http":
            if kind == "lifespan":
                await self._lifespan(receive, send)
            return
        rid = requestid.of(scope["headers"])
        token = requestid.current.set(rid)
        try:
            await self._route(scope, receive, requestid.answering(send, rid))
        finally:
            requestid.current.reset(token)

    async def _route(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        _REQUEST_SCOPE.set(scope)
        if path in INFERENCE_PATHS:
            await self._inference(scope, receive, send, path)
        elif path == "/metrics":
            body = self.metrics.render()
            await send({"type": "http.response.start", "status": 200, "headers": [
                (b"content-type", CONTENT_TYPE), (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
        elif path == "/v1/models" or path.startswith("/v1/models/"):
            try:
                await self._list_models(scope, send, path)
            except LlmgwError as err:
                await send_error(send, err)
        else:
            for prefix, handler in self._routes:
                if path == prefix or path.startswith(prefix + "/"):
                    await handler(scope, receive, send)
                    return
            await send_error(send, UnknownPathError(
                f"{scope['method']} {path}: not an endpoint of this gateway (it serves "
                "/v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses, "
                "/v1/rerank, /v1/score, /v1/audio/*, /v1/files, /v1/batches and /v1/models)"))

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        """Serving the gateway on its own (the benchmark); llmgw serve calls start/close."""
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def authenticate(self, headers: Sequence[tuple[bytes, bytes]]) -> ApiKey:
        return self._authenticate(headers)

    def key_by_id(self, id: str) -> ApiKey | None:
        """The key in force whose id is ``id`` (the owner of a batch), if it still exists:
        never a later key that took the same name."""
        if self._is_open():
            return OPEN_ACCESS if id == OPEN_ACCESS.id else None
        return self.keys.by_id(id)

    def _owners(self) -> dict[str, str]:
        """Each key in force by name, and open access's ("" owns what it made)."""
        return {OPEN_ACCESS.name: OPEN_ACCESS.id, **self.keys.owners()}

    def _is_open(self) -> bool:
        """Open access: no keys file on a loopback listener, and no runtime key either."""
        return self.open_access and not len(self.keys)

    def _authenticate(self, headers: Sequence[tuple[bytes, bytes]]) -> ApiKey:
        if self._is_open():
            scope = _REQUEST_SCOPE.get()
            if scope is not None:
                mark_authenticated(scope)
            return OPEN_ACCESS
        value = header(headers, b"authorization")
        if value is None:
            raise InvalidKeyError(self._no_key_message())
        scheme, _, token = value.decode("latin-1").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise InvalidKeyError("the Authorization header must be 'Bearer <API key>'")
        key = self.keys.lookup(token)
        if key is None and self.keys_watcher is None and not len(self.keys):
            raise InvalidKeyError(self._no_key_message())
        if key is None:
            raise InvalidKeyError("the API key is not valid (unknown or revoked); ask for a "
                                  "new one (`llmgw ctl key add` or `llmgw keys add NAME`)")
        scope = _REQUEST_SCOPE.get()
        if scope is not None:
            mark_authenticated(scope)
        return key

    def _no_key_message(self) -> str:
        if self.keys_watcher is None:
            return ("inference needs an API key, and this server has no keys_file and no "
                    "runtime key: set keys_file in server.yaml and create a key with `llmgw "
                    "keys add NAME`, or create one with `llmgw ctl key add`")
        return "no API key: send 'Authorization: Bearer <API key>'"

    async def _list_models(self, scope: Scope, send: Send, path: str) -> None:
        if scope["method"] != "GET":
            raise MethodNotAllowedError(scope["method"], path, ("GET",))
        key = self._authenticate(scope["headers"])
        catalog = self.models.catalog
        if path == "/v1/models":
            cards: list[_ModelCard | _AdapterCard] = [
                _ModelCard(id=m.name) for m in catalog if key.allows(m.name)]
            cards += [_AdapterCard(id=a.name, parent=a.base)
                      for a in catalog.adapters.values() if key.allows(a.name)]
            body = _encode(_ModelList(data=cards))
        else:
            name = path[len("/v1/models/"):]
            if catalog.served(name) is None or not key.allows(name):
                raise ModelNotFoundError(f"model {name!r} does not exist or this key may not "
                                         "use it", field="model")
            adapter = catalog.adapters.get(name)
            body = _encode(_AdapterCard(id=name, parent=adapter.base) if adapter is not None
                           else _ModelCard(id=name))
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def inference(self, scope: Scope, receive: Receive, send: Send, path: str,
                        exchange: Exchange | None = None) -> None:
        await self._inference(scope, receive, send, path, exchange)

    async def _inference(self, scope: Scope, receive: Receive, send: Send, path: str,
                         exchange: Exchange | None = None) -> None:
        started = self._loop_time()
        call = Call()
        status = 500
        try:
            if exchange is None:
                req, chain = await self._admit(scope, receive, path, started, call)
            else:
                req, chain, send = await exchange.admit(scope, receive, send, started, call)
            if self.ledger is not None:
                send = self._journaling(send, call, started)
            status = await self._serve(req, chain, receive, send)
        except LlmgwError as err:
            status = err.status
            await send_error(send, err)
        except ClientGone:
            status = 499
        except Exception:
            log.exception("unexpected error serving %s", path)
            if not call.responded():
                await send_error(send, LlmgwError(
                    "internal error in the gateway; the server's log has the traceback"))
        finally:
            mm = call.metrics or self.metrics.for_model("")
            mm.done(status)
            latency = self._loop_time() - started
            mm.latency.observe(latency)
            if call.key is not None and call.request is not None and not call.accounted:
                self._account(call.key, call.request, status, latency)

    def _journaling(self, send: Send, call: Call, started: float) -> Send:
        """``send``, recording the request in the ledger just before its answer's last byte.

        So with a journal (``gateway.journal``) every answer that reached its client whole
        has its usage record on disk: a process killed after that byte loses no record of
        it. The forwarder has the usage by then (it reads it before passing the end on).
        """
        status = 0

        async def sending(message: Message) -> None:
            nonlocal status
            kind = message["type"]
            if kind == "http.response.start":
                status = message["status"]
            elif (kind == "http.response.body" and not message.get("more_body", False)
                  and not call.accounted and call.key is not None
                  and call.request is not None):
                call.accounted = True
                self._account(call.key, call.request, status, self._loop_time() - started)
            await send(message)

        return sending

    async def _refresh_budgets(self) -> None:
        if self.budgets is not None:
            await self.budgets.refresh()

    def _ledger_gauges(self) -> None:
        ledger = self.ledger
        if ledger is not None:
            self.metrics.ledger_waiting.set(ledger.waiting)
            if ledger.journal is not None:
                self.metrics.ledger_journal_bytes.set(ledger.journal.bytes)

    def _account(self, key: ApiKey, req: ForwardRequest, status: int, latency: float) -> None:
        """The request's ledger record and its team's token counters."""
        served = req.served_by
        usage = req.usage or _NO_USAGE
        # An adapter's usage is its own line, for the team that used it.
        model = req.adapter.name if req.adapter is not None else \
            served.name if served is not None else req.model
        if usage.prompt or usage.completion:
            self.metrics.add_team_tokens(key.team, model, usage.prompt, usage.completion)
        ledger = self.ledger
        if ledger is None:
            return
        slices = self.slices
        if key.budgeted and slices is not None:
            # With the record below, in one step: a slice's settled tokens are those not
            # among the ledger's buffered records (``slices``).
            if req.reservation is not None:
                slices.settle(req.reservation, usage.prompt + usage.completion)
                req.reservation = None
            elif usage.prompt or usage.completion:
                slices.charge(slices.slices_of(key.team, key.name, key.team_limits,
                                               key.limits), usage.prompt + usage.completion)
        gpu_class = ""
        if served is not None and served.profiles:
            # With one profile there is no doubt; with several, the one the answering
            # replica runs, when the scheduler knows it.
            profile = served.profiles[0] if len(served.profiles) == 1 else None
            if profile is None and req.replica:
                name = self.backend.profile_of(req.replica)
                profile = served.profile(name) if name is not None else None
            gpu_class = (profile.gpu_class or "") if profile is not None else ""
        record = UsageRecord(
            id=ledger.next_id(), at=time.time(), key=key.name, team=key.team, model=model,
            # An id, never the URL: an upstream's may carry credentials, kept 90 days here.
            replica=replica_id(req.replica) if req.replica else "", gpu_class=gpu_class,
            prompt_tokens=usage.prompt,
            cached_tokens=usage.cached, completion_tokens=usage.completion, status=status,
            latency=latency, ttft=req.ttft, key_id=key.id)
        ledger.record(record, urgent=key.budgeted)
        if key.log_requests != "off":
            bodies = key.log_requests == "bodies"
            ledger.log(RequestLog(
                id=record.id, at=record.at, expires_at=record.at + key.log_days * 86400,
                team=key.team, key=key.name,
                record=_encode_log(_LogEntry(path=req.path, requested=req.model,
                                             stream=req.stream, usage=record,
                                             request_id=_request_id())),
                request=req.body if bodies else None,
                response=b"".join(req.capture) if bodies and req.capture is not None
                else None))

    async def admit_json(self, scope: Scope, receive: Receive, path: str, started: float,
                         call: Call) -> tuple[ForwardRequest, list[Model]]:
        return await self._admit(scope, receive, path, started, call)

    async def _admit(self, scope: Scope, receive: Receive, path: str, started: float,
                     call: Call) -> tuple[ForwardRequest, list[Model]]:
        """Every check before forwarding; raises the error to answer instead."""
        if scope["method"] != "POST":
            raise MethodNotAllowedError(scope["method"], path, ("POST",))
        key = call.key = self.check_key(scope["headers"], started)
        body = await read_body(scope["headers"], receive, self.max_body)
        head = parse_head(body)
        chain = self.chain_for(head.model, key, path, call)
        assert call.metrics is not None   # chain_for set it
        strip = False
        if head.stream and self.ledger is not None and path in _USAGE_PATHS:
            asked = with_usage(body, head.stream_options)
            if asked is not None:
                body, strip = asked, True
        query: bytes = scope.get("query_string", b"")
        if query:
            path = f"{path}?{query.decode('latin-1')}"
        answer = answer_tokens(head)
        call.request = req = ForwardRequest(
            path=path, body=body, model=head.model, stream=bool(head.stream),
            headers=scope["headers"], started=started, metrics=call.metrics,
            priority=key.priority, strip_usage=strip, team=key.team,
            cost=len(body) / 4 + (DEFAULT_ANSWER_TOKENS if answer is None else answer),
            capture=[] if key.log_requests == "bodies" else None,
            adapter=self.models.catalog.adapters.get(head.model))
        if key.budgeted and self.slices is not None:
            await self._reserve(key, req, answer)
        return req, chain

    async def _reserve(self, key: ApiKey, req: ForwardRequest, answer: int | None) -> None:
        """Hold the request's worst case on its key's budget slices (``slices``): the
        body's bytes, which bound its prompt's tokens, plus what it may generate."""
        slices = self.slices
        assert slices is not None
        held = slices.slices_of(key.team, key.name, key.team_limits, key.limits)
        if not held:
            return
        tokens = len(req.body) + (DEFAULT_ANSWER_TOKENS if answer is None else answer)
        req.reservation = slices.reserve(held, tokens) or \
            await slices.reserve_waiting(held, tokens)

    def check_key(self, headers: Sequence[tuple[bytes, bytes]], now: float) -> ApiKey:
        key = self._authenticate(headers)
        budgets = self.budgets
        if budgets is not None and key.budgeted:
            budgets.check(key.team, key.name, key.team_limits, key.limits)
        wait = key.admit(now)
        if wait > 0:
            raise KeyRateLimitedError(
                f"key {key.name!r} is over its limit of {key.rpm} requests per minute; "
                f"retry in {wait:.0f} s", retry_after=wait)
        return key

    def chain_for(self, name: str, key: ApiKey | None, path: str, call: Call) -> list[Model]:
        catalog = self.models.catalog
        model = catalog.get(name)
        if model is None and name in catalog.adapters:
            return self._adapter_chain(name, key, path, call)
        if model is None:
            call.metrics = self.metrics.for_model(UNKNOWN_MODEL)
            if not getattr(self.models, "complete", True):
                raise CatalogUnavailableError(
                    f"model {name!r} is not declared in the configuration, and the models "
                    "added at run time cannot be read: the store was unreachable when this "
                    "gateway started and is being retried; retry shortly",
                    retry_after=CATALOG_RETRY)
            raise ModelNotFoundError(
                f"model {name!r} does not exist (GET /v1/models lists the models "
                "this key may use)", field="model")
        call.metrics = self.metrics.for_model(model.name)
        if key is not None and not key.allows(model.name):
            # A request the key may never make costs the engines nothing, so
            # it does not use up the key's allowance for the ones it may.
            key.refund()
            raise ModelNotAllowedError(f"key {key.name!r} may not use model {model.name!r}",
                                       field="model")
        return capable_chain(catalog.fallback_chain(model), path)

    def _adapter_chain(self, name: str, key: ApiKey | None, path: str,
                       call: Call) -> list[Model]:
        """An adapter's request is answered by its base alone: a fallback would be
        another model answering for the fine-tune, which is what must never happen."""
        found = self.models.catalog.served(name)
        assert found is not None
        base, _ = found
        call.metrics = self.metrics.for_model(name)
        if key is not None and not key.allows(name):
            key.refund()
            raise ModelNotAllowedError(f"key {key.name!r} may not use adapter {name!r}",
                                       field="model")
        return capable_chain([base], path)

    async def execute(self, path: str, body: bytes, model: str, *, priority: Priority = "batch",
                      variant: Callable[[Model], tuple[str, Body]] | None = None,
                      owner: OwnerId | None = None) -> Executed:
        """One request on the gateway's own behalf (a batch line), through the same routing.

        The key's allow-list is not checked again here: the batch's lines were
        checked against its owner's key when it was validated. Its token and
        cost budgets are, line by line, as for a client's request: a batch
        whose owner ran out is answered 429 ``insufficient_quota``, which the
        worker takes as the line's final answer (``batchworker``: quota is final).
        Nor is the line counted as a client's request (requests_total,
        request_duration: what interactive users get); the worker counts it in
        batch_lines_total. It is in the usage ledger, as its owner's (``owner``,
        the key's id, and its team). A line whose owner was revoked is not run
        (401): nobody would be billed for it.
        """
        call = Call()
        answer = _Collected()
        key = self.key_by_id(owner) if owner is not None else None
        if owner is not None and key is None:
            err = InvalidKeyError("the API key that created this batch was revoked (or its "
                                  "team deleted); its remaining lines are not run")
            return Executed(err.status, error_json(err), None)
        started = self._loop_time()
        if key is not None and key.budgeted and self.budgets is not None:
            try:
                self.budgets.check(key.team, key.name, key.team_limits, key.limits)
            except LlmgwError as err:
                return Executed(err.status, error_json(err), None)
        try:
            chain = self.chain_for(model, None, path, call)
            assert call.metrics is not None   # chain_for set it
            call.request = ForwardRequest(path=path, body=body, model=model, stream=False,
                                          headers=_INTERNAL_HEADERS, started=started,
                                          metrics=call.metrics, priority=priority,
                                          variant=variant,
                                          team=key.team if key is not None else "",
                                          adapter=self.catalog.adapters.get(model))
            if key is not None and key.budgeted and self.slices is not None:
                await self._reserve(key, call.request, answer_tokens(parse_head(body)))
            answer.status = await self._serve(call.request, chain, _never, answer.send)
        except LlmgwError as err:
            answer.status = err.status
            answer.body = [error_json(err)]
        if key is not None and call.request is not None:
            self._account(key, call.request, answer.status, self._loop_time() - started)
        return Executed(answer.status, b"".join(answer.body), answer.model)

    async def _serve(self, req: ForwardRequest, chain: list[Model], receive: Receive,
                     send: Send) -> int:
        """Forward, holding for an on-demand model, cancelled if the client goes away."""
        model = chain[0]
        mm = req.metrics
        task = asyncio.current_task()
        assert task is not None
        state = _Watch()
        # Watched from WATCH_AFTER on (see the module's docstring): an engine works at
        # most that long for a client that is gone.
        timer = asyncio.get_running_loop().call_later(WATCH_AFTER, _watch, receive, task, state)
        mm.in_flight.inc()
        # Chat and completion streams only: a Responses stream is shaped by its
        # exchange from the replica's head, which a held stream no longer passes on.
        held = HeldStream(send, model.name, self.keepalive) \
            if req.stream and req.variant is None and self.keepalive > 0 else None
        try:
            if is_on_demand(model) and not self.backend.endpoints(model.name):
                # Held for a cold start: in flight for the model asked for. Once
                # forwarding, the forwarder marks each model it tries.
                self.ondemand.begin(model)
                try:
                    async with _holding(held):
                        up = await self.ondemand.wait_for_replica(model)
                finally:
                    self.ondemand.end(model)
                if not up:
                    return await self._forward_after_cold_wait(req, chain, _to(send, held))
            ticket = self._enter(model, req)
            if ticket is not None:
                try:
                    async with _holding(held):
                        await self._wait_in_queue(ticket, model, mm)
                finally:
                    # Admitted: the forwarder takes its replica with no await
                    # in between, so the transit ends here.
                    ticket.close()
            if req.adapter is not None:
                # Loaded (if it must be) while keep-alive comments flow; the forwarder
                # then finds it where it was loaded.
                async with _holding(held):
                    await self.adapters.place(req, model, self.replicas(model), set())
            return await self.forwarder.forward(req, chain, _to(send, held))
        except LlmgwError as err:
            if held is None or not held.started:
                raise
            await held.fail(err)
            return err.status
        except asyncio.CancelledError:
            if not state.gone:
                raise
            task.uncancel()
            return 499
        finally:
            state.done = True
            timer.cancel()
            if state.watcher is not None:
                state.watcher.cancel()
            mm.in_flight.dec()

    async def _forward_after_cold_wait(self, req: ForwardRequest, chain: list[Model],
                                       send: Send) -> int:
        """The model did not come up within scaling.wait: a fallback that is up, or 503."""
        model = chain[0]
        try:
            return await self.forwarder.forward(req, chain, send)
        except NoReplicaError:
            wait = model.scaling.wait
            raise NoReplicaError(
                f"model {model.name!r} is starting but had no healthy replica within "
                f"{wait:g} s (scaling.wait), and no fallback is up; retry shortly",
                retry_after=min(30.0, max(1.0, wait))) from None


Handler = Callable[[Scope, Receive, Send], Awaitable[None]]
_NO_USAGE = Usage(0, 0, 0)


class _LogEntry(msgspec.Struct):
    """What a request log keeps beside the bodies: the request's shape and its record, and
    the id its client was answered with (``x-request-id``)."""

    path: str
    requested: str
    stream: bool
    usage: UsageRecord
    request_id: str | None = None


def _request_id() -> str | None:
    rid = requestid.current.get()
    return None if rid is None else rid.decode("ascii")


_encode_log = msgspec.json.Encoder().encode
# Streams that report usage only when asked (stream_options.include_usage).
_USAGE_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})


def _holding(held: HeldStream | None) -> contextlib.AbstractAsyncContextManager[None]:
    return contextlib.nullcontext() if held is None else held.waiting()


def _to(send: Send, held: HeldStream | None) -> Send:
    """Where the answer goes: through the held stream once its head went out."""
    return held.send if held is not None and held.started else send
_INTERNAL_HEADERS = [(b"content-type", b"application/json")]


class _Attempts:
    """Told of each attempt on a model: on-demand activity, and a freed slot for the queue."""

    __slots__ = ("_gateway",)

    def __init__(self, gateway: Gateway) -> None:
        self._gateway = gateway

    def begin(self, model: Model) -> None:
        self._gateway.ondemand.begin(model)

    def end(self, model: Model) -> None:
        gateway = self._gateway
        gateway.ondemand.end(model)
        if gateway.queues:
            gateway._pump(model)


class _Collected:
    """An ASGI ``send`` that keeps the response, for requests the gateway makes itself."""

    __slots__ = ("body", "model", "status")

    def __init__(self) -> None:
        self.status = 500
        self.body: list[bytes] = []
        self.model: str | None = None

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            name = header(message["headers"], b"x-llmgw-model")
            self.model = name.decode() if name is not None else None
        elif message.get("body"):
            self.body.append(message["body"])


async def _never() -> Message:
    """``receive`` for a request no client sent: it never disconnects."""
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


# How long a request runs before its client's disconnect is watched for.
WATCH_AFTER = 0.05


class _Watch:
    __slots__ = ("done", "gone", "watcher")

    def __init__(self) -> None:
        self.done = False
        self.gone = False
        self.watcher: asyncio.Task[None] | None = None


def _watch(receive: Receive, task: asyncio.Task[Any], state: _Watch) -> None:
    if not state.done:
        state.watcher = asyncio.get_running_loop().create_task(
            _watch_disconnect(receive, task, state))


async def _watch_disconnect(receive: Receive, task: asyncio.Task[Any], state: _Watch) -> None:
    with contextlib.suppress(asyncio.CancelledError):
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                if not state.done:
                    state.gone = True
                    task.cancel()
                return


def _clock() -> float:
    return asyncio.get_running_loop().time()
