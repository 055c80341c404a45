"""Which replicas to start and stop: scaling, on demand, stale profiles and rollout."""

from __future__ import annotations

from llmgw.catalog.model import Model, Scaling
from llmgw.catalog.source import Source
from llmgw.scheduler.local.planner import Plan, ReplicaView, desired_count, plan

from .conftest import cpu_model


def view(rid: str, *, healthy: bool = True, stale: bool = False, retiring: bool = False,
         seq: int = 0) -> ReplicaView:
    return ReplicaView(id=rid, healthy=healthy, stale=stale, retiring=retiring, seq=seq)


def test_a_model_runs_its_minimum_until_the_gateway_asks_for_more_within_max() -> None:
    """min > 0 is the count until set_demand; a request is kept within [min, max]."""
    m = cpu_model("m", min_=2)
    assert desired_count(m, None) == 2
    assert desired_count(m, 0) == 2
    assert desired_count(m, 5) == 2
    wide = Model(name="w", source=Source.parse("x"), engine="llama.cpp", profiles=m.profiles,
                 scaling=Scaling(min=2, max=4))
    assert desired_count(wide, None) == 2
    assert desired_count(wide, 3) == 3
    assert desired_count(wide, 9) == 4
    assert desired_count(wide, 1) == 2


def test_an_on_demand_model_runs_what_was_asked_up_to_its_max() -> None:
    """min 0 follows set_demand, capped by max (1 by default)."""
    m = cpu_model("m", min_=0)
    assert desired_count(m, 0) == 0
    assert desired_count(m, 3) == 1
    wide = Model(name="w", source=Source.parse("x"), engine="llama.cpp", profiles=m.profiles,
                 scaling=Scaling(min=0, max=3))
    assert desired_count(wide, 2) == 2


def test_missing_replicas_are_started() -> None:
    """Fewer live replicas than desired asks for the difference."""
    assert plan(3, [view("a")]) == Plan(start=2)


def test_scaling_down_stops_unhealthy_then_stale_then_newest() -> None:
    """Surplus replicas are chosen among those that serve least."""
    replicas = [view("old", seq=1), view("stale", stale=True, seq=2),
                view("loading", healthy=False, seq=3), view("new", seq=4)]
    assert plan(2, replicas).stop == ["loading", "stale"]
    assert plan(1, replicas).stop == ["loading", "stale", "new"]


def test_a_stale_replica_counts_until_a_rollout() -> None:
    """A profile edit alone starts and stops nothing."""
    assert plan(1, [view("a", stale=True)]) == Plan()


def test_a_retiring_replica_serves_until_its_successor_is_healthy() -> None:
    """Rollout starts a fresh replica and keeps the old one while the new one loads."""
    assert plan(1, [view("old", retiring=True)]) == Plan(start=1)
    loading = [view("old", retiring=True), view("new", healthy=False)]
    assert plan(1, loading) == Plan()
    ready = [view("old", retiring=True), view("new")]
    assert plan(1, ready) == Plan(stop=["old"])


def test_a_rollout_without_room_stops_an_old_replica_first() -> None:
    """When the fresh replica cannot be placed beside the old one, one old one makes room."""
    replicas = [view("old-1", retiring=True, seq=1), view("old-2", retiring=True, seq=2)]
    assert plan(2, replicas, blocked=True) == Plan(start=2, stop=["old-2"])


def test_a_blocked_rollout_waits_for_a_loading_fresh_replica() -> None:
    """Nothing more is stopped while a fresh replica is still loading."""
    replicas = [view("old", retiring=True), view("new", healthy=False)]
    assert plan(1, replicas, blocked=True) == Plan()


def test_removal_stops_everything() -> None:
    """Desired 0 stops fresh and retiring replicas alike."""
    result = plan(0, [view("a"), view("b", retiring=True)])
    assert sorted(result.stop) == ["a", "b"]
    assert result.start == 0
