"""``llmgw serve --workers N``: one control process and N gateway worker processes on one port.

Python runs one thread of the gateway at a time, so a second core needs a
second process. The question is what each process runs, and the answer is
fixed by the embedded scheduler: its engines are the children of exactly one
process, and a second scheduler would count the same cores twice. So:

* the **control process** (the one ``llmgw serve`` started) runs the store,
  the catalog, the scheduler (local engines or Nomad's reconciler), and the
  control API and admin page — on a Unix socket in a private directory, not
  on the port. It binds the port, starts the workers, restarts one that dies
  (with back-off), and stops them when it stops. A worker that crashes never
  takes an engine down with it.
* each **worker** accepts on the shared port (the socket is bound once and
  handed to every worker, so the kernel's accept queue survives a worker's
  restart) and runs a whole gateway: keys, routing, engine scrapes, admission,
  its part of the scaler. It follows the catalog through the store like any
  second instance would, reads the scheduler through the relay
  (``llmgw.scheduler.relay``), and passes every request that is not the
  gateway's (``/api``, the admin page) to the control process unchanged.

Rejected: N identical processes each running everything, electing one
scheduler through the store lease. The elected one would own the engines and
the others would have no endpoints and no replicas to show; making them ask
the elected one is this design again, with an election and a failover of the
engines' parent added.

What stays single across the workers: the scheduler (above); the scaler and
on-demand scale-ups (the store leases, as across instances); the reconciler.
What is per worker: rate-limit buckets and admission queues (as per
instance; the scaler sums the workers' published loads), and passive health.
Metrics are summed over the workers at scrape time (prometheus_client's
multiprocess mode, ``llmgw.gateway.metrics``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable, MutableMapping
from multiprocessing.process import BaseProcess
from typing import Any

import aiohttp
import msgspec

from llmgw.config import ServerConfig, load_config, split_listen
from llmgw.connection import uvicorn_options
from llmgw.control.identity import is_private, refuse_unless_admin
from llmgw.errors import StoreUnavailableError
from llmgw.gateway.app import Gateway
from llmgw.modelsvc import ModelService
from llmgw.scheduler.relay import PREFIX as RELAY_PREFIX
from llmgw.scheduler.relay import RelayRouting
from llmgw.store import open_store

log = logging.getLogger("llmgw.workers")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]

# Headers of one hop, not passed on by the proxy to the control process.
_HOP = frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"upgrade", b"te",
                  b"trailer", b"proxy-connection", b"content-length"})
_MAX_CONTROL_BODY = 64 * 1024 * 1024


class WorkerArgs(msgspec.Struct, frozen=True, kw_only=True):
    config_path: str
    listen: str | None
    control_socket: str
    log_level: str


def control_paths() -> tuple[str, str]:
    """A private directory (mode 0700) and the control socket's path in it."""
    directory = tempfile.mkdtemp(prefix="llmgw-control-")
    os.chmod(directory, 0o700)
    return directory, os.path.join(directory, "control.sock")


def bind(listen: str, backlog: int = 2048) -> socket.socket:
    host, port = split_listen(listen)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(backlog)
    sock.set_inheritable(True)
    return sock


# ---------------------------------------------------------------- the worker


