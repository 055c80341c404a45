"""Where a request for a LoRA adapter goes, and where an adapter is loaded: pure decisions.

This module decides; ``llmgw.gateway.adapters`` does the loading and the
reading of the engines. No I/O, no clock (callers pass ``now``).

What each replica holds is the engines' word, refreshed from every replica's
``/v1/models`` (the adapters it has loaded) and ``vllm:lora_requests_info``
(those running and waiting), so every gateway process and instance routes on
the same facts and none reloads what another just loaded. Between two reads
a process adds what it loaded itself and what it saw running.

The rules, each the answer to a failure peers' users report:

* **Go where the adapter is.** A request goes to a usable replica that has
  its adapter loaded, chosen among those by the model's policy — queue
  length and prefix affinity, with the prefix key salted by the adapter,
  since a conversation's KV cache is its adapter's own. Hashing adapters to
  replicas instead (sticky routing) loads a hot adapter wherever its load
  spills and makes a hash's unlucky replica the hot spot (kubeai #132).
* **Load once, where it fits best.** With no replica holding it, the adapter
  is loaded on the replica with the shortest prefill queue, then the fewest
  requests, then the most free adapter slots, then one whose disk already
  has it; a replica whose slots are all taken evicts its least recently used
  adapter that is neither pinned nor running. Requests arriving while it
  loads wait for that one load.
* **Spread what is hot.** When every replica holding an adapter has a
  prefill queue ``SPREAD`` requests longer than the shortest replica that
  does not, the adapter is loaded there too (in the background: the request
  that noticed goes to a holder at once), so a hot adapter's capacity grows
  with its demand instead of queueing behind one replica (llm-d-router #709).
* **Never thrash.** A replica that has just loaded an adapter is not picked to
  evict it again before ``MIN_RESIDENCY`` seconds: with more adapters in use
  than slots, evicting what was loaded a moment ago loads it back a moment
  later (production-stack #331).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field

from llmgw.gateway.prefix import PrefixKey

# Prefill-queue margin (requests) past which a hot adapter is loaded on one more replica.
SPREAD = 3
# Seconds an adapter stays loaded before its replica may evict it for another.
MIN_RESIDENCY = 5.0


@dataclass(slots=True)
class Held:
    """One replica's adapters as far as routing knows."""

    loaded: OrderedDict[str, float] = field(default_factory=OrderedDict)  # → last used
    loaded_at: dict[str, float] = field(default_factory=dict)
    loading: set[str] = field(default_factory=set)
    running: frozenset[str] = frozenset()
    waiting: frozenset[str] = frozenset()
    in_flight: dict[str, int] = field(default_factory=dict)   # this process's requests


@dataclass(frozen=True, slots=True)
class Choice:
    """Where to send the request; ``load``: load the adapter there first, evicting
    ``evict``; ``spread_to``: also load it there, without waiting."""

    url: str
    load: bool = False
    evict: str | None = None
    spread_to: str | None = None
    spread_evict: str | None = None


Queue = Callable[[str], tuple[int, int]]   # url → (prefill queue, requests)


def adapter_key(key: PrefixKey | None, adapter: str) -> PrefixKey | None:
    """The prefix key of a request on ``adapter``: its own ring point, so conversations
    on two adapters with one system prompt are two cache lines, as in the engine."""
    if key is None:
        return None
    digest = hashlib.blake2b(f"{key.point}:{adapter}".encode(), digest_size=8).digest()
    return PrefixKey(point=int.from_bytes(digest, "big"), follows=key.follows)


