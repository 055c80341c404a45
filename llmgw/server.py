"""Assembling one llmgw process: store, catalog, scheduler, control API, gateway.

One ASGI application serves both faces of llmgw on one port: paths under
``/v1/`` and ``/metrics`` go straight to the gateway (a raw ASGI handler, the
hot path), everything else to the Litestar control API. Start-up order matters
and is fixed here: the configuration was validated before this runs; the store
is opened and the catalog loaded before the scheduler is asked to apply it;
the gateway starts last, so no request is routed against an empty catalog.

If the store cannot be reached at start-up the server still starts: the API
and the gateway answer from the declared models, writes answer 503, and the
scheduler is not told anything until the catalog has been read from the store.
Nothing a person added is lost: it is in the store, not here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

from litestar import Litestar

from llmgw import admin
from llmgw.api.app import create_app
from llmgw.catalog.adapter import Adapter
from llmgw.catalog.model import Model
from llmgw.config import ServerConfig
from llmgw.control.context import AppContext
from llmgw.control.costs import CostMeter
from llmgw.control.identity import is_private, refuse_unless_admin
from llmgw.errors import StoreUnavailableError
from llmgw.modelsvc import ModelService
from llmgw.scheduler.base import Backend
from llmgw.scheduler.relay import PREFIX as RELAY_PREFIX
from llmgw.scheduler.relay import RoutingRelay

if TYPE_CHECKING:
    from llmgw.scheduler.local.backend import LocalEvent
from llmgw.store import open_store
from llmgw.store.base import Store

log = logging.getLogger("llmgw.server")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def control_app(ctx: AppContext) -> Litestar:
    """The control plane's app: the JSON API with the admin page mounted beside it."""
    return create_app(ctx, mounts=admin.routers(), template_config=admin.template_config())


def make_backend(config: ServerConfig, store: Store,
                 on_event: Callable[[LocalEvent], None] | None = None) -> Backend:
    """The scheduler backend ``config.scheduler.kind`` names.

    ``on_event`` hears the embedded scheduler's replicas load, serve, fail and
    stop (what a person watching ``llmgw serve`` wants to see); Nomad's
    replicas are watched in Nomad itself.
    """
    if config.scheduler.kind == "nomad":
        from llmgw.scheduler.nomad.backend import NomadBackend

        return NomadBackend(config, store)
    from llmgw.scheduler.local.backend import LocalBackend

    return LocalBackend(config, store, on_event=on_event)