class WorkerApp:
    """One worker's ASGI application: the gateway, and a pass-through to the control process."""

    def __init__(self, config: ServerConfig, control_socket: str, config_name: str,
                 watch_interval: float = 0.5) -> None:
        self.config = config
        self.control_socket = control_socket
        self.store = open_store(config.database)
        self.routing = RelayRouting(control_socket)
        self.models = ModelService(config.models, dict(config.gpu_classes), self.store,
                                   config_name=config_name, runtime=config.runtime,
                                   declared_adapters=config.adapters)
        self.gateway = Gateway(config, self.models, self.routing, self.store)
        self._watch_interval = watch_interval
        self._tasks: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None
        self._serving = False
        self._store_open = False
        # Whether the server has been asked to stop (set by worker_main).
        self.stopping: Callable[[], bool] = lambda: False

    async def start(self) -> None:
        try:
            await self.store.open()
            self._store_open = True
            await self.models.load()
        except StoreUnavailableError as exc:
            log.warning("the store is unreachable; routing the declared models: %s", exc.message)
        self.routing.start()
        # The endpoints before the first request, for up to 10 s; a stop asked
        # for meanwhile (uvicorn only notes the signal until start-up ends)
        # is not kept waiting.
        for _ in range(100):
            if self.stopping():
                break
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.1):
                    await self.routing.synced.wait()
                    break
        self._tasks.append(asyncio.create_task(self._follow(), name="llmgw-worker-catalog"))
        parent = os.getppid()
        self._tasks.append(asyncio.create_task(self._orphaned(parent), name="llmgw-orphan"))
        await self.gateway.start()
        self._serving = True

    async def close(self) -> None:
        self._serving = False
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.gateway.close()
        await self.routing.close()
        if self._session is not None:
            await self._session.close()
        if self._store_open:
            await self.store.close()

    async def _follow(self) -> None:
        while True:
            await asyncio.sleep(self._watch_interval)
            try:
                if not self._store_open:
                    await self.store.open()
                    self._store_open = True
                await self.models.refresh()
            except StoreUnavailableError:
                pass
            except Exception:
                log.exception("following the catalog failed; serving the one in force")

    async def _orphaned(self, parent: int) -> None:
        """A worker whose control process is gone stops (its engines' parent is gone too)."""
        while True:
            await asyncio.sleep(1.0)
            if os.getppid() != parent:
                break
        log.error("the control process %d is gone; this gateway worker stops", parent)
        os.kill(os.getpid(), signal.SIGTERM)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await self.start()
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await self.close()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if kind != "http":
            return
        path: str = scope["path"]
        if is_private(path, self.config) and await refuse_unless_admin(scope, send,
                                                                       self.config):
            return
        if self._serving and (path.startswith("/v1/") or path == "/metrics"):
            await self.gateway(scope, receive, send)
        elif path.startswith(RELAY_PREFIX):
            await _plain(send, 404, b"not found\n")
        else:
            await self._to_control(scope, receive, send)

    async def _to_control(self, scope: Scope, receive: Any, send: Any) -> None:
        """The request, unchanged, to the control API in the control process."""
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > _MAX_CONTROL_BODY:
                await _plain(send, 413, b"request body too large\n")
                return
            if not message.get("more_body"):
                break
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=self.control_socket),
                auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar(),
                timeout=aiohttp.ClientTimeout(total=300))
        query = scope.get("query_string", b"")
        target = scope.get("raw_path") or scope["path"].encode()
        url = "http://control" + target.decode("latin-1") + (
            "?" + query.decode("latin-1") if query else "")
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]
                   if k not in _HOP]
        try:
            async with self._session.request(
                    scope["method"], url, data=body, headers=headers, allow_redirects=False,
                    skip_auto_headers=("User-Agent", "Content-Type")) as r:
                data = await r.read()
                out = [(k.lower(), v) for k, v in r.raw_headers if k.lower() not in _HOP]
                status = r.status
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            await _plain(send, 503, f"the control process does not answer: {exc}\n".encode())
            return
        out.append((b"content-length", str(len(data)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": out})
        await send({"type": "http.response.body", "body": data})


async def _plain(send: Any, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def worker_main(args: WorkerArgs, sock: socket.socket) -> None:
    """The entry point of a worker process (spawned, so it starts from a clean interpreter)."""
    import uvicorn

    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()), stream=sys.stderr,
        format=f"%(asctime)s %(levelname)-7s worker-{os.getpid()} %(name)s: %(message)s")
    config = load_config(args.config_path)
    if args.listen:
        config = msgspec.structs.replace(config, listen=args.listen)
    app = WorkerApp(config, args.control_socket, args.config_path)
    server = uvicorn.Server(uvicorn.Config(
        app, lifespan="on", log_level=args.log_level, access_log=False, interface="asgi3",
        timeout_graceful_shutdown=30, **uvicorn_options(config.gateway)))
    app.stopping = lambda: server.should_exit
    server.run(sockets=[sock])


# ---------------------------------------------------------------- the control process


class Workers:
    """Starts, watches and stops the worker processes."""

    def __init__(self, count: int, args: WorkerArgs, sock: socket.socket,
                 stopping: Callable[[], bool]) -> None:
        self.count = count
        self.args = args
        self.sock = sock
        self.stopping = stopping
        self._context = multiprocessing.get_context("spawn")
        self._procs: list[BaseProcess | None] = [None] * count
        self._failures = [0] * count
        self.metrics_dir = tempfile.mkdtemp(prefix="llmgw-metrics-")
        # Read by prometheus_client when a worker imports it: every worker
        # writes its figures to files here, summed at scrape time.
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = self.metrics_dir

    def _spawn(self, i: int) -> None:
        proc = self._context.Process(target=worker_main, args=(self.args, self.sock),
                                     name=f"llmgw-gateway-{i}", daemon=False)
        proc.start()
        self._procs[i] = proc
        log.info("gateway worker %d started (pid %s)", i, proc.pid)

    async def run(self) -> None:
        """Start the workers and restart any that dies, until ``stopping()``."""
        for i in range(self.count):
            self._spawn(i)
        started = [time.monotonic()] * self.count
        while not self.stopping():
            await asyncio.sleep(0.5)
            for i, proc in enumerate(self._procs):
                if proc is None or proc.is_alive() or self.stopping():
                    continue
                from prometheus_client import multiprocess

                if proc.pid is not None:
                    multiprocess.mark_process_dead(  # type: ignore[no-untyped-call]
                        proc.pid, self.metrics_dir)
                lived = time.monotonic() - started[i]
                self._failures[i] = 0 if lived > 60 else self._failures[i] + 1
                delay = min(30.0, 0.5 * 2 ** self._failures[i])
                log.error("gateway worker %d (pid %s) exited with %s; restarting it in %.1fs",
                          i, proc.pid, proc.exitcode, delay)
                self._procs[i] = None
                await asyncio.sleep(delay)
                if self.stopping():
                    return
                self._spawn(i)
                started[i] = time.monotonic()

    async def stop(self, grace: float = 35.0) -> None:
        procs = [p for p in self._procs if p is not None]
        for proc in procs:
            if proc.is_alive() and proc.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in procs:
            await asyncio.to_thread(proc.join, max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                await asyncio.to_thread(proc.join, 5)
        shutil.rmtree(self.metrics_dir, ignore_errors=True)
