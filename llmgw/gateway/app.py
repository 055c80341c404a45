"""The gateway's ASGI entry: OpenAI-compatible inference under ``/v1/`` and ``/metrics``.

This is raw ASGI rather than a Litestar handler because it is the hot path:
every request pays for whatever sits here, and the work is small enough to
write out (find the key, read a bounded body, parse just ``model`` and
``stream``, hand over to the forwarder). ``bench/gateway_compare.py`` keeps
the measurement that justified it.

A request goes through, in this order: method; API key (401); the key's
rate limit (429, before the body is read, so a client over its limit costs
almost nothing); body size (413, from Content-Length when given, else while
reading); JSON with a string ``model`` and a boolean or absent ``stream``
(400); the model in the catalog in force (404); the key's allow-list (403).
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
(``scaler``), one decider across every process; the batch worker; and
housekeeping (keys, on-demand idle scale-down, pruning replica state).

A client that disconnects cancels its request: a watcher on ``receive``
cancels the task serving it, which closes the upstream connection, so the
engine stops generating for nobody.

**Without a keys file**, inference is open only when the server listens on a
loopback address (a laptop, a test); on any other address every inference
request is refused with 401 saying how to create a key. An operator who
forgets ``keys_file`` on a cluster must not publish free GPU time to the
network, and one trying llmgw on a laptop should not need a key first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Protocol

import msgspec

from llmgw.catalog.build import Catalog
from llmgw.catalog.model import Model
from llmgw.config import ServerConfig
from llmgw.errors import LlmgwError, StoreUnavailableError
from llmgw.gateway.admission import AdmissionQueue, Priority, Ticket
from llmgw.gateway.audio import AudioEndpoint
from llmgw.gateway.batches import BatchesEndpoint
from llmgw.gateway.batchworker import BatchWorker
from llmgw.gateway.capabilities import capable_chain
from llmgw.gateway.errors import (
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
from llmgw.gateway.keepalive import HeldStream
from llmgw.gateway.keys import OPEN_ACCESS, ApiKey, KeyRing, KeysFileWatcher, is_loopback
from llmgw.gateway.metrics import CONTENT_TYPE, UNKNOWN_MODEL, GatewayMetrics, ModelMetrics
from llmgw.gateway.ondemand import OnDemand, is_on_demand
from llmgw.gateway.proxy import Body, Forwarder, ForwardRequest
from llmgw.gateway.request import header, parse_head, read_body
from llmgw.gateway.responses_api import ResponsesEndpoint
from llmgw.gateway.routing import UNLIMITED, Balancer
from llmgw.gateway.scaler import ModelLoad, Scaler
from llmgw.gateway.signals import SignalScraper
from llmgw.scheduler.base import Routing
from llmgw.store.base import Store

log = logging.getLogger("llmgw.gateway")

INFERENCE_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/embeddings",
                             "/v1/rerank", "/v1/score", "/v1/audio/speech"})


class CatalogView(Protocol):
    """Where the gateway reads the catalog in force; it changes at runtime."""

    @property
    def catalog(self) -> Catalog: ...


_encode = msgspec.json.Encoder().encode


class _ModelCard(msgspec.Struct):
    id: str
    object: str = "model"
    created: int = 0
    owned_by: str = "llmgw"


class _ModelList(msgspec.Struct):
    data: list[_ModelCard]
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
        holder = f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"
        self.ondemand = OnDemand(
            backend, store, self.metrics, holder, gw.activity_interval, self._loop_time)
        # Each attempt marks the model it is made on (a fallback that answers is
        # in flight, not the model that was asked for).
        self.forwarder = Forwarder(self.balancer, self.metrics, self.replicas,
                                   gw.max_attempts, self._loop_time,
                                   activity=_Attempts(self))
        self.queues: dict[str, AdmissionQueue] = {}
        self.signals = SignalScraper(
            self.balancer, self._scrape_targets, self._loop_time,
            interval=float(gw.signal_interval), timeout=float(gw.signal_timeout),
            on_round=self._pump_all)
        self.scaler = Scaler(backend, store, self.balancer, self.metrics, holder,
                             self._loop_time, float(gw.scale_interval), self._local_load)
        self.keys = KeyRing()
        self.keys_watcher: KeysFileWatcher | None = None
        self._keys_interval = float(gw.keys_check_interval)
        self.open_access = False
        if config.keys_file:
            self.keys_watcher = KeysFileWatcher(config.keys_file, self.keys)
            self.keys_watcher.load()
        elif is_loopback(config.listen):
            self.open_access = True
            log.warning("no keys_file configured: inference is open to anyone who can reach "
                        "%s (loopback only)", config.listen)
        else:
            log.warning("no keys_file configured and %s is not a loopback address: every "
                        "inference request will be refused; set keys_file", config.listen)
        self._tasks: list[asyncio.Task[None]] = []
        self.batch_worker = BatchWorker(self, holder, key_named=self.key_named)
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
        self._tasks.append(asyncio.create_task(self._housekeeping(), name="llmgw-gw-idle"))
        self._tasks.append(asyncio.create_task(self.signals.run(), name="llmgw-gw-signals"))
        self._tasks.append(asyncio.create_task(self._scale(), name="llmgw-gw-scaler"))
        self._tasks.append(asyncio.create_task(self._pump_loop(), name="llmgw-gw-admission"))
        self.batch_worker.start()

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        await self.batch_worker.close()
        await self.ondemand.close()
        await self.forwarder.close()
        await self.signals.close()

    async def _scale(self) -> None:
        while True:
            await asyncio.sleep(self.scaler.interval)
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
            return model.upstream
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

    def _enter(self, model: Model, priority: Priority) -> Ticket | None:
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
            ticket = queue.join(priority)
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
        path: str = scope["path"]
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

    def key_named(self, name: str) -> ApiKey | None:
        """The key in force called ``name`` (the owner of a batch), if it still exists."""
        if self.open_access:
            return OPEN_ACCESS if name == OPEN_ACCESS.name else None
        return self.keys.named(name)

    def _authenticate(self, headers: Sequence[tuple[bytes, bytes]]) -> ApiKey:
        if self.open_access:
            return OPEN_ACCESS
        value = header(headers, b"authorization")
        if value is None or self.keys_watcher is None:
            raise InvalidKeyError(self._no_key_message())
        scheme, _, token = value.decode("latin-1").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise InvalidKeyError("the Authorization header must be 'Bearer <API key>'")
        key = self.keys.lookup(token)
        if key is None:
            raise InvalidKeyError("the API key is not valid (unknown or revoked); ask for a "
                                  "new one (`llmgw keys add NAME` on the control-plane host)")
        return key

    def _no_key_message(self) -> str:
        if self.keys_watcher is None:
            return ("inference needs an API key, and this server has no keys_file: set "
                    "keys_file in server.yaml and create a key with `llmgw keys add NAME`")
        return "no API key: send 'Authorization: Bearer <API key>'"

    async def _list_models(self, scope: Scope, send: Send, path: str) -> None:
        if scope["method"] != "GET":
            raise MethodNotAllowedError(f"{scope['method']} {path}: use GET")
        key = self._authenticate(scope["headers"])
        catalog = self.models.catalog
        if path == "/v1/models":
            cards = [_ModelCard(id=m.name) for m in catalog if key.allows(m.name)]
            body = _encode(_ModelList(data=cards))
        else:
            name = path[len("/v1/models/"):]
            if name not in catalog or not key.allows(name):
                raise ModelNotFoundError(f"model {name!r} does not exist or this key may not "
                                         "use it", field="model")
            body = _encode(_ModelCard(id=name))
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
            mm.latency.observe(self._loop_time() - started)

    async def admit_json(self, scope: Scope, receive: Receive, path: str, started: float,
                         call: Call) -> tuple[ForwardRequest, list[Model]]:
        return await self._admit(scope, receive, path, started, call)

    async def _admit(self, scope: Scope, receive: Receive, path: str, started: float,
                     call: Call) -> tuple[ForwardRequest, list[Model]]:
        """Every check before forwarding; raises the error to answer instead."""
        if scope["method"] != "POST":
            raise MethodNotAllowedError(f"{scope['method']} {path}: use POST")
        key = call.key = self.check_key(scope["headers"], started)
        body = await read_body(scope["headers"], receive, self.max_body)
        head = parse_head(body)
        chain = self.chain_for(head.model, key, path, call)
        assert call.metrics is not None   # chain_for set it
        query: bytes = scope.get("query_string", b"")
        if query:
            path = f"{path}?{query.decode('latin-1')}"
        call.request = ForwardRequest(path=path, body=body, model=head.model,
                                      stream=bool(head.stream), headers=scope["headers"],
                                      started=started, metrics=call.metrics,
                                      priority=key.priority)
        return call.request, chain

    def check_key(self, headers: Sequence[tuple[bytes, bytes]], now: float) -> ApiKey:
        key = self._authenticate(headers)
        wait = key.admit(now)
        if wait > 0:
            raise KeyRateLimitedError(
                f"key {key.name!r} is over its limit of {key.rpm} requests per minute; "
                f"retry in {wait:.0f} s", retry_after=wait)
        return key

    def chain_for(self, name: str, key: ApiKey | None, path: str, call: Call) -> list[Model]:
        catalog = self.models.catalog
        model = catalog.get(name)
        if model is None:
            call.metrics = self.metrics.for_model(UNKNOWN_MODEL)
            raise ModelNotFoundError(
                f"model {name!r} does not exist (GET /v1/models lists the models "
                "this key may use)", field="model")
        call.metrics = self.metrics.for_model(model.name)
        if key is not None and not key.allows(model.name):
            raise ModelNotAllowedError(f"key {key.name!r} may not use model {model.name!r}",
                                       field="model")
        chain = [model, *(fb for fb_name in model.fallbacks
                          if (fb := catalog.get(fb_name)) is not None)]
        return capable_chain(chain, path)

    async def execute(self, path: str, body: bytes, model: str, *, priority: Priority = "batch",
                      variant: Callable[[Model], tuple[str, Body]] | None = None) -> Executed:
        """One request on the gateway's own behalf (a batch line), through the same routing.

        No key is checked here: the batch's lines were checked against its
        owner's key when it was validated. Nor is the line counted as a client's
        request (requests_total, request_duration: what interactive users get);
        the worker counts it in batch_lines_total.
        """
        call = Call()
        answer = _Collected()
        try:
            chain = self.chain_for(model, None, path, call)
            assert call.metrics is not None   # chain_for set it
            call.request = ForwardRequest(path=path, body=body, model=model, stream=False,
                                          headers=_INTERNAL_HEADERS, started=self._loop_time(),
                                          metrics=call.metrics, priority=priority,
                                          variant=variant)
            answer.status = await self._serve(call.request, chain, _never, answer.send)
        except LlmgwError as err:
            answer.status = err.status
            answer.body = [error_json(err)]
        return Executed(answer.status, b"".join(answer.body), answer.model)

    async def _serve(self, req: ForwardRequest, chain: list[Model], receive: Receive,
                     send: Send) -> int:
        """Forward, holding for an on-demand model, cancelled if the client goes away."""
        model = chain[0]
        mm = req.metrics
        task = asyncio.current_task()
        assert task is not None
        state = _Watch()
        watcher = asyncio.create_task(_watch_disconnect(receive, task, state))
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
            ticket = self._enter(model, req.priority)
            if ticket is not None:
                try:
                    async with _holding(held):
                        await self._wait_in_queue(ticket, model, mm)
                finally:
                    # Admitted: the forwarder takes its replica with no await
                    # in between, so the transit ends here.
                    ticket.close()
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
            watcher.cancel()
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


class _Watch:
    __slots__ = ("done", "gone")

    def __init__(self) -> None:
        self.done = False
        self.gone = False


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