class Server:
    """One llmgw process. ``asgi`` is the application to hand to an ASGI server."""

    def __init__(
        self,
        config: ServerConfig,
        *,
        config_name: str = "server.yaml",
        store: Store | None = None,
        backend: Backend | None = None,
        on_event: Callable[[LocalEvent], None] | None = None,
        source_check: Callable[[Model], Awaitable[None]] | None = None,
        adapter_check: Callable[[Adapter], Awaitable[None]] | None = None,
        reservation_check: Callable[[Model], Awaitable[list[str]]] | None = None,
        watch_interval: float = 0.5,
        control_only: bool = False,
    ) -> None:
        self.config = config
        self.store = store or open_store(config.database)
        self.backend = backend or make_backend(config, self.store, on_event)
        self.models = ModelService(
            config.models, dict(config.gpu_classes), self.store,
            placement_check=self.backend.check_placement, config_name=config_name,
            runtime=config.runtime, declared_adapters=config.adapters,
        )
        if source_check is None:
            from llmgw.weights.check import model_source_checker, reach_of

            source_check = model_source_checker(mirror=config.mirror, reach=reach_of(config))
        if reservation_check is None:
            from llmgw.control.reservation import reservation_checker

            reservation_check = reservation_checker(
                embedded=config.scheduler.kind == "local", mirror=config.mirror)
        if adapter_check is None:
            from llmgw.weights.adaptercheck import check_adapter_source

            async def adapter_check(adapter: Adapter) -> None:
                await check_adapter_source(adapter, mirror=config.mirror)

        self.ctx = AppContext(config=config, models=self.models, backend=self.backend,
                              store=self.store, source_check=source_check,
                              reservation_check=reservation_check,
                              adapter_check=adapter_check)
        self.api = control_app(self.ctx)
        self.api.on_startup.append(self.start)
        self.api.on_shutdown.append(self.close)
        # Built here, not at start-up: the gateway validates its settings and
        # reads the keys file, and a mistake there must stop `serve` before it
        # binds a port or starts an engine (STYLE 10), not fail the lifespan.
        from llmgw.gateway.app import Gateway

        self.gateway = Gateway(config, self.models, self.backend, self.store)
        self.ctx.adapters_loaded = self.gateway.adapters.loaded_where
        self.ctx.gateway_samples = self.gateway.metrics.counted_samples
        self.ctx.gateway_state = self.gateway.metrics.state_samples
        # With gateway workers (llmgw serve --workers N) this process is the
        # control plane only: the workers serve /v1 and read the scheduler
        # through the relay (llmgw.workers).
        self.control_only = control_only
        self.relay: RoutingRelay | None = None
        if control_only:
            self.relay = RoutingRelay(self.backend, lambda: [
                m.name for m in self.models.catalog if not m.external],
                lambda: self.models.catalog.adapters)
        else:
            from llmgw.scheduler.local.backend import LocalBackend

            if isinstance(self.backend, LocalBackend):
                # A replica leaving drains until this gateway has nothing on it.
                self.backend.in_flight = self.gateway.balancer.outstanding
        self._watch_interval = watch_interval
        self.cost_meter = CostMeter(
            self.store, self.backend.holdings,
            f"{socket.gethostname()}:{os.getpid()}:{id(self):x}",
            float(config.costs.meter_interval), gpu_classes=dict(config.gpu_classes),
            costs=config.costs,
            bases=lambda: {a.name: a.base for a in self.models.catalog.adapters.values()})
        self._tasks: list[asyncio.Task[None]] = []
        self._store_open = False
        self._serving = False

    async def _open_store(self) -> bool:
        if self._store_open:
            return True
        try:
            await self.store.open()
        except StoreUnavailableError as exc:
            self.models.store_error = exc.message
            return False
        self._store_open = True
        return True

    async def start(self) -> None:
        await self.backend.start()
        # The scheduler is told about a catalog only once it has been read
        # from the store: handed the declared models alone during an outage,
        # a Nomad reconciler would deregister every runtime model's job.
        self.models.subscribe(self.backend.apply)
        if await self._open_store():
            try:
                await self.models.load()
            except StoreUnavailableError as exc:
                log.warning("the store cannot be read; routing the declared models and "
                            "refusing changes until it is back: %s", exc.message)
        else:
            log.warning("the store is unreachable; routing the declared models and refusing "
                        "changes until it is back: %s", self.models.store_error)
        self._tasks.append(asyncio.create_task(self._follow(), name="llmgw-catalog-watch"))
        self._tasks.append(asyncio.create_task(self.cost_meter.run(), name="llmgw-cost-meter"))
        if self.relay is not None:
            self.relay.start()
        else:
            await self.gateway.start()
        self._serving = True

    async def _follow(self) -> None:
        """Keep the catalog in step with the store (other processes' changes)."""
        while True:
            await asyncio.sleep(self._watch_interval)
            try:
                if await self._open_store():
                    await self.models.refresh()
            except Exception:
                log.exception("following the catalog failed; serving the one in force")

    async def close(self) -> None:
        self._serving = False
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self.relay is not None:
            await self.relay.close()
        await self.gateway.close()
        await self.backend.close()
        if self._store_open:
            await self.store.close()
            self._store_open = False

    async def asgi(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Until start() has finished, /v1 falls through to the API (404): no
        # request is routed against a catalog that is not loaded yet.
        if scope["type"] == "http" and is_private(scope["path"], self.config) and (
                await refuse_unless_admin(scope, send, self.config)):
            return
        if scope["type"] == "http" and self._serving:
            path: str = scope["path"]
            if self.relay is not None:
                if path.startswith(RELAY_PREFIX):
                    await self.relay(scope, receive, send)
                    return
            elif path.startswith("/v1/") or path == "/metrics":
                await self.gateway(scope, receive, send)
                return
        await self.api(scope, receive, send)  # type: ignore[arg-type]
