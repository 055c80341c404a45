"""How many replicas a model should run for its load: the scaler's decision, without I/O.

The load of a model is its **demand**: requests running or waiting at its
engines, plus those queued in the gateways. The engines' own counts are used
when every ready replica reported recently (they include every gateway's
traffic); otherwise the gateways' in-flight counts, summed over every
gateway's report. The recommendation is ``ceil(demand / target)``, clamped to
``[min, max]`` (``[1, max]`` for an on-demand model that is up: going to and
from zero is the on-demand path's business, not the scaler's).

Rules, and what each prevents:

* **Up at once.** A load step is answered within one scaler tick, because
  every second of under-capacity is queueing or 429s.
* **Not again while loading.** While the replicas asked for are not all ready
  the scaler does not ask for more: the load per *ready* replica is inflated
  until the new ones serve, and counting it again would overshoot to ``max``.
  Nor while the scheduler reports it is waiting for capacity.
* **Down only after ``scale_down_delay`` of lower load.** The count drops to
  the highest recommendation seen over the whole window, and only once the
  decider has watched for a whole window (a process that has just taken over
  the decision has not, and so cannot scale down early). A load that dips
  between bursts therefore never costs a reload of the replicas it needs
  again a minute later (the flapping KPA-style autoscalers are known for).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import msgspec

from llmgw.gateway.routing import EngineSample

DecisionKind = Literal["load", "min", "max", "stabilising", "loading", "capacity"]


class ScaleInputs(msgspec.Struct, frozen=True, kw_only=True):
    """What the scaler knows about one model at one tick."""

    current: int            # the count the scheduler runs or was last asked for
    ready: int              # healthy replicas
    waiting_for_capacity: bool
    low: int                # the range the scaler may choose from
    high: int
    target: int
    window: float           # scale_down_delay, seconds
    demand: float


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    desired: int
    kind: DecisionKind
    reason: str


def demand_of(samples: Sequence[EngineSample | None], in_flight: int, queued: int) -> float:
    """Requests on the model: engine counts when every replica has a fresh one, plus queued."""
    if samples and all(s is not None for s in samples):
        at_engines = sum(s.running + s.waiting for s in samples if s is not None)
        return float(at_engines + queued)
    return float(in_flight + queued)


def recommend(inputs: ScaleInputs) -> int:
    wanted = math.ceil(inputs.demand / inputs.target) if inputs.demand > 0 else 0
    return max(inputs.low, min(inputs.high, wanted))


def decide(inputs: ScaleInputs, history: Sequence[tuple[float, int]], now: float,
           watched_since: float) -> Decision:
    """The count to ask for now.

    ``history``: this decider's (time, recommendation) pairs, the current one
    included; ``watched_since``: when this process started deciding.
    """
    i = inputs
    rec = recommend(i)
    current = max(i.low, min(i.high, i.current))
    per = f"{i.demand:.0f} requests on {i.ready} ready replica{'s' if i.ready != 1 else ''}"
    if rec > current:
        if i.ready < i.current:
            return Decision(desired=current, kind="loading", reason=(
                f"{per}, {i.current} asked for: waiting for the rest to load before "
                f"asking for {rec}"))
        if i.waiting_for_capacity:
            return Decision(desired=current, kind="capacity", reason=(
                f"{per} would need {rec}, but the scheduler has no room for the ones "
                "asked for"))
        kind: DecisionKind = "max" if rec == i.high and i.demand > i.high * i.target else "load"
        return Decision(desired=rec, kind=kind, reason=(
            f"{per} against a target of {i.target} per replica: {current} → {rec}"
            + (f" (scaling.max {i.high})" if kind == "max" else "")))
    if rec < current:
        start = now - i.window
        if watched_since > start:
            return Decision(desired=current, kind="stabilising", reason=(
                f"{per} would need {rec}; keeping {current} until the load has stayed "
                f"low for {i.window:g} s (scaling.scale_down_delay)"))
        peak = max((r for t, r in history if t >= start), default=rec)
        if peak >= current:
            return Decision(desired=current, kind="stabilising", reason=(
                f"{per} would need {rec}, but {peak} were needed within the last "
                f"{i.window:g} s (scaling.scale_down_delay)"))
        kind = "min" if peak == i.low else "load"
        return Decision(desired=peak, kind=kind, reason=(
            f"load has stayed at or below {peak} replicas' worth for {i.window:g} s: "
            f"{current} → {peak}"))
    kind = "min" if current == i.low and i.demand <= i.low * i.target else (
        "max" if current == i.high and i.demand > i.high * i.target else "load")
    return Decision(desired=current, kind=kind, reason=(
        f"{per} against a target of {i.target} per replica"
        + (f": at scaling.min {i.low}" if kind == "min" else "")
        + (f": at scaling.max {i.high}" if kind == "max" else "")))
