"""Consistent hashing with bounded load: which replica a prompt prefix belongs to.

A prefix key lands on a ring of points, ``POINTS`` per replica; the replica
owning the first point clockwise from the key is the key's home, so every
request of a chat session reaches the replica whose prefix cache holds its
earlier turns. A ring rather than ``hash % n`` because a replica that leaves
(ejected, unhealthy, scaled down) must move only its own keys: with modulo
hashing a change of ``n`` moves almost every key and empties every cache at
once.

Bounded load (Mirrokni, Thorup and Zadimoghaddam, "Consistent Hashing with
Bounded Loads", 2016): a replica whose load would exceed ``load_factor`` times
the mean (plus a ``slack`` the caller gives) passes the request on to the next
replica clockwise. A hot prefix (one
system prompt shared by a whole application) therefore spills over to a few
neighbours instead of queueing on one replica while the others idle.

The ring is where a key belongs when nothing else is known: a gateway process
that placed a conversation itself follows its own record of where it went
(``routing.Balancer.pick``), and uses ``order`` to break ties the same way
everywhere.

Points are placed with BLAKE2b, not Python's ``hash``: string hashing is
salted per process, and every gateway worker and instance must put a key on
the same replica, or a session would lose its cache whenever its requests
reach another gateway.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Callable, Collection, Iterator, Sequence

POINTS = 64


def point(data: bytes) -> int:
    """A stable 64-bit position on the ring."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


class HashRing:
    """The ring of one set of replica URLs; rebuilt only when the set changes."""

    __slots__ = ("_distinct", "_owners", "_points", "urls")

    def __init__(self, urls: Sequence[str]) -> None:
        self.urls = tuple(urls)
        placed = sorted((point(f"{url}#{i}".encode()), url)
                        for url in set(self.urls) for i in range(POINTS))
        self._points = [p for p, _ in placed]
        self._owners = [u for _, u in placed]
        self._distinct = len(set(self.urls))

    def _clockwise(self, key: int) -> Iterator[str]:
        """Every replica once, clockwise from ``key``'s home: the home first."""
        owners = self._owners
        if not owners:
            return
        start = bisect.bisect_left(self._points, key) % len(owners)
        seen: set[str] = set()
        for i in range(len(owners)):
            url = owners[(start + i) % len(owners)]
            if url not in seen:
                seen.add(url)
                yield url
                if len(seen) == self._distinct:
                    return

    def order(self, key: int, usable: Collection[str]) -> list[str]:
        """The usable replicas clockwise from ``key``'s home, each once: the home first."""
        return [u for u in self._clockwise(key) if u in usable]

    def choose(self, key: int, usable: Collection[str], load: Callable[[str], int],
               load_factor: float, slack: int = 0) -> str | None:
        """The first usable replica from ``key``'s home whose load stays within the bound.

        The bound is ``ceil(load_factor * (total + 1) / n) + slack`` over the
        usable replicas, counting the request being placed; at least one
        replica always fits it, so a request is never refused here.
        """
        if not usable:
            return None
        loads = {u: load(u) for u in usable}
        bound = math.ceil(load_factor * (sum(loads.values()) + 1) / len(loads)) + slack
        for url in self._clockwise(key):
            if url in loads and loads[url] + 1 <= bound:
                return url
        # Every usable replica is over the bound (rounding with a tiny load
        # factor): the least loaded one.
        return min(loads, key=lambda u: loads[u])