class Placement:
    """Adapters per replica URL, and the choices made from them."""

    def __init__(self) -> None:
        self._held: dict[str, Held] = {}

    def held(self, url: str) -> Held:
        h = self._held.get(url)
        if h is None:
            h = self._held[url] = Held()
        return h

    def urls(self) -> list[str]:
        return list(self._held)

    def loaded(self, url: str) -> list[str]:
        h = self._held.get(url)
        return list(h.loaded) if h is not None else []

    def holders(self, adapter: str, urls: Iterable[str]) -> list[str]:
        return [u for u in urls if (h := self._held.get(u)) is not None and adapter in h.loaded]

    def is_loading(self, url: str, adapter: str) -> bool:
        h = self._held.get(url)
        return h is not None and adapter in h.loading

    # ------------------------------------------------------------ facts

    def observe(self, url: str, loaded: Collection[str], now: float) -> None:
        """``url``'s engine lists ``loaded``: what it holds, whoever loaded it."""
        h = self.held(url)
        for name in [n for n in h.loaded if n not in loaded]:
            del h.loaded[name]
            h.loaded_at.pop(name, None)
        for name in loaded:
            if name not in h.loaded:
                h.loaded[name] = now
                h.loaded_at.setdefault(name, now)
                h.loaded.move_to_end(name, last=False)   # another's load: not used here yet

    def observe_running(self, url: str, running: Collection[str], waiting: Collection[str],
                        now: float) -> None:
        """The engine's running and waiting adapters (``vllm:lora_requests_info``)."""
        h = self.held(url)
        h.running, h.waiting = frozenset(running), frozenset(waiting)
        for name in h.running:
            if name not in h.loaded:
                h.loaded[name] = now
                h.loaded_at.setdefault(name, now)
            self.used(url, name, now)

    def began_load(self, url: str, adapter: str) -> None:
        self.held(url).loading.add(adapter)

    def ended_load(self, url: str, adapter: str, now: float, *, ok: bool) -> None:
        h = self.held(url)
        h.loading.discard(adapter)
        if ok:
            h.loaded[adapter] = now
            h.loaded_at[adapter] = now

    def unloaded(self, url: str, adapter: str) -> None:
        h = self.held(url)
        h.loaded.pop(adapter, None)
        h.loaded_at.pop(adapter, None)

    def used(self, url: str, adapter: str, now: float) -> None:
        h = self.held(url)
        if adapter in h.loaded:
            h.loaded[adapter] = now
            h.loaded.move_to_end(adapter)

    def begin(self, url: str, adapter: str) -> None:
        h = self.held(url)
        h.in_flight[adapter] = h.in_flight.get(adapter, 0) + 1

    def end(self, url: str, adapter: str) -> None:
        h = self.held(url)
        left = h.in_flight.get(adapter, 0) - 1
        if left > 0:
            h.in_flight[adapter] = left
        else:
            h.in_flight.pop(adapter, None)

    def prune(self, live: Collection[str]) -> None:
        for url in [u for u in self._held if u not in live]:
            del self._held[url]

    # ------------------------------------------------------------ choices

    def victim(self, url: str, capacity: int, pinned: Collection[str], now: float,
               *, coming: int = 1) -> tuple[bool, str | None]:
        """Whether ``url`` has room for ``coming`` more adapters, and the one to evict
        to make room (None: room enough, or nothing may go)."""
        h = self.held(url)
        if len(h.loaded) + len(h.loading) + coming <= capacity:
            return True, None
        for name in h.loaded:     # least recently used first
            if name in pinned or name in h.running or h.in_flight.get(name) \
                    or now - h.loaded_at.get(name, 0.0) < MIN_RESIDENCY:
                continue
            return True, name
        return False, None

    def target(self, adapter: str, urls: Sequence[str], queue: Queue,
               capacity: Callable[[str], int], pinned: Collection[str], now: float,
               warm: Callable[[str], bool] = lambda _: False) -> tuple[str, str | None] | None:
        """The replica to load ``adapter`` on, and what it evicts; None: no replica can
        take it now (every slot pinned, running or just loaded)."""
        best: tuple[tuple[int, int, int, int], str, str | None] | None = None
        for url in urls:
            h = self.held(url)
            if adapter in h.loaded or adapter in h.loading:
                continue
            room, evict = self.victim(url, capacity(url), pinned, now)
            if not room:
                continue
            pending, load = queue(url)
            free = capacity(url) - len(h.loaded) - len(h.loading)
            score = (pending, load, -free, 0 if warm(url) else 1)
            if best is None or score < best[0]:
                best = (score, url, evict)
        return (best[1], best[2]) if best is not None else None

    def choose(self, adapter: str, usable: Sequence[str], queue: Queue,
               pick: Callable[[Sequence[str]], str | None],
               capacity: Callable[[str], int], pinned: Collection[str], now: float,
               warm: Callable[[str], bool] = lambda _: False) -> Choice | None:
        """Where a request for ``adapter`` goes among the ``usable`` replicas.

        ``pick`` is the model's policy over the holders (``Balancer.pick``);
        None: nothing usable, or no replica can make room.
        """
        holders = self.holders(adapter, usable)
        if holders:
            url = pick(holders)
            if url is None:
                return None
            shortest = min(queue(u)[0] for u in holders)
            others = [u for u in usable if u not in holders
                      and not self.is_loading(u, adapter)]
            if others and shortest >= SPREAD and \
                    not any(self.is_loading(u, adapter) for u in usable):
                found = self.target(adapter, others, queue, capacity, pinned, now, warm)
                if found is not None and shortest - queue(found[0])[0] >= SPREAD:
                    return Choice(url=url, spread_to=found[0], spread_evict=found[1])
            return Choice(url=url)
        loading = [u for u in usable if self.is_loading(u, adapter)]
        if loading:
            return Choice(url=min(loading, key=queue), load=True)
        found = self.target(adapter, usable, queue, capacity, pinned, now, warm)
        if found is None:
            return None
        return Choice(url=found[0], load=True, evict=found[1])
