"""The scheduler's routing face, relayed from the control process to gateway worker processes.

With ``llmgw serve --workers N`` exactly one process owns the scheduler: the
embedded scheduler's engines are its child processes, and two schedulers
would count the same cores twice. The gateway workers still need what
``Routing`` gives — the healthy endpoints (read on every request, so from
memory), word when they change, the status of a model, the scheduler's
health and ``set_demand`` — so the control process serves them over a Unix socket and
each worker keeps a copy:

* ``GET /_relay/routing?after=V&wait=S`` answers the endpoints and status of
  every scheduled model, and the scheduler's health, as of version ``V + 1``
  or later, holding the request up to ``S`` seconds until there is one (a
  long poll, as Nomad's blocking queries, so a change reaches the workers at
  once and an idle fleet costs one request per ``S`` per worker);
* ``POST /_relay/demand`` calls ``set_demand`` on the real scheduler and
  answers its error, if any, in the control API's error shape;
* ``POST /_relay/stage`` calls ``stage_adapter`` (fetching an adapter onto a
  replica's node, on Nomad) and answers when it is done, or its error; which
  replicas' disks hold which adapters comes with each snapshot (``warm``).

A worker that cannot reach the control process keeps routing to the
endpoints it last knew (as the Nomad backend does through a Nomad outage)
and asks again with back-off. The socket sits in a directory only the
server's user can enter; the workers' proxy of the control API refuses the
``/_relay`` prefix, so it is never reachable from the network.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from typing import Any

import aiohttp
import msgspec

from llmgw.catalog.adapter import Adapter
from llmgw.errors import (
    BackendUnavailableError,
    DefinitionError,
    LlmgwError,
    NotFoundError,
    RefusedError,
    UnavailableError,
)
from llmgw.scheduler.base import BackendHealth, ModelStatus, Routing

log = logging.getLogger("llmgw.relay")

PREFIX = "/_relay"
# How long one long poll is held; the worker asks again at once after it.
POLL = 20.0
# A worker's view of the scheduler's health before its first snapshot arrives.
_UNREAD = BackendHealth(ok=False, message="the control process has not yet told this gateway "
                                          "worker the scheduler's state")


class Snapshot(msgspec.Struct, frozen=True, kw_only=True):
    version: int
    endpoints: dict[str, list[str]]
    status: dict[str, ModelStatus]
    profiles: dict[str, str] = {}       # endpoint → the profile it runs, where known
    health: BackendHealth = _UNREAD
    warm: dict[str, list[str]] = {}     # adapter → endpoints whose disk holds it


class _Demand(msgspec.Struct, frozen=True):
    model: str
    replicas: int


class _Stage(msgspec.Struct, frozen=True):
    adapter: str
    address: str
    again: bool = False


class _Failure(msgspec.Struct, frozen=True):
    status: int
    message: str


# The control process's error, raised in the worker as the same kind.
_ERRORS: dict[int, type[LlmgwError]] = {
    400: DefinitionError, 404: NotFoundError, 409: RefusedError, 503: UnavailableError}

_snapshot = msgspec.json.Decoder(Snapshot)
_demand = msgspec.json.Decoder(_Demand)
_stage = msgspec.json.Decoder(_Stage)
_failure = msgspec.json.Decoder(_Failure)
_encode = msgspec.json.Encoder().encode

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]


class RoutingRelay:
    """The control process's side: watches its scheduler, answers the workers."""

    def __init__(self, backend: Routing, models: Callable[[], Iterable[str]],
                 adapters: Callable[[], Mapping[str, Adapter]] = dict) -> None:
        self.backend = backend
        self.models = models
        self.adapters = adapters
        self._snapshot = Snapshot(version=0, endpoints={}, status={})
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._take()
        self._task = asyncio.create_task(self._watch(), name="llmgw-relay-watch")

    async def close(self) -> None:
        """Stop watching and answer every held poll now: a server shutting down
        waits for its open requests, and a poll would hold it for ``POLL``."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._changed.set()

    async def _held(self, receive: Any, wait: float) -> bool:
        """Hold a poll until the snapshot changes or ``wait`` passes (True), or until
        the worker hangs up (False: nobody is left to answer)."""
        changed = asyncio.ensure_future(self._changed.wait())
        gone = asyncio.ensure_future(_hung_up(receive))
        try:
            await asyncio.wait((changed, gone), timeout=wait,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in (changed, gone):
                waiter.cancel()
            await asyncio.gather(changed, gone, return_exceptions=True)
        return not (gone.done() and not gone.cancelled())

    def _take(self) -> None:
        names = list(self.models())
        endpoints = {n: self.backend.endpoints(n) for n in names}
        status = {n: self.backend.status(n) for n in names}
        profiles = {url: p for urls in endpoints.values() for url in urls
                    if (p := self.backend.profile_of(url)) is not None}
        health = self.backend.health()
        warm = {a.name: [u for u in endpoints.get(a.base, ()) if self.backend.adapter_warm(a, u)]
                for a in self.adapters().values()}
        old = self._snapshot
        # The first snapshot is version 1 even when empty: a worker that has
        # none (version 0) is answered at once.
        if (old.version == 0 or endpoints != old.endpoints or status != old.status
                or profiles != old.profiles or health != old.health or warm != old.warm):
            self._snapshot = Snapshot(version=old.version + 1, endpoints=endpoints,
                                      status=status, profiles=profiles, health=health,
                                      warm=warm)
            self._changed.set()
            self._changed = asyncio.Event()

    async def _watch(self) -> None:
        # Status (desired, waiting for capacity) changes without an endpoint
        # change, so the scheduler is also read once a second.
        while True:
            await self.backend.wait_changed(1.0)
            try:
                self._take()
            except Exception:
                log.exception("reading the scheduler for the gateway workers failed")

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        path: str = scope["path"]
        if path == f"{PREFIX}/routing":
            query = dict(part.split("=", 1) for part in
                         scope.get("query_string", b"").decode().split("&") if "=" in part)
            try:
                after, wait = int(query.get("after", "0")), float(query.get("wait", POLL))
            except ValueError:
                await _answer(send, 400, _encode(_Failure(400, "after and wait are numbers")))
                return
            if self._snapshot.version <= after and not await self._held(receive, min(wait, POLL)):
                return
            await _answer(send, 200, _encode(self._snapshot))
        elif path == f"{PREFIX}/stage" and scope["method"] == "POST":
            try:
                asked_stage = _stage.decode(await _body(receive))
                adapter = self.adapters().get(asked_stage.adapter)
                if adapter is None:
                    raise NotFoundError(f"no adapter named {asked_stage.adapter!r}")
                await self.backend.stage_adapter(adapter, asked_stage.address,
                                                 again=asked_stage.again)
            except LlmgwError as exc:
                await _answer(send, exc.status, _encode(_Failure(exc.status, exc.message)))
                return
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                await _answer(send, 400, _encode(_Failure(400, str(exc))))
                return
            self._take()
            await _answer(send, 200, b"{}")
        elif path == f"{PREFIX}/demand" and scope["method"] == "POST":
            body = await _body(receive)
            try:
                asked = _demand.decode(body)
                await self.backend.set_demand(asked.model, asked.replicas)
            except LlmgwError as exc:
                await _answer(send, exc.status, _encode(_Failure(exc.status, exc.message)))
                return
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                await _answer(send, 400, _encode(_Failure(400, str(exc))))
                return
            self._take()
            await _answer(send, 200, b"{}")
        else:
            await _answer(send, 404, _encode(_Failure(404, f"no relay endpoint {path}")))


async def _body(receive: Any) -> bytes:
    body = b""
    while True:
        message = await receive()
        body += bytes(message.get("body", b""))
        if not message.get("more_body"):
            return body


async def _hung_up(receive: Any) -> None:
    """Return once the client has disconnected (a GET's one request message comes first)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _answer(send: Any, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class RelayRouting:
    """A gateway worker's ``Routing``: a copy of the control process's scheduler view."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self._snapshot = Snapshot(version=0, endpoints={}, status={})
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None
        self.synced = asyncio.Event()

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=self.socket_path),
                timeout=aiohttp.ClientTimeout(total=POLL + 10))
        return self._session

    def start(self) -> None:
        self._task = asyncio.create_task(self._follow(), name="llmgw-relay-follow")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _follow(self) -> None:
        failures = 0
        while True:
            try:
                async with self._client().get(
                        f"http://control{PREFIX}/routing",
                        params={"after": str(self._snapshot.version), "wait": str(POLL)}) as r:
                    data = await r.read()
                snapshot = _snapshot.decode(data)
            except (aiohttp.ClientError, OSError, TimeoutError, msgspec.DecodeError,
                    msgspec.ValidationError) as exc:
                failures += 1
                if failures == 1:
                    log.warning("cannot read the scheduler from the control process (%s); "
                                "routing to the replicas last known", exc)
                await asyncio.sleep(min(5.0, 0.1 * 2 ** min(failures, 6)))
                continue
            if failures:
                log.info("the control process answers again")
            failures = 0
            if snapshot.version != self._snapshot.version:
                self._snapshot = snapshot
                self._changed.set()
                self._changed = asyncio.Event()
            self.synced.set()

    def endpoints(self, model: str) -> list[str]:
        return self._snapshot.endpoints.get(model, [])

    def profile_of(self, address: str) -> str | None:
        return self._snapshot.profiles.get(address)

    async def wait_changed(self, timeout: float) -> None:  # noqa: ASYNC109 (the Protocol's)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._changed.wait()

    def status(self, model: str) -> ModelStatus:
        return self._snapshot.status.get(model, ModelStatus())

    def health(self) -> BackendHealth:
        """As the control process last said: a worker cut off from it keeps that view,
        as it keeps routing to the endpoints it last knew."""
        return self._snapshot.health

    def adapter_warm(self, adapter: Adapter, address: str) -> bool:
        return address in self._snapshot.warm.get(adapter.name, ())

    async def stage_adapter(self, adapter: Adapter, address: str, *,
                            again: bool = False) -> None:
        # No bound of its own: the gateway's (adapter_load_wait) cancels it.
        await self._post("stage", _encode(_Stage(adapter.name, address, again)),
                         aiohttp.ClientTimeout(total=None, connect=10))

    async def set_demand(self, model: str, replicas: int) -> None:
        await self._post("demand", _encode(_Demand(model, replicas)))

    async def _post(self, what: str, body: bytes,
                    bound: aiohttp.ClientTimeout | None = None) -> None:
        try:
            session = self._client()
            async with session.post(f"http://control{PREFIX}/{what}", data=body,
                                    timeout=bound or session.timeout) as r:
                status, data = r.status, await r.read()
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise BackendUnavailableError(
                f"the control process of this llmgw does not answer on {self.socket_path} "
                f"({exc}); check that `llmgw serve` is still running") from None
        if status != 200:
            try:
                failure = _failure.decode(data)
            except (msgspec.DecodeError, msgspec.ValidationError):
                failure = _Failure(status, data.decode("utf-8", "replace")[:300])
            cls = _ERRORS.get(failure.status, LlmgwError)
            raise cls(failure.message)
