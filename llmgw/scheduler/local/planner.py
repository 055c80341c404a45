"""Deciding, per model, which replicas to start and which to stop: pure arithmetic.

The backend describes the replicas a model has now; ``plan`` answers how many
to start and which to stop. Placement (does it fit?) is the backend's next step,
so a plan may ask for a start that then waits for capacity.

Rules, and the reason for each:

* A model runs what the gateway last asked for through ``set_demand`` (the
  on-demand path or the load-based scaler), kept within ``[min, max]``; until
  it asks, ``min``. The load itself is the gateway's to judge, as with Nomad.
* A replica whose profile was edited keeps counting: it serves, shown as stale,
  until a rollout. Replacing it on every edit would turn a typo fix in a
  description-adjacent field into an outage of every replica at once.
* Rollout marks replicas *retiring*. A retiring replica keeps serving until a
  fresh one is healthy in its place, one for one, so a rollout of a one-replica
  model never leaves it with nothing to route to — unless the machine has no
  room for the fresh replica beside the old one; then (``blocked``) one retiring
  replica is stopped first, because waiting would wait forever.
* Scaling down stops the replicas that serve least first: not yet healthy, then
  stale, then the most recently started.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from llmgw.catalog.model import Model


class ReplicaView(msgspec.Struct, frozen=True, kw_only=True):
    """What the planner needs of one live (not stopping) replica."""

    id: str
    healthy: bool
    stale: bool = False
    retiring: bool = False
    seq: int = 0            # start order; higher is newer


class Plan(msgspec.Struct, frozen=True, kw_only=True):
    start: int = 0
    stop: list[str] = []


def desired_count(model: Model, demand: int | None) -> int:
    """How many replicas ``model`` should run, given the gateway's request (None: none yet)."""
    if model.external:
        return 0
    s = model.scaling
    ceiling = s.max if s.max is not None else max(s.min, 1)
    return max(s.min, min(s.min if demand is None else demand, ceiling))


def _stop_order(r: ReplicaView) -> tuple[bool, bool, int]:
    # sorted() puts False first: unhealthy, then stale, then newest.
    return (r.healthy, not r.stale, -r.seq)


def plan(desired: int, replicas: Sequence[ReplicaView], *, blocked: bool = False) -> Plan:
    """Starts and stops that bring ``replicas`` to ``desired``.

    ``blocked``: the last attempt to place a fresh replica of this model found
    no room on the machine.
    """
    fresh = [r for r in replicas if not r.retiring]
    retiring = [r for r in replicas if r.retiring]
    stop: list[str] = []
    start = 0
    if len(fresh) > desired:
        surplus = sorted(fresh, key=_stop_order)[: len(fresh) - desired]
        stop += [r.id for r in surplus]
        fresh = [r for r in fresh if r.id not in stop]
    elif len(fresh) < desired:
        start = desired - len(fresh)

    healthy_fresh = sum(1 for r in fresh if r.healthy)
    keep = max(0, desired - healthy_fresh)
    ordered = sorted(retiring, key=_stop_order)
    # The retiring replicas that serve best are kept, up to the shortfall.
    kept = ordered[len(ordered) - keep:] if keep else []
    dropped = [r for r in ordered if r not in kept]
    if blocked and kept and not any(not r.healthy for r in fresh):
        # No room for a fresh replica beside the old ones, and none is loading
        # that would free one: stop one old replica to make room.
        dropped.append(kept.pop(0))
    stop += [r.id for r in dropped]
    return Plan(start=start, stop=stop)
