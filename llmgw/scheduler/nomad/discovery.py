"""Where each model's healthy replicas are, from Nomad's service discovery.

Nomad's catalog does not filter by health (docs/nomad-api.md §4.4): a group
service is registered before its task starts, so a replica that is still
loading 140 GB of weights is listed next to one that is serving. Routing to
the list as given is the classic failure of LLM gateways. So two loops
cooperate here:

* a **watcher** holds a blocking query on ``/v1/services``; Nomad's index for
  it is the whole registrations table, so it wakes on any change anywhere,
  and then re-reads ``/v1/service/llmgw-<model>`` for each model of the
  catalog. One long poll covers every model, where one per model would park
  a thread per model for nothing: every one of them would wake together.
* a **check poller** reads ``/v1/allocation/:id/checks`` for every registered
  allocation, every ``check_interval`` and whenever the registrations change.

A replica is an endpoint only when every check of its allocation has run and
passed. When Nomad cannot be reached, neither loop overwrites what it knew:
the gateway keeps routing to the replicas last known healthy, and the
loops retry with back-off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping

from llmgw.errors import BackendUnavailableError, LlmgwError, NotFoundError
from llmgw.scheduler.nomad import wire
from llmgw.scheduler.nomad.client import NomadClient
from llmgw.scheduler.nomad.offload import Offloader
from llmgw.scheduler.nomad.render import job_id

log = logging.getLogger("llmgw.nomad")


def backoff_delay(failures: int, base: float = 1.0, cap: float = 60.0) -> float:
    """Seconds before retry number ``failures`` (1, 2, 4, … up to ``cap``)."""
    if failures <= 0:
        return 0.0
    return float(min(cap, base * 2 ** min(failures - 1, 30)))


def checks_pass(checks: Mapping[str, wire.CheckStatus]) -> bool:
    """Every check has run and passed. No checks yet (``null``) is not healthy."""
    return bool(checks) and all(c.Status == "success" for c in checks.values())


def endpoint_url(reg: wire.ServiceRegistration) -> str:
    host = f"[{reg.Address}]" if ":" in reg.Address else reg.Address
    return f"http://{host}:{reg.Port}"


class Discovery:
    def __init__(self, client: NomadClient, offload: Offloader, *, wait: float = 30.0,
                 check_interval: float = 2.0, backoff_max: float = 60.0,
                 on_outage: Callable[[str, BackendUnavailableError, float], None],
                 on_ok: Callable[[str], None]) -> None:
        self._client = client
        self._offload = offload
        self._wait = wait
        self._check_interval = check_interval
        self._backoff_max = backoff_max
        self._on_outage = on_outage
        self._on_ok = on_ok
        self._models: set[str] = set()
        self.registrations: dict[str, list[wire.ServiceRegistration]] = {}
        self.alloc_health: dict[str, bool] = {}
        self._endpoints: dict[str, list[str]] = {}
        self._changed = asyncio.Event()
        self._kick = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    # ---- what the gateway reads ------------------------------------------------

    def endpoints(self, model: str) -> list[str]:
        return list(self._endpoints.get(model, ()))

    async def wait_changed(self, timeout: float) -> None:  # noqa: ASYNC109 (Backend's shape)
        event = self._changed
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await event.wait()

    def address_of(self, alloc_id: str) -> str | None:
        for regs in self.registrations.values():
            for r in regs:
                if r.AllocID == alloc_id:
                    return endpoint_url(r)
        return None

    # ---- lifecycle ----------------------------------------------------------

    def start(self) -> None:
        if not self._tasks:
            self._tasks = [asyncio.create_task(self._watch(), name="llmgw-nomad-services"),
                           asyncio.create_task(self._poll(), name="llmgw-nomad-checks")]

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks = []

    def set_models(self, names: Iterable[str]) -> None:
        """The scheduled models of the catalog in force; new ones are read at once."""
        names = set(names)
        added = names - self._models
        self._models = names
        for gone in set(self.registrations) - names:
            del self.registrations[gone]
        self._recompute()
        if added and self._tasks:
            task = asyncio.create_task(self._refresh(sorted(added)))
            task.add_done_callback(lambda t: t.cancelled() or t.exception())

    # ---- loops --------------------------------------------------------------

    async def _refresh(self, models: list[str]) -> None:
        try:
            regs = await self._offload.run(self._read_services, models)
        except LlmgwError as exc:
            log.warning("reading the services of %s failed: %s", ", ".join(models), exc)
            return
        except Exception:   # the watcher reads them again on its next wake
            log.exception("reading the services of %s failed", ", ".join(models))
            return
        self.registrations.update({m: r for m, r in regs.items() if m in self._models})
        self._recompute()
        self._kick.set()

    def _read_services(self, models: list[str]) -> dict[str, list[wire.ServiceRegistration]]:
        return {m: self._client.service(job_id(m)) for m in models}

    async def _watch(self) -> None:
        index, failures = 0, 0
        while True:
            started = time.monotonic()
            try:
                listing, new_index = await self._offload.unbounded(
                    self._client.services, index, self._wait)
                names = {s.ServiceName for ns in listing for s in ns.Services or ()}
                models = sorted(self._models)
                present = [m for m in models if job_id(m) in names]
                regs = await self._offload.run(self._read_services, present)
                self._on_ok("service discovery")
                self.registrations = {m: regs.get(m, []) for m in models if m in self._models}
                self._recompute()
                self._kick.set()
            except BackendUnavailableError as exc:
                failures += 1
                delay = backoff_delay(failures, cap=self._backoff_max)
                self._on_outage("service discovery", exc, delay)
                await asyncio.sleep(delay)
                continue
            except LlmgwError as exc:
                failures += 1
                log.warning("service discovery: %s", exc)
                await asyncio.sleep(backoff_delay(failures, cap=self._backoff_max))
                continue
            except Exception:
                # A bug, or an answer nothing expected: the loop must outlive it,
                # or every endpoint would freeze where it is. (CancelledError is
                # not an Exception, so close() still stops the loop.)
                failures += 1
                log.exception("service discovery failed unexpectedly; retrying")
                await asyncio.sleep(backoff_delay(failures, cap=self._backoff_max))
                continue
            failures = 0
            # An index that goes backwards means the servers' state was reset;
            # start over rather than block until it catches up (docs/nomad-api.md §4.3).
            unchanged = new_index == index
            index = new_index if new_index >= index else 0
            if unchanged and time.monotonic() - started < 1.0:
                await asyncio.sleep(1.0)  # a server that does not block: do not spin

    def _read_checks(self, allocs: list[str]) -> dict[str, bool]:
        out = {}
        for a in allocs:
            try:
                out[a] = checks_pass(self._client.alloc_checks(a))
            except NotFoundError:
                out[a] = False   # the allocation is gone
        return out

    async def _poll(self) -> None:
        failures = 0
        while True:
            self._kick.clear()
            delay = self._check_interval
            try:
                allocs = sorted({r.AllocID for regs in self.registrations.values()
                                 for r in regs})
                if allocs:
                    health = await self._offload.run(self._read_checks, allocs)
                    failures = 0
                    self._on_ok("health checks")
                    self.alloc_health = health
                    self._recompute()
            except BackendUnavailableError as exc:
                failures += 1
                delay = backoff_delay(failures, cap=self._backoff_max)
                self._on_outage("health checks", exc, delay)
            except LlmgwError as exc:
                log.warning("reading allocation checks: %s", exc)
            except Exception:
                # Never let the loop die (endpoints would freeze); CancelledError
                # is not an Exception, so close() still stops it.
                failures += 1
                delay = backoff_delay(failures, cap=self._backoff_max)
                log.exception("reading allocation checks failed unexpectedly; retrying")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._kick.wait()

    def _recompute(self) -> None:
        endpoints = {}
        for model in self._models:
            urls = sorted({endpoint_url(r) for r in self.registrations.get(model, ())
                           if self.alloc_health.get(r.AllocID) is True})
            if urls:
                endpoints[model] = urls
        if endpoints != self._endpoints:
            self._endpoints = endpoints
            changed, self._changed = self._changed, asyncio.Event()
            changed.set()
