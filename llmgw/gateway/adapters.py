"""Loading LoRA adapters into replicas where requests need them, and reading what each holds.

``AdapterManager`` is the forwarder's placer for adapter requests: it asks
``adapterplace.Placement`` where a request goes, loads the adapter there when
it has to (``POST /v1/load_lora_adapter``, evicting with
``/v1/unload_lora_adapter``), and holds the request until the load finishes,
at most ``gateway.adapter_load_wait`` (keep-alive comments flow meanwhile for
streams: the gateway prepares the placement inside its held-stream window).
Concurrent requests for one adapter on one replica wait for one load: loads
are keyed by (replica, adapter) and shared.

Every ``interval`` it reads each LoRA-enabled replica's ``/v1/models`` — vLLM
lists each loaded adapter there with its ``parent`` — and takes the running
and waiting adapters from ``vllm:lora_requests_info`` on each engine scrape
(``on_page``), so what one gateway process loaded is known to the others
within a second, and none loads it again. The same loop keeps pinned adapters
loaded on every replica of their base and unloads adapters the catalog no
longer has.

A load the engine refuses (not an adapter, a rank above ``--max-lora-rank``,
a path it cannot read) is tried on the next replica; when none loads it the
request is answered 503 with the engine's reason, never by the base model.

The path an engine is given: the adapter's local path in the embedded mode
(the engine runs on this machine); on Nomad, where the node's cache keeps it
(``render.cache_path`` of its mirror URL, the volume every replica mounts). Before
it asks an engine to load an adapter the manager has the scheduler bring the
weights there (``Routing.stage_adapter``: on Nomad a fetch job onto the replica's
node, ``llmgw.scheduler.nomad.adapterjob``), inside the same bound; a fetch that
fails makes that replica refuse like an engine would, with the fetch's reason. An
engine that finds nothing at the path (404) has the weights fetched again once. Of
the replicas equally placed, one whose disk holds the adapter is chosen
(``adapter_warm``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
from collections.abc import Callable, Sequence
from typing import Protocol

import aiohttp
import msgspec

from llmgw.catalog.adapter import Adapter, lora_sizes
from llmgw.catalog.build import Catalog
from llmgw.catalog.model import Model
from llmgw.catalog.source import PathSource
from llmgw.errors import LlmgwError, UnavailableError
from llmgw.gateway.adapterplace import Placement, adapter_key
from llmgw.gateway.prefix import PrefixKey
from llmgw.gateway.proxy import ForwardRequest, target_url
from llmgw.gateway.routing import Balancer
from llmgw.scheduler.nomad.render import adapter_fetch_of

log = logging.getLogger("llmgw.gateway.adapters")

_ERROR_SNIPPET = 400
_LORA_INFO = re.compile(rb"^vllm:lora_requests_info\{([^}]*)\}", re.MULTILINE)
_LABEL = re.compile(rb'(\w+)="([^"]*)"')


class AdapterUnavailableError(UnavailableError):
    """No replica of the base could load the adapter; the message has the engines' reasons."""

    code = "adapter_unavailable"

    def __init__(self, message: str, *, retry_after: float = 5.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class _Card(msgspec.Struct):
    id: str
    parent: str | None = None


class _Cards(msgspec.Struct):
    data: list[_Card] = []


_cards = msgspec.json.Decoder(_Cards)


def lora_info(page: bytes) -> tuple[list[str], list[str]] | None:
    """Running and waiting adapters from a ``/metrics`` page, or None if it has no
    ``vllm:lora_requests_info`` (labels are comma-separated names)."""
    found = _LORA_INFO.search(page)
    if found is None:
        return None
    labels = {k.decode(): v.decode() for k, v in _LABEL.findall(found.group(1))}

    def names(key: str) -> list[str]:
        return [n for n in labels.get(key, "").split(",") if n]

    return names("running_lora_adapters"), names("waiting_lora_adapters")


def adapter_path(adapter: Adapter, scheduler: str, mirror: str | None) -> str:
    """Where the replica's engine reads ``adapter`` from (see the module docstring)."""
    src = adapter.source
    if isinstance(src, PathSource):
        return os.path.abspath(os.path.expanduser(src.path))
    found = adapter_fetch_of(adapter, mirror)
    if found is not None:
        return found[1]
    raise AdapterUnavailableError(
        f"adapter {adapter.name!r}: its source {src.shown!r} is not on this machine nor in a "
        f"node's cache ({scheduler} scheduler); give a local path or a mirror URL")


class Stage(Protocol):
    async def __call__(self, adapter: Adapter, address: str, *, again: bool = False
                       ) -> None: ...


async def _nothing_to_stage(adapter: Adapter, address: str, *, again: bool = False) -> None:
    return None


class AdapterManager:
    """Places adapter requests on replicas and loads adapters into them."""

    def __init__(self, balancer: Balancer, catalog: Callable[[], Catalog],
                 replicas: Callable[[Model], list[str]], clock: Callable[[], float], *,
                 scheduler: str = "local", mirror: str | None = None,
                 profile_of: Callable[[str], str | None] = lambda _: None,
                 load_wait: float = 120.0, interval: float = 1.0,
                 on_load: Callable[[str, str, str], None] = lambda *_: None,
                 stage: Stage | None = None,
                 warm: Callable[[Adapter, str], bool] = lambda *_: False) -> None:
        self.balancer = balancer
        self.catalog = catalog
        self.replicas = replicas
        self.clock = clock
        self.scheduler = scheduler
        self.mirror = mirror
        self.profile_of = profile_of
        self.load_wait = load_wait
        self.interval = interval
        # (base, adapter, outcome) of every load asked for: the gateway's metric.
        self.on_load = on_load
        # The scheduler's: bring the adapter onto the replica's disk (Routing.stage_adapter),
        # and whether it is there already (adapter_warm).
        self.stage = stage or _nothing_to_stage
        self.warm = warm
        self.placement = Placement()
        self._loads: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._background: set[asyncio.Task[None]] = set()
        self._session: aiohttp.ClientSession | None = None
        self.loads = 0          # loads this process asked for (metrics, tests)
        self.unloads = 0

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, connect=10),
                skip_auto_headers=("User-Agent",))
        return self._session

    async def close(self) -> None:
        for task in [*self._background, *self._loads.values()]:
            task.cancel()
        await asyncio.gather(*self._background, *self._loads.values(), return_exceptions=True)
        if self._session is not None:
            with contextlib.suppress(Exception):
                await self._session.close()
            self._session = None

    # ------------------------------------------------------------ facts per base

    def _capacity(self, model: Model) -> Callable[[str], int]:
        def capacity(url: str) -> int:
            name = self.profile_of(url)
            profile = model.profile(name) if name is not None else None
            sizes = lora_sizes(model, profile or (model.profiles[0] if model.profiles else None))
            return sizes.cpu_slots if sizes is not None else 0
        return capacity

    def _pinned(self, base: str) -> set[str]:
        return {a.name for a in self.catalog().adapters_of(base) if a.pinned}

    def _queue(self, url: str) -> tuple[int, int]:
        now = self.clock()
        return self.balancer.pending(url, now), self.balancer.load(url, now)

    # ------------------------------------------------------------ the forwarder's placer

    async def place(self, req: ForwardRequest, model: Model, urls: Sequence[str],
                    tried: set[str]) -> str | None:
        """The replica to send ``req`` (for an adapter of ``model``) to, the adapter loaded
        there; None when no usable replica is left. Raises AdapterUnavailableError when
        every replica that was asked refused to load it."""
        adapter = req.adapter
        assert adapter is not None
        routing = model.routing
        refused: list[str] = []
        skip = set(tried)
        deadline = self.clock() + self.load_wait
        while True:
            now = self.clock()
            usable = [u for u in urls if u not in skip and not self.balancer.is_ejected(u, now)]
            if not usable:
                if refused:
                    raise AdapterUnavailableError(
                        f"adapter {adapter.name!r} could not be loaded on any replica of "
                        f"{model.name!r}: {'; '.join(refused[:4])}")
                return None
            key = None
            if routing.policy == "prefix-affinity":
                key = adapter_key(req.prefix_key(routing.prefix_bytes), adapter.name)

            def pick(holders: Sequence[str], now: float = now,
                     key: PrefixKey | None = key) -> str | None:
                return self.balancer.pick(holders, now, (), policy=routing.policy, key=key,
                                          load_factor=routing.load_factor)

            choice = self.placement.choose(adapter.name, usable, self._queue, pick,
                                           self._capacity(model), self._pinned(model.name),
                                           now, warm=lambda u: self.warm(adapter, u))
            if choice is None:
                # Every slot is pinned, running or just loaded: wait for one to free.
                if now >= deadline:
                    raise AdapterUnavailableError(
                        f"adapter {adapter.name!r}: every adapter slot of {model.name!r} has "
                        f"been busy for {self.load_wait:g} s (gateway.adapter_load_wait); "
                        "add replicas or slots (lora.slots)", retry_after=5.0)
                await asyncio.sleep(0.05)
                continue
            if choice.spread_to is not None:
                self._spawn(self._try_load(choice.spread_to, adapter, choice.spread_evict))
            if choice.load:
                why = await self._try_load(choice.url, adapter, choice.evict)
                if why is not None:
                    refused.append(f"{choice.url}: {why}")
                    skip.add(choice.url)
                    continue
            self.placement.used(choice.url, adapter.name, self.clock())
            return choice.url

    def loaded_where(self) -> dict[str, list[str]]:
        """Adapter → the replicas known to hold it (the admin page and the API show it)."""
        out: dict[str, list[str]] = {}
        for url in self.placement.urls():
            for name in self.placement.loaded(url):
                out.setdefault(name, []).append(url)
        return out

    def missing(self, url: str, adapter: str) -> None:
        """The engine at ``url`` answered 404 for ``adapter``: it is not loaded there."""
        self.placement.unloaded(url, adapter)

    def begin(self, url: str, adapter: str) -> None:
        self.placement.begin(url, adapter)

    def end(self, url: str, adapter: str) -> None:
        self.placement.end(url, adapter)

    # ------------------------------------------------------------ loading

    def _spawn(self, coro: object) -> None:
        task = asyncio.ensure_future(coro)  # type: ignore[call-overload]
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _try_load(self, url: str, adapter: Adapter, evict: str | None) -> str | None:
        try:
            await self.load(url, adapter, evict)
        except AdapterUnavailableError as exc:
            return exc.message
        return None

    async def load(self, url: str, adapter: Adapter, evict: str | None = None) -> None:
        """Load ``adapter`` on ``url`` (once, however many ask at the same time)."""
        task = self._loads.get((url, adapter.name))
        if task is None:
            task = asyncio.create_task(self._load(url, adapter, evict))
            self._loads[(url, adapter.name)] = task
            task.add_done_callback(lambda _: self._loads.pop((url, adapter.name), None))
        await asyncio.shield(task)

    async def _load(self, url: str, adapter: Adapter, evict: str | None) -> None:
        placement = self.placement
        placement.began_load(url, adapter.name)
        ok = False
        try:
            if evict is not None:
                await self.unload(url, evict)
            path = adapter_path(adapter, self.scheduler, self.mirror)
            self.loads += 1
            try:
                async with asyncio.timeout(self.load_wait):
                    await self._staged(adapter, url, again=False)
                    status, text = await self._post_load(url, adapter, path)
                    if status == 404 and self.scheduler != "local":
                        # The engine found no adapter at the path: the node's cache lost
                        # it (a sweep, a hand) since it was thought there. Fetch it again.
                        await self._staged(adapter, url, again=True)
                        status, text = await self._post_load(url, adapter, path)
            except TimeoutError:
                raise AdapterUnavailableError(
                    f"loading took longer than {self.load_wait:g} s "
                    "(gateway.adapter_load_wait)") from None
            except (aiohttp.ClientError, OSError) as exc:
                self.balancer.failed(url, self.clock())
                raise AdapterUnavailableError(f"the replica could not be reached: {exc}"
                                              ) from None
            # 400 "has already been loaded": another gateway process loaded it first.
            ok = status == 200 or (status == 400 and "already been loaded" in text)
            if not ok:
                log.warning("replica %s refused to load adapter %r: HTTP %d %s", url,
                            adapter.name, status, text)
                raise AdapterUnavailableError(f"the engine answered HTTP {status}: {text}")
        finally:
            placement.ended_load(url, adapter.name, self.clock(), ok=ok)
            self.on_load(adapter.base, adapter.name, "loaded" if ok else "refused")

    async def _staged(self, adapter: Adapter, url: str, *, again: bool) -> None:
        try:
            await self.stage(adapter, url, again=again)
        except AdapterUnavailableError:
            raise
        except LlmgwError as exc:
            # Not fetched (the mirror's 404, a checksum, the cache's owner) or Nomad
            # unreachable: this replica cannot load it; the caller tries the next one.
            raise AdapterUnavailableError(exc.message) from None

    async def _post_load(self, url: str, adapter: Adapter, path: str) -> tuple[int, str]:
        resp = await self._client().post(target_url(url, "/v1/load_lora_adapter"),
                                         json={"lora_name": adapter.name, "lora_path": path})
        async with resp:
            text = (await resp.content.read(_ERROR_SNIPPET)).decode("utf-8", "replace")
            return resp.status, text.strip()

    async def unload(self, url: str, name: str) -> None:
        self.placement.unloaded(url, name)
        self.unloads += 1
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
            async with asyncio.timeout(10):
                resp = await self._client().post(target_url(url, "/v1/unload_lora_adapter"),
                                                 json={"lora_name": name})
                resp.close()

    # ------------------------------------------------------------ following the engines

    def on_page(self, url: str, page: bytes) -> None:
        """An engine scrape's ``/metrics`` page (``SignalScraper``): running and waiting."""
        found = lora_info(page)
        if found is not None:
            self.placement.observe_running(url, found[0], found[1], self.clock())

    async def run(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception:
                log.exception("reading the replicas' adapters failed; retrying")
            await asyncio.sleep(self.interval)

    async def refresh(self) -> None:
        """Read every LoRA replica's ``/v1/models``; keep pinned adapters loaded everywhere
        and unload what the catalog no longer has."""
        catalog = self.catalog()
        live: set[str] = set()
        jobs = []
        for model in catalog:
            if lora_sizes(model, model.profiles[0] if model.profiles else None) is None:
                continue
            urls = self.replicas(model)
            live.update(urls)
            jobs += [self._refresh_one(catalog, model, url) for url in urls]
        await asyncio.gather(*jobs)
        self.placement.prune(live)

    async def _refresh_one(self, catalog: Catalog, model: Model, url: str) -> None:
        try:
            async with asyncio.timeout(5):
                async with self._client().get(target_url(url, "/v1/models")) as resp:
                    if resp.status != 200:
                        return
                    cards = _cards.decode(await resp.read())
        except (aiohttp.ClientError, OSError, TimeoutError, msgspec.DecodeError,
                msgspec.ValidationError):
            return
        served = model.engine_model_name
        loaded = [c.id for c in cards.data if c.id != served and c.parent is not None]
        self.placement.observe(url, loaded, self.clock())
        wanted = {a.name for a in catalog.adapters_of(model.name)}
        for name in loaded:
            if name not in wanted and not self.placement.is_loading(url, name):
                log.info("unloading adapter %r from %s: it is no longer in the catalog",
                         name, url)
                await self.unload(url, name)
        for adapter in catalog.adapters_of(model.name):
            if adapter.pinned and adapter.name not in loaded \
                    and not self.placement.is_loading(url, adapter.name):
                room, evict = self.placement.victim(url, self._capacity(model)(url),
                                                    self._pinned(model.name), self.clock())
                if room:
                    self._spawn(self._try_load(url, adapter, evict))
