"""Choosing a replica: by policy among the healthy, minus the ejected; and how full each is.

This module decides and counts; it does no I/O and reads no clock (callers
pass ``now``), so every rule here is tested without a server.

Policies (a model's ``routing.policy``): ``least-outstanding``, the replica
with the fewest requests in flight from this gateway; ``round-robin``, each
in turn; ``prefix-affinity``, for a new conversation the replica with the
shortest prefill queue and for its later turns the replica it is on, with the
consistent-hash ring (``ring``) as the answer every gateway process shares
(``Balancer.pick`` says when each applies), by least outstanding when the
request has no key.

What each replica's engine reports (``observe``, fed by ``signals``) refines
two figures. Its **load**: the engine's running and waiting requests, which
count every gateway's traffic, plus what this gateway sent since that scrape
and minus what came back; without a fresh report, this gateway's in-flight
count. And its **headroom** before it is saturated (admission control): up
to the model's ``max_concurrency`` in flight from this gateway, and, while its
engine reports a queue, up to ``max_waiting`` waiting. An engine reporting no
queue is taken to have room until the next scrape says otherwise, so a burst
onto an idle fleet is not throttled to what a stale figure allows; the
overshoot is bounded by one scrape interval of arrivals. A report older than
``signal_ttl`` is ignored: a failed scrape degrades to in-flight counts,
never to a refused request.

Three rules, each the fix for a failure seen in other gateways:

* **Counters always come back down.** ``acquire`` and ``release`` are paired by
  the caller in a ``finally``; a counter can never go below zero, because a
  negative count would make a replica look idle and attract all traffic.
* **A replica that fails is ejected for a back-off period** (passive health):
  ``eject_for`` after the first failure, doubling for each further failure
  after it came back, up to ``eject_max``; a success resets the count. While
  it is ejected, failures of requests that were already in flight neither
  lengthen nor shorten its ejection: thirty requests cut by one crash are one
  failure, not thirty doublings, and a re-ejection never shortens a deadline
  that is already further away.
* **Ties rotate.** With sequential traffic every replica has zero outstanding;
  always taking the first would leave the others idle, so the scan starts one
  place further on each call.

Where the URLs come from (a model's ``upstream`` list, or the scheduler's
healthy endpoints) is not this module's business: it only ever sees URLs that
are already known to be healthy, and keeps state for those, pruned when they
go away.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

import msgspec

from llmgw.catalog.model import RoutingPolicy
from llmgw.gateway.prefix import PrefixKey
from llmgw.gateway.ring import HashRing

UNLIMITED = math.inf
# Conversations whose last replica this gateway remembers (an LRU: ~100 bytes each).
PLACED = 65536
# How many requests longer than the shortest a placed conversation's replica's prefill
# queue may grow before its next turn moves. On bench/routing_replay.py at 3 sessions/s,
# with new conversations placed by queue, in one run: 3 gave TTFT p50 72 ms, 6 gave
# 105 ms, and the ring's bound (load_factor 1.25 times the mean plus one) 92 ms: a
# larger margin queues turns behind a busy replica, a smaller one gives up caches.
SPILL = 3


class EngineSample(msgspec.Struct, frozen=True, kw_only=True):
    """What one scrape of an engine's ``/metrics`` said (None: the engine does not say)."""

    running: int
    waiting: int
    kv_usage: float | None = None         # 0..1
    prefix_queries: float | None = None   # counters since the engine started, in tokens
    prefix_hits: float | None = None


@dataclass(slots=True)
class ReplicaState:
    outstanding: int = 0
    awaiting: int = 0          # of those, still waiting for their first byte
    failures: int = 0          # consecutive failures, counted once per ejection
    ejected_until: float = 0.0
    sample: EngineSample | None = None
    sampled_at: float = -math.inf
    outstanding_at_sample: int = 0


