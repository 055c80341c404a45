"""How models and replicas are shown, to the JSON API and the admin page alike.

A view joins the catalog in force (the definition with defaults applied), the
store row behind a runtime model (who added it and when) and the scheduler's
status (replicas ready against desired, stale profiles, memory warnings,
waiting for capacity and the last placement failure). Both faces build their
answers here, so a figure cannot read one way on the page and another in the
API.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime
from typing import Literal

import msgspec

from llmgw.catalog.fingerprint import fingerprints, is_stale
from llmgw.catalog.model import Model, Scaling
from llmgw.catalog.units import Duration, format_size
from llmgw.control.context import AppContext
from llmgw.control.traffic import UpstreamHealth
from llmgw.errors import NotFoundError, StoreUnavailableError
from llmgw.redact import redact_url
from llmgw.scheduler.base import (
    SCALER_REPORT,
    ModelStatus,
    Replica,
    ScalerDecision,
    ScalerDecisions,
)

log = logging.getLogger("llmgw.api")

# The list view asks the scheduler for replicas once per request; if that is
# slow (Nomad busy) the list still answers, without the per-replica details.
REPLICA_LOOKUP_TIMEOUT = 2.0

# Measured memory this far below the reservation is worth a look: the
# reservation keeps other replicas off cores and memory the engine never uses.
UNDERUSE_RATIO = 0.5


class ScalingInForce(msgspec.Struct, kw_only=True):
    """Scaling after defaults, every field shown (the catalog omits defaults when stored)."""

    min: int
    max: int
    target: int
    scale_down_delay: Duration
    idle_timeout: Duration
    wait: Duration

    @classmethod
    def of(cls, s: Scaling) -> ScalingInForce:
        return cls(min=s.min, max=s.max if s.max is not None else max(s.min, 1),
                   target=s.target, scale_down_delay=s.scale_down_delay,
                   idle_timeout=s.idle_timeout, wait=s.wait)


class ModelView(msgspec.Struct, kw_only=True):
    name: str
    origin: Literal["declared", "runtime"]
    external: bool
    added_by: str | None = None
    added_at: datetime | None = None
    updated_by: str | None = None
    updated_at: datetime | None = None
    scaling: ScalingInForce
    fingerprints: dict[str, str]
    status: ModelStatus
    scaler: ScalerDecision | None = None
    # An external model's upstream, from the gateways' probes and recent requests.
    upstream: UpstreamHealth | None = None
    stale_replicas: int = 0
    memory_warnings: list[str] = []
    definition: Model


class AddedView(ModelView, kw_only=True):
    """The answer to adding a model: its view, and warnings about the definition (a
    profile's memory below what one replica needs), which never stop the add."""

    warnings: list[str] = []

    @classmethod
    def of(cls, view: ModelView, warnings: list[str]) -> AddedView:
        return cls(**msgspec.structs.asdict(view), warnings=warnings)


class ReplicaView(msgspec.Struct, kw_only=True):
    id: str
    model: str
    profile: str
    fingerprint: str
    node: str
    state: str
    healthy: bool
    address: str | None
    stale: bool
    stale_reason: str | None
    reserved_memory: int | None
    measured_memory: int | None
    memory_warning: str | None
    restarts: int
    message: str
    phase: str = ""


def memory_warning(r: Replica) -> str | None:
    reserved, measured = r.reserved_memory, r.measured_memory
    if not reserved or measured is None:
        return None
    if measured > reserved:
        return (f"measured {format_size(measured)} exceeds the {format_size(reserved)} "
                "reserved; raise memory with `llmgw ctl model resources` before it is killed")
    if measured < reserved * UNDERUSE_RATIO:
        return (f"measured {format_size(measured)} is far below the {format_size(reserved)} "
                "reserved; lower memory to free the node for other replicas")
    return None


def replica_view(r: Replica, model: Model | None) -> ReplicaView:
    current = None
    if model is not None:
        profile = model.profile(r.profile)
        current = fingerprints(model).get(profile.name) if profile else None
    if current is None:
        stale, reason = bool(r.fingerprint), "its profile is no longer in the catalog"
    else:
        stale = is_stale(r.fingerprint, current)
        reason = "stale profile: started with an older definition; `llmgw ctl rollout` " \
                 "replaces it"
    return ReplicaView(
        id=r.id, model=r.model, profile=r.profile, fingerprint=r.fingerprint, node=r.node,
        state=r.state, healthy=r.healthy, address=r.address, stale=stale,
        stale_reason=reason if stale else None, reserved_memory=r.reserved_memory,
        measured_memory=r.measured_memory, memory_warning=memory_warning(r),
        restarts=r.restarts, message=r.message, phase=r.phase,
    )


async def replicas_of(ctx: AppContext, model: str | None = None) -> list[Replica] | None:
    try:
        return await asyncio.wait_for(ctx.backend.replicas(model), REPLICA_LOOKUP_TIMEOUT)
    except Exception as exc:  # the list must answer even when the scheduler does not
        log.warning("replica lookup failed: %s", exc)
        return None


# How old the scaler's published decisions may be: a few of its ticks.
SCALER_FRESH = 30.0


async def scaler_decisions(ctx: AppContext) -> dict[str, ScalerDecision]:
    """The gateway scaler's latest decisions, from the store; none when it cannot be read."""
    try:
        found = await ctx.store.reports(SCALER_REPORT[0], SCALER_FRESH)
    except StoreUnavailableError as exc:
        log.warning("cannot read the scaler's decisions: %s", exc.message)
        return {}
    except Exception as exc:  # the view must answer whatever the store does (not open yet)
        log.warning("cannot read the scaler's decisions: %s", exc)
        return {}
    for report in found:
        if report.key == SCALER_REPORT[1]:
            try:
                models = msgspec.json.decode(report.payload, type=ScalerDecisions).models
            except (msgspec.DecodeError, msgspec.ValidationError):
                return {}
            return {name: msgspec.structs.replace(
                d, since=None if d.since is None else d.since + report.age)
                for name, d in models.items()}
    return {}


def desired_reason(scaling: ScalingInForce, scaler: ScalerDecision | None) -> str:
    """Why a model wants the replicas it does, worded as ``llmgw ctl replicas`` words it."""
    if scaler is not None:
        why = f"scaler ({scaler.kind}): {scaler.reason}"
        if scaler.since is not None:
            why += f"; count unchanged for {scaler.since:.0f}s"
        return why
    if scaling.max > max(scaling.min, 1):
        return "no decision from the gateway's scaler yet"
    if scaling.min == 0:
        return "on demand: started by a request, stopped when idle"
    return "fixed: scaling.min = scaling.max"


def replicas_by_model(replicas: list[Replica] | None) -> dict[str, list[Replica]]:
    """``replicas`` grouped by model, so a list of views looks each model up once
    instead of scanning every replica per model."""
    out: dict[str, list[Replica]] = {}
    for r in replicas or []:
        out.setdefault(r.model, []).append(r)
    return out


def model_view(ctx: AppContext, m: Model, replicas: list[Replica] | None,
               decisions: dict[str, ScalerDecision] | None = None,
               upstreams: dict[str, UpstreamHealth] | None = None) -> ModelView:
    row = ctx.models.stored(m.name)
    mine = [r for r in replicas or [] if r.model == m.name]
    views = [replica_view(r, m) for r in mine]
    return ModelView(
        name=m.name,
        origin=ctx.models.origin(m.name),
        external=m.external,
        added_by=row.added_by if row else None,
        added_at=row.added_at if row else None,
        updated_by=row.updated_by if row else None,
        updated_at=row.updated_at if row else None,
        scaling=ScalingInForce.of(m.scaling),
        fingerprints=fingerprints(m),
        status=ctx.backend.status(m.name),
        scaler=(decisions or {}).get(m.name),
        upstream=(upstreams or {}).get(m.name),
        stale_replicas=sum(1 for v in views if v.stale),
        memory_warnings=[f"{r.id}: {w}" for r in mine if (w := memory_warning(r))],
        definition=shown_definition(m),
    )


def shown_definition(m: Model) -> Model:
    """The definition as a person sees it (API, ctl, the admin page): an upstream's
    credentials masked like a source's (``llmgw.redact``)."""
    if not m.upstream:
        return m
    return msgspec.structs.replace(m, upstream=[redact_url(u) for u in m.upstream])


def find_model(ctx: AppContext, name: str) -> Model:
    m = ctx.models.catalog.get(name)
    if m is None:
        raise NotFoundError(
            f"there is no model named {name!r}; `llmgw ctl model list` shows the catalog")
    return m
