"""Active health probes of external models' ``upstream`` replicas.

A scheduled model's replicas come from its scheduler, which health-checks
them (Nomad's checks, the embedded scheduler's own): a replica that fails is
simply no longer listed. A static ``upstream`` list has no such judge, so
without probes the gateway learned a replica was down only by failing a
client's request on it, and learned it was back only when the ejection that
failure earned ran out (up to ``gateway.eject_max``, two minutes by default).

``UpstreamProber`` asks every upstream replica for its model's
``health.path`` every ``health.interval``. A replica that cannot be reached,
times out or answers 5xx is *down*: ``Gateway.replicas`` leaves it out, so it
gets no request. When a down replica answers again it is up at once, and the
ejection its failed requests earned is forgiven (``Balancer.recovered``): a
restarted replica gets traffic within one probe interval. A replica that
passes its probes but fails requests is not forgiven by them; its ejection
runs its course, since the probe saw nothing change.

Each gateway publishes what its probes found (``report``, a store report beside
the scaler's), so the control plane shows a dead upstream as down rather than
"ok".

Probes are bounded like engine scrapes: a timeout each, a cap on how many run
at once, and each answer's body is not read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable

import aiohttp

from llmgw.catalog.model import Model
from llmgw.gateway.proxy import target_url
from llmgw.gateway.routing import Balancer
from llmgw.redact import redact_url, scrub
from llmgw.scheduler.base import ProbeReport

log = logging.getLogger("llmgw.gateway.probes")

# How often the prober looks for probes that are due (each replica is probed
# every health.interval of its model).
TICK = 0.25


class UpstreamProber:
    """Probes the upstream replicas of ``models()``; ``down`` holds those that failed."""

    def __init__(self, balancer: Balancer, models: Callable[[], Iterable[Model]],
                 clock: Callable[[], float], *, concurrency: int = 16,
                 on_change: Callable[[], None] | None = None) -> None:
        self.balancer = balancer
        self.models = models
        self.clock = clock
        self.on_change = on_change
        self.down: set[str] = set()
        self._due: dict[str, float] = {}
        self._gate = asyncio.Semaphore(concurrency)
        self._session: aiohttp.ClientSession | None = None
        self._running: set[asyncio.Task[None]] = set()
        self.probes = 0

    def _targets(self) -> dict[str, Model]:
        out: dict[str, Model] = {}
        for model in self.models():
            if model.upstream and model.health.path is not None:
                for url in model.upstream:
                    out.setdefault(url, model)
        return out

    async def run(self) -> None:
        try:
            while True:
                try:
                    self.tick()
                except Exception:
                    log.exception("probing the upstream replicas failed; retrying")
                await asyncio.sleep(TICK)
        finally:
            for task in self._running:
                task.cancel()
            await asyncio.gather(*self._running, return_exceptions=True)

    def tick(self) -> None:
        """Start the probes that are due; forget replicas no longer in the catalog."""
        now = self.clock()
        targets = self._targets()
        for url in [u for u in self._due if u not in targets]:
            del self._due[url]
        if self.down - targets.keys():
            self.down &= targets.keys()
        for url, model in targets.items():
            if self._due.get(url, now) > now:
                continue
            self._due[url] = now + float(model.health.interval)
            task = asyncio.create_task(self._probe(url, model), name="llmgw-upstream-probe")
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _probe(self, url: str, model: Model) -> None:
        assert model.health.path is not None
        probe = target_url(url, model.health.path)
        async with self._gate:
            try:
                async with asyncio.timeout(float(model.health.timeout)):
                    async with self._client().get(probe, allow_redirects=False) as resp:
                        status = resp.status
                problem = f"HTTP {status}" if status >= 500 else None
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                problem = str(exc) or type(exc).__name__
        self.probes += 1
        if problem is not None:
            if url not in self.down:
                self.down.add(url)
                log.warning("upstream %s of model %r fails its health probe (%s: %s); no "
                            "requests go to it until it passes", redact_url(url), model.name,
                            redact_url(probe), scrub(problem, (url, probe)))
                self._changed()
        elif url in self.down:
            self.down.discard(url)
            self.balancer.recovered(url)
            log.info("upstream %s of model %r passes its health probe again", redact_url(url),
                     model.name)
            self._changed()

    def report(self) -> ProbeReport:
        """What the probes found, per model, for the control plane to show."""
        probed: dict[str, int] = {}
        down: dict[str, list[str]] = {}
        for url, model in self._targets().items():
            probed[model.name] = probed.get(model.name, 0) + 1
            if url in self.down:
                down.setdefault(model.name, []).append(redact_url(url))
        return ProbeReport(probed=probed, down=down)

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=4.0),
                skip_auto_headers=("User-Agent",), auto_decompress=False)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            with contextlib.suppress(Exception):
                await self._session.close()
            self._session = None