class Balancer:
    """Replica choice by policy, engine signals and passive health for every replica URL."""

    def __init__(self, eject_for: float, eject_max: float, signal_ttl: float = 3.0) -> None:
        self.eject_for = eject_for
        self.eject_max = max(eject_max, eject_for)
        self.signal_ttl = signal_ttl
        self._state: dict[str, ReplicaState] = {}
        self._turn = 0
        self._rings: dict[tuple[str, ...], HashRing] = {}
        # Where each conversation went last (its longest cached prefix is there).
        self._placed: OrderedDict[int, str] = OrderedDict()

    def pick(self, urls: Sequence[str], now: float, exclude: Collection[str] = (), *,
             policy: RoutingPolicy = "least-outstanding", key: PrefixKey | None = None,
             load_factor: float = 1.25) -> str | None:
        """The usable replica ``policy`` chooses, or None (see ``choose`` for usable).

        Prefix affinity, by what this process knows of the request's
        conversation (``key``):

        * **A new conversation** (a first turn this process has not placed)
          goes to the replica with the shortest prefill queue (``pending``;
          then the fewest requests, ``load``), the first of those in ring
          order from its key's home. Nothing is cached for it anywhere yet,
          so its home on the ring has no claim but agreement: with equal
          queues (an idle fleet) it is the home, where any gateway process
          would also send the next turn. Placing it by a hash instead puts a
          Poisson share of conversations on each replica, and one that
          draws a few more queues every later turn of them.
        * **A conversation this process placed** stays where its last turn
          went, which holds its longest cached prefix, until that replica's
          prefill queue is ``SPILL`` requests longer than the shortest; then
          it moves to the shortest, as a new conversation would. Waiting
          behind one or two prefills costs about what prefilling the whole
          conversation elsewhere would, and moving it gives up the cache it
          built there.
        * **A later turn placed by another process** (another worker or
          instance, or forgotten here) goes to its key's ring home, the
          answer every process gives alike, bounded at ``load_factor`` times
          the mean prefill queue plus one request.
        """
        if policy == "prefix-affinity" and key is not None and urls:
            usable = [u for u in urls if u not in exclude and not self.is_ejected(u, now)]
            placed = self._placed
            known = placed.get(key.point)
            ring = self._ring(urls)
            url: str | None
            if known is not None and known in usable:
                url = known
                queue = self.pending(known, now)
                if queue >= SPILL and queue - min(self.pending(u, now) for u in usable) >= SPILL:
                    url = self._shortest(ring.order(key.point, usable), now)
            elif not key.follows:
                url = self._shortest(ring.order(key.point, usable), now)
            else:
                url = ring.choose(key.point, usable, lambda u: self.pending(u, now),
                                  load_factor, slack=1)
            if url is not None:
                placed[key.point] = url
                placed.move_to_end(key.point)
                if len(placed) > PLACED:
                    placed.popitem(last=False)
            return url
        if policy == "round-robin":
            n = len(urls)
            for _ in range(n):
                self._turn += 1
                url = urls[self._turn % n]
                if url not in exclude and not self.is_ejected(url, now):
                    return url
            return None
        return self.choose(urls, now, exclude)

    def _shortest(self, candidates: Sequence[str], now: float) -> str | None:
        """The candidate with the shortest prefill queue, then the fewest requests; the first
        of equals."""
        best: str | None = None
        best_score = (0, 0)
        for url in candidates:
            score = (self.pending(url, now), self.load(url, now))
            if best is None or score < best_score:
                best, best_score = url, score
        return best

    def _ring(self, urls: Sequence[str]) -> HashRing:
        """The ring of ``urls``; ejected or excluded replicas are skipped on it, not removed,
        so the others keep their keys."""
        members = tuple(urls)
        ring = self._rings.get(members)
        if ring is None:
            if len(self._rings) > 64:
                self._rings.clear()
            ring = self._rings[members] = HashRing(members)
        return ring

    # ------------------------------------------------------------ engine signals

    def observe(self, url: str, sample: EngineSample | None, now: float) -> None:
        """Record a scrape of ``url``'s engine (None: it failed or said nothing useful)."""
        state = self._get(url)
        state.sample = sample
        state.sampled_at = now if sample is not None else -math.inf
        state.outstanding_at_sample = state.outstanding

    def sample(self, url: str, now: float) -> EngineSample | None:
        """The engine's last report, if it is fresh."""
        state = self._state.get(url)
        if state is None or state.sample is None or now - state.sampled_at > self.signal_ttl:
            return None
        return state.sample

    def load(self, url: str, now: float) -> int:
        """Requests on the replica: the engine's count brought up to date, else in flight."""
        state = self._state.get(url)
        if state is None:
            return 0
        sample = self.sample(url, now)
        if sample is None:
            return state.outstanding
        since = state.outstanding - state.outstanding_at_sample
        return max(state.outstanding, sample.running + sample.waiting + since)

    def pending(self, url: str, now: float) -> int:
        """Requests on the replica that have not had their first token: its prefill queue.

        This gateway's own count, or the engine's waiting count when that is
        higher (other gateways' requests). It is what a new request's time to
        first token depends on: a request that is decoding costs the engine a
        token per step, one that is prefilling costs it the whole prompt.
        """
        state = self._state.get(url)
        if state is None:
            return 0
        sample = self.sample(url, now)
        return max(state.awaiting, sample.waiting if sample is not None else 0)

    def headroom(self, url: str, now: float, max_concurrency: int | None,
                 max_waiting: int) -> float:
        """How many more requests the replica takes before it is saturated (UNLIMITED: no bound)."""
        state = self._state.get(url)
        outstanding = state.outstanding if state else 0
        room = UNLIMITED
        if max_concurrency is not None:
            room = max_concurrency - outstanding
        sample = self.sample(url, now)
        if sample is not None and sample.waiting > 0 and state is not None:
            waiting = sample.waiting + outstanding - state.outstanding_at_sample
            room = min(room, max_waiting + 1 - waiting)
        return max(room, 0)

    def _get(self, url: str) -> ReplicaState:
        state = self._state.get(url)
        if state is None:
            state = self._state[url] = ReplicaState()
        return state

    def choose(self, urls: Sequence[str], now: float,
               exclude: Collection[str] = ()) -> str | None:
        """The usable replica with the fewest requests in flight, or None.

        Usable: not ejected and not in ``exclude`` (the replicas this request
        already tried).
        """
        n = len(urls)
        if n == 0:
            return None
        self._turn += 1
        start = self._turn % n
        best: str | None = None
        best_load = 0
        states = self._state
        for i in range(n):
            url = urls[(start + i) % n]
            if url in exclude:
                continue
            state = states.get(url)
            if state is None:
                load = 0
            elif state.ejected_until > now:
                continue
            else:
                load = state.outstanding
            if best is None or load < best_load:
                best, best_load = url, load
                if load == 0:
                    break
        return best

    def choose_ejected(self, urls: Sequence[str], now: float,
                       exclude: Collection[str] = ()) -> str | None:
        """The ejected replica due back soonest, for a last attempt when nothing else is left.

        A replica ejected because of one unlucky failure should not turn every
        request for its model into an error for the whole back-off period
        when it is the only one there is.
        """
        candidates = [u for u in urls if u not in exclude and self.is_ejected(u, now)]
        if not candidates:
            return None
        return min(candidates, key=lambda u: self._state[u].ejected_until)

    def is_ejected(self, url: str, now: float) -> bool:
        state = self._state.get(url)
        return state is not None and state.ejected_until > now

    def acquire(self, url: str) -> None:
        state = self._get(url)
        state.outstanding += 1
        state.awaiting += 1

    def release(self, url: str, *, awaiting: bool = False) -> None:
        """A request ended; ``awaiting``: before its first byte (``succeeded`` was not called)."""
        state = self._state.get(url)
        if state is not None:
            if state.outstanding > 0:
                state.outstanding -= 1
            if awaiting and state.awaiting > 0:
                state.awaiting -= 1

    def outstanding(self, url: str) -> int:
        state = self._state.get(url)
        return state.outstanding if state else 0

    def failed(self, url: str, now: float) -> float:
        """Record a failed request; returns the time until which the replica is ejected."""
        state = self._get(url)
        if state.ejected_until > now:
            return state.ejected_until
        state.failures += 1
        period = min(self.eject_for * 2 ** min(state.failures - 1, 30), self.eject_max)
        state.ejected_until = max(state.ejected_until, now + period)
        return state.ejected_until

    def answering(self, url: str) -> int:
        """Requests on the replica whose answer has begun to arrive (streams under way)."""
        state = self._state.get(url)
        return state.outstanding - state.awaiting if state is not None else 0

    def succeeded(self, url: str) -> None:
        """The first byte of a request's answer arrived from ``url``: healthy, and past its
        prefill."""
        state = self._state.get(url)
        if state is not None:
            state.failures = 0
            state.ejected_until = 0.0
            if state.awaiting > 0:
                state.awaiting -= 1

    def recovered(self, url: str) -> None:
        """``url`` was seen down and answers again (a restart): forgive its failures."""
        state = self._state.get(url)
        if state is not None:
            state.failures = 0
            state.ejected_until = 0.0

    def back_in(self, urls: Iterable[str], now: float) -> float | None:
        """Seconds until the first of ``urls`` that is ejected comes back, if any is."""
        ends = [s.ejected_until for u in urls if (s := self._state.get(u)) is not None
                and s.ejected_until > now]
        return min(ends) - now if ends else None

    def ejected_count(self, urls: Iterable[str], now: float) -> int:
        return sum(1 for u in urls if self.is_ejected(u, now))

    def prune(self, live: Collection[str], now: float) -> None:
        """Forget replicas that are gone, so state does not grow as replicas come and go.

        A URL still in ``live``, with requests in flight, or still ejected is kept:
        an ejected replica that briefly drops out of discovery and comes back
        must not come back forgiven.
        """
        for url in [u for u, s in self._state.items()
                    if u not in live and s.outstanding == 0 and s.ejected_until <= now]:
            del self._state[url]
