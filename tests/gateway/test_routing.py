"""The pure replica choice and passive-health bookkeeping (no servers)."""

from __future__ import annotations

import ast
from pathlib import Path

from llmgw.gateway import routing
from llmgw.gateway.routing import Balancer

A, B, C = "http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.3:8000"


def test_least_outstanding_wins() -> None:
    """The replica with the fewest requests in flight is chosen."""
    bal = Balancer(eject_for=10, eject_max=60)
    bal.acquire(A)
    bal.acquire(A)
    bal.acquire(B)
    assert bal.choose([A, B, C], now=0) == C
    bal.acquire(C)
    bal.acquire(C)
    assert bal.choose([A, B, C], now=0) == B


def test_ties_rotate_so_sequential_traffic_spreads() -> None:
    """With no request in flight anywhere, successive choices visit every replica."""
    bal = Balancer(eject_for=10, eject_max=60)
    chosen = [bal.choose([A, B, C], now=0) for _ in range(6)]
    assert set(chosen) == {A, B, C}


def test_release_never_goes_negative() -> None:
    """An extra release cannot make a replica look less loaded than idle."""
    bal = Balancer(eject_for=10, eject_max=60)
    bal.release(A)
    bal.acquire(A)
    bal.release(A)
    bal.release(A)
    assert bal.outstanding(A) == 0
    bal.acquire(B)
    bal.acquire(A)
    assert bal.outstanding(A) == 1


def test_excluded_replicas_are_not_chosen() -> None:
    """A replica this request already tried is skipped; none left gives None."""
    bal = Balancer(eject_for=10, eject_max=60)
    assert bal.choose([A, B], now=0, exclude={A}) == B
    assert bal.choose([A, B], now=0, exclude={A, B}) is None
    assert bal.choose([], now=0) is None


def test_failed_replica_is_ejected_for_the_back_off_period() -> None:
    """After a failure the replica is not chosen until eject_for has passed."""
    bal = Balancer(eject_for=10, eject_max=60)
    bal.failed(A, now=100)
    assert all(bal.choose([A, B], now=t) == B for t in (100, 105, 109.9))
    assert bal.choose([A], now=109.9) is None
    assert bal.choose([A], now=110.1) == A
    assert bal.back_in([A, B], now=104) == 6


def test_repeated_failures_double_the_ejection_up_to_the_maximum() -> None:
    """Each failure after coming back doubles the ejection, capped at eject_max."""
    bal = Balancer(eject_for=10, eject_max=35)
    assert bal.failed(A, now=0) == 10
    assert bal.failed(A, now=11) == 11 + 20
    assert bal.failed(A, now=32) == 32 + 35
    bal.succeeded(A)
    assert bal.failed(A, now=100) == 110


def test_failures_during_an_ejection_count_once() -> None:
    """Many in-flight requests failing at one crash are one failure, not many doublings."""
    bal = Balancer(eject_for=10, eject_max=1000)
    for _ in range(30):
        bal.failed(A, now=50)
    assert bal.back_in([A], now=50) == 10
    assert bal.failed(A, now=61) == 61 + 20


def test_prune_forgets_gone_replicas_but_keeps_ejected_and_busy_ones() -> None:
    """State of replicas that left discovery is dropped unless ejected or in flight."""
    bal = Balancer(eject_for=10, eject_max=60)
    bal.acquire(A)
    bal.release(A)
    bal.acquire(B)
    bal.failed(C, now=0)
    bal.prune(live=set(), now=1)
    assert bal.is_ejected(C, now=1)
    assert bal.outstanding(B) == 1
    assert A not in bal._state


def test_routing_imports_no_io_library() -> None:
    """The decision module stays pure: it imports nothing that does I/O."""
    tree = ast.parse(Path(routing.__file__).read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported <= {"__future__", "collections", "dataclasses"}
