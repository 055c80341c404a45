"""The live model view: per model, what the gateway is doing now, refreshed without a reload.

The figures are the gateway's own metrics (``GatewayMetrics.samples``, what
``/metrics`` exposes) sampled when the page or its JSON is read and compared
with a sampling about half a minute older (``livefigures``); the replica
counts are the scheduler's, with the scaler's reason, as ``llmgw ctl
replicas`` shows them. ``/admin/live.json`` answers the same figures for the
page's script (``static/console.js``), under the admin session like the page.

A fleet of thousands of models is mostly idle: the view lists the models
that have replicas wanted or traffic now, up to ``SHOWN``, and a filter finds
any other.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
from litestar import Request, Response, get
from litestar.params import FromQuery
from litestar.response import Template

from llmgw.admin.pages import signed_in
from llmgw.admin.render import page
from llmgw.control.context import AppContext, Ctx
from llmgw.control.views import scaler_decisions

from .livefigures import BEFORE_ROUTING, ModelLive, Sampler, fold, live

SHOWN = 100
_samplers: dict[int, Sampler] = {}


class LiveRow(msgspec.Struct, kw_only=True):
    figures: ModelLive
    external: bool
    ready: int
    desired: int
    reason: str


class LiveView(msgspec.Struct, kw_only=True):
    at: float
    window: float | None        # seconds the rates span; None: no older sampling yet
    gateway: bool               # False: no gateway in this process, so no traffic figures
    rows: list[LiveRow]
    hidden: int                 # models matching but not shown (idle, or past SHOWN)
    # Requests refused before a model was read (no key, over a budget or a key's rate).
    refused: ModelLive


async def live_view(ctx: AppContext, filter_: str = "", now: float | None = None) -> LiveView:
    now = time.time() if now is None else now
    sampler = _samplers.setdefault(id(ctx), Sampler())
    samples = ctx.gateway_samples
    snap = fold(samples() if samples is not None else (), now)
    old = sampler.add(snap)
    seconds = now - old.at if old is not None else None
    decisions = await scaler_decisions(ctx)
    rows: list[LiveRow] = []
    hidden = 0
    for m in ctx.models.catalog:
        if filter_ and filter_ not in m.name:
            continue
        status = ctx.backend.status(m.name)
        cur = snap.models.get(m.name)
        active = cur is not None or status.desired > 0 or status.ready > 0
        if (not active and not filter_) or len(rows) >= SHOWN:
            hidden += 1
            continue
        d = decisions.get(m.name)
        rows.append(LiveRow(
            figures=live(m.name, cur, old.models.get(m.name) if old else None, seconds),
            external=m.external, ready=status.ready, desired=status.desired,
            reason=d.reason if d is not None else (
                "upstream URLs" if m.external else
                f"scaling.min {m.scaling.min}" if status.desired == m.scaling.min else "")))
    refused = live(BEFORE_ROUTING, snap.models.get(BEFORE_ROUTING),
                   old.models.get(BEFORE_ROUTING) if old else None, seconds)
    return LiveView(at=now, window=seconds, gateway=samples is not None, rows=rows,
                    hidden=hidden, refused=refused)


@get("/live")
async def live_page(request: Request[Any, Any, Any], ctx: Ctx,
                    model: FromQuery[str] = "") -> Template:
    return page(request, "console/live.html", session=signed_in(request),
                view=await live_view(ctx, model), filter=model)


_encode = msgspec.json.Encoder().encode


@get("/live.json", opt={"fragment": True})
async def live_json(ctx: Ctx, model: FromQuery[str] = "") -> Response[bytes]:
    return Response(_encode(await live_view(ctx, model)), media_type="application/json")


route_handlers = [live_page, live_json]
