"""Reading each replica's engine: its queue and cache state, scraped about once a second.

The gateway routes on what it can count itself (requests in flight from this
process) and on what only the engine knows: requests running and waiting
across every gateway, KV-cache usage and prefix-cache hits. vLLM, SGLang and
llama.cpp's server publish those on ``/metrics`` in Prometheus' text format;
``parse_metrics`` reads just the lines it needs (a vLLM page is mostly
histogram buckets, and a full parser would spend most of its time on them).

* running: ``vllm:num_requests_running``, ``sglang:num_running_reqs``,
  ``llamacpp:requests_processing``;
* waiting: ``vllm:num_requests_waiting``, ``sglang:num_queue_reqs``,
  ``llamacpp:requests_deferred``;
* KV cache used (0..1): ``vllm:kv_cache_usage_perc`` (``gpu_cache_usage_perc``
  before vLLM 0.10), ``sglang:token_usage`` (the share of the KV pool's
  tokens in use, srt/metrics/collector.py), ``llamacpp:kv_cache_usage_ratio``;
* prefix cache, in tokens: ``vllm:prefix_cache_queries_total`` and
  ``vllm:prefix_cache_hits_total`` (SGLang publishes a hit rate, not the
  counts; llama.cpp has neither).

llama.cpp's server publishes ``/metrics`` only when started with ``--metrics``,
SGLang's only with ``--enable-metrics``. Which models are scraped follows their
dialect (``Model.scrapes_engine``): an external vLLM, SGLang or llama.cpp
server is, as a scheduled replica is; an OpenAI-compatible service is not.

Values are summed over label sets (one engine process serves one model, but
a data-parallel vLLM reports one series per engine core).

**A scrape never holds up a request.** Routing reads only the last sample,
kept in the ``Balancer``; a sample older than its ``signal_ttl`` is ignored.
Scrapes are bounded: a timeout each, a cap on how many run at once, a cap on
the bytes read. A replica whose ``/metrics`` is missing or unreadable
(llama-cpp-python's server has none) is routed by in-flight counts, logged
once until it answers again, and asked again with a growing interval (up to
30 s) rather than every second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable, Iterable

import aiohttp

from llmgw.gateway.proxy import target_url
from llmgw.gateway.routing import Balancer, EngineSample
from llmgw.redact import redact_url, scrub

log = logging.getLogger("llmgw.gateway.signals")

_RUNNING = (b"vllm:num_requests_running", b"sglang:num_running_reqs",
            b"llamacpp:requests_processing")
_WAITING = (b"vllm:num_requests_waiting", b"sglang:num_queue_reqs",
            b"llamacpp:requests_deferred")
_KV = (b"vllm:kv_cache_usage_perc", b"vllm:gpu_cache_usage_perc", b"sglang:token_usage",
       b"llamacpp:kv_cache_usage_ratio")
_QUERIES = (b"vllm:prefix_cache_queries_total", b"vllm:gpu_prefix_cache_queries_total")
_HITS = (b"vllm:prefix_cache_hits_total", b"vllm:gpu_prefix_cache_hits_total")
_WANTED = {name: kind for kind, names in (("running", _RUNNING), ("waiting", _WAITING),
                                          ("kv", _KV), ("queries", _QUERIES),
                                          ("hits", _HITS)) for name in names}
MAX_BYTES = 4 * 1024 * 1024


def parse_metrics(text: bytes) -> EngineSample | None:
    """The engine's figures from a Prometheus text page, or None if it has neither queue count."""
    found: dict[str, float] = {}
    for line in text.split(b"\n"):
        if not line or line[0] == 35:   # '#': HELP and TYPE lines
            continue
        brace = line.find(b"{")
        space = line.find(b" ")
        end = brace if 0 <= brace < space or (brace >= 0 and space < 0) else space
        kind = _WANTED.get(line[:end]) if end > 0 else None
        if kind is None:
            continue
        rest = line[line.rfind(b"}") + 1:] if brace >= 0 else line[end:]
        fields = rest.split()
        if not fields:
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        if math.isfinite(value):
            found[kind] = found.get(kind, 0.0) + value
    if "running" not in found and "waiting" not in found:
        return None
    return EngineSample(
        running=int(found.get("running", 0)), waiting=int(found.get("waiting", 0)),
        kv_usage=found.get("kv"), prefix_queries=found.get("queries"),
        prefix_hits=found.get("hits"))


class SignalScraper:
    """Scrapes the replicas ``targets()`` names into ``balancer`` every ``interval``."""

    def __init__(self, balancer: Balancer, targets: Callable[[], Iterable[str]],
                 clock: Callable[[], float], *, interval: float = 1.0, timeout: float = 0.5,
                 concurrency: int = 16,
                 on_round: Callable[[], None] | None = None,
                 on_page: Callable[[str, bytes], None] | None = None) -> None:
        self.balancer = balancer
        self.targets = targets
        self.clock = clock
        self.interval = interval
        self.timeout = timeout
        self.on_round = on_round
        # Each page read, whole: what else is on it (LoRA adapters, ``gateway.adapters``).
        self.on_page = on_page
        self._gate = asyncio.Semaphore(concurrency)
        self._session: aiohttp.ClientSession | None = None
        self._failing: dict[str, tuple[int, float]] = {}   # url → (failures, next try)
        self.rounds = 0

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=4.0),
                timeout=aiohttp.ClientTimeout(total=self.timeout),
                skip_auto_headers=("User-Agent",))
        return self._session

    async def run(self) -> None:
        while True:
            started = self.clock()
            try:
                await self.scrape_all()
            except Exception:
                log.exception("scraping the engines failed; routing on in-flight counts")
            await asyncio.sleep(max(0.05, self.interval - (self.clock() - started)))

    async def scrape_all(self) -> None:
        now = self.clock()
        urls = [u for u in dict.fromkeys(self.targets())
                if self._failing.get(u, (0, -math.inf))[1] <= now]
        await asyncio.gather(*(self._scrape(u) for u in urls))
        live = set(self.targets())
        for url in [u for u in self._failing if u not in live]:
            del self._failing[url]
        self.rounds += 1
        if self.on_round is not None:
            self.on_round()

    async def _scrape(self, url: str) -> None:
        async with self._gate:
            try:
                status, body = await self._fetch(url)
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                self._failed(url, str(exc) or type(exc).__name__)
                return
        if status == 200 and self.on_page is not None:
            self.on_page(url, body)
        sample = parse_metrics(body) if status == 200 else None
        if sample is None:
            self._failed(url, f"HTTP {status}" if status != 200 else
                         "no vLLM, SGLang or llama.cpp queue figures on the page")
            return
        self.balancer.observe(url, sample, self.clock())
        if self._failing.pop(url, None) is not None:
            log.info("engine metrics at %s answer again; routing on them", redact_url(url))

    async def _fetch(self, url: str) -> tuple[int, bytes]:
        async with self._client().get(target_url(url, "/metrics")) as resp:
            return resp.status, await resp.content.read(MAX_BYTES)

    def _failed(self, url: str, reason: str) -> None:
        self.balancer.observe(url, None, self.clock())
        failures, _ = self._failing.get(url, (0, 0.0))
        if failures == 0:
            log.warning("cannot read engine metrics at %s (%s); routing to it by in-flight "
                        "counts", redact_url(target_url(url, "/metrics")), scrub(reason, (url,)))
        delay = min(30.0, self.interval * 2 ** min(failures, 5))
        self._failing[url] = (failures + 1, self.clock() + delay)

    async def close(self) -> None:
        if self._session is not None:
            with contextlib.suppress(Exception):
                await self._session.close()
            self._session = None

