"""Choosing a replica: least outstanding requests among the healthy, minus the ejected.

This module decides and counts; it does no I/O and reads no clock (callers
pass ``now``), so every rule here is tested without a server.

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

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass


@dataclass(slots=True)
class ReplicaState:
    outstanding: int = 0
    failures: int = 0          # consecutive failures, counted once per ejection
    ejected_until: float = 0.0


class Balancer:
    """Least-outstanding choice and passive-health bookkeeping for every replica URL."""

    def __init__(self, eject_for: float, eject_max: float) -> None:
        self.eject_for = eject_for
        self.eject_max = max(eject_max, eject_for)
        self._state: dict[str, ReplicaState] = {}
        self._turn = 0

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
        self._get(url).outstanding += 1

    def release(self, url: str) -> None:
        state = self._state.get(url)
        if state is not None and state.outstanding > 0:
            state.outstanding -= 1

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

    def succeeded(self, url: str) -> None:
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
