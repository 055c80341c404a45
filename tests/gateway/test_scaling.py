"""The scaler's decision on its own: up at once, not while loading, down only after the window."""

from __future__ import annotations

from llmgw.gateway.routing import EngineSample
from llmgw.gateway.scaling import ScaleInputs, decide, demand_of


def inputs(**kw: object) -> ScaleInputs:
    base: dict[str, object] = {"current": 2, "ready": 2, "waiting_for_capacity": False, "low": 1,
                                   "high": 8, "target": 10, "window": 300.0, "demand": 20.0}
    base.update(kw)
    return ScaleInputs(**base)  # type: ignore[arg-type]


def test_a_load_step_scales_up_at_once_to_what_the_target_needs() -> None:
    """Demand 55 at target 10 asks for 6 replicas in the same tick, watched or not."""
    d = decide(inputs(demand=55.0), [(0.0, 6)], now=0.0, watched_since=0.0)
    assert (d.desired, d.kind) == (6, "load")
    assert "55 requests on 2 ready replicas" in d.reason


def test_scale_up_stops_at_max_and_says_so() -> None:
    """A demand beyond max replicas' worth asks for max, with the reason naming it."""
    d = decide(inputs(demand=500.0), [], now=0.0, watched_since=0.0)
    assert (d.desired, d.kind) == (8, "max")
    assert "scaling.max 8" in d.reason


def test_no_further_scale_up_while_the_last_one_is_still_loading() -> None:
    """With fewer ready than asked for, a higher demand waits for them."""
    d = decide(inputs(current=4, ready=2, demand=80.0), [], now=0.0, watched_since=0.0)
    assert (d.desired, d.kind) == (4, "loading")


def test_no_scale_up_while_the_scheduler_waits_for_capacity() -> None:
    """When the scheduler has no room for what was asked, asking for more waits."""
    d = decide(inputs(waiting_for_capacity=True, demand=80.0), [], now=0.0, watched_since=0.0)
    assert (d.desired, d.kind) == (2, "capacity")


def test_no_scale_down_before_a_whole_window_has_been_watched() -> None:
    """A decider that took over 100 s ago cannot scale down with a 300 s window."""
    history = [(t, 1) for t in range(100, 400, 2)]
    d = decide(inputs(demand=1.0), history, now=400.0, watched_since=300.0)
    assert (d.desired, d.kind) == (2, "stabilising")


def test_no_scale_down_while_the_window_saw_a_higher_need() -> None:
    """A burst within the window keeps the replicas it needed (no flapping)."""
    history = [(0.0, 1), (200.0, 2), (250.0, 1), (400.0, 1)]
    d = decide(inputs(demand=1.0), history, now=400.0, watched_since=0.0)
    assert (d.desired, d.kind) == (2, "stabilising")


def test_scale_down_after_the_window_goes_to_the_peak_of_the_window() -> None:
    """Low load for a whole window drops the count to the window's highest need."""
    history = [(0.0, 4), (150.0, 3), (300.0, 2), (400.0, 1)]
    d = decide(inputs(current=5, ready=5, demand=1.0), history, now=400.0, watched_since=0.0)
    assert d.desired == 3
    assert "5 → 3" in d.reason


def test_the_count_never_leaves_the_range() -> None:
    """No load keeps min; a count above max is brought back within it."""
    assert decide(inputs(current=1, ready=1, demand=0.0), [], 0.0, 0.0).desired == 1
    assert decide(inputs(current=12, ready=12, demand=500.0), [], 0.0, 0.0).desired == 8


def test_demand_counts_the_engines_when_every_replica_reported() -> None:
    """Engine running + waiting (every gateway's traffic) plus queued; else in-flight + queued."""
    fresh = [EngineSample(running=8, waiting=3), EngineSample(running=6, waiting=0)]
    assert demand_of(fresh, in_flight=5, queued=4) == 21.0
    assert demand_of([fresh[0], None], in_flight=5, queued=4) == 9.0
    assert demand_of([], in_flight=0, queued=2) == 2.0
