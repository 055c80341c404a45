"""The live model view: per model, what the gateway is doing now, refreshed without a reload.

The figures are the gateway's own metrics (``GatewayMetrics.samples``, what
``/metrics`` exposes), sampled in a worker thread at most every
``SAMPLE_EVERY`` seconds while someone looks, and compared with a sampling
about half a minute older (``livefigures``); the replica
counts are the scheduler's, with the scaler's reason, as ``llmgw ctl
replicas`` shows them. ``/admin/live.json`` answers the same figures for the
page's script (``static/console.js``), under the admin session like the page.

A fleet of thousands of models is mostly idle: the view lists the models
that have replicas wanted or traffic now, up to ``SHOWN``, and a filter finds
any other.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Iterable
from typing import Any

import anyio.to_thread
import msgspec
from litestar import Request, Response, get
from litestar.params import FromQuery
from litestar.response import Template

from llmgw.admin.pages import signed_in
from llmgw.admin.render import page
from llmgw.control.context import AppContext, Ctx
from llmgw.control.views import scaler_decisions

from .livefigures import BEFORE_ROUTING, ModelLive, Sampler, Snapshot, fold, live

SHOWN = 100
# The gateway's metrics are sampled at most this often, in a worker thread: reading
# every sample of a fleet of thousands of models is prometheus_client's collect(), a
# second or more of Python (the cost of a /metrics scrape), which must not stall the
# event loop the gateway also serves on, nor be paid by every viewer's refresh.
SAMPLE_EVERY = 4.0
FRESH_WAIT = 0.05


class _Sampling:
    """One process's latest sampling, the one being taken, and the older ones."""

    def __init__(self) -> None:
        self.sampler = Sampler()
        self.latest: Snapshot | None = None
        self.older: Snapshot | None = None
        self.taking: asyncio.Future[Snapshot] | None = None


_samplings: dict[int, _Sampling] = {}


Samples = Iterable[tuple[str, dict[str, str], float]]


def _take(counted: Callable[[], Samples], state: list[tuple[str, dict[str, str], float]],
          ) -> Snapshot:
    return fold(itertools.chain(counted(), state), time.time())


async def sampled(ctx: AppContext) -> tuple[Snapshot, Snapshot | None]:
    """The latest sampling and the one to take rates against. A sampling older than
    ``SAMPLE_EVERY`` starts a new one in a thread; the page waits for it ``FRESH_WAIT``
    seconds (as long as it takes when there is none yet)."""
    st = _samplings.setdefault(id(ctx), _Sampling())
    samples = ctx.gateway_samples
    if samples is None:
        return Snapshot(at=time.time(), models={}), None
    stale = st.latest is None or time.time() - st.latest.at >= SAMPLE_EVERY
    if stale and (st.taking is None or st.taking.done()):
        def keep(f: asyncio.Future[Snapshot]) -> None:
            if not f.cancelled() and f.exception() is None:
                snap = f.result()
                st.older = st.sampler.add(snap)
                st.latest = snap

        # The state figures here, on the loop (they read the gateway's own clock and
        # balancer); the counters, the bulk, in the thread.
        state = list(ctx.gateway_state()) if ctx.gateway_state is not None else []
        st.taking = asyncio.ensure_future(anyio.to_thread.run_sync(_take, samples, state))
        st.taking.add_done_callback(keep)
    if st.taking is not None and not st.taking.done():
        # A small fleet's sampling is ready at once: wait a moment for the fresh one;
        # a large fleet's answers with the previous one meanwhile.
        await asyncio.wait({st.taking}, timeout=None if st.latest is None else FRESH_WAIT)
        await asyncio.sleep(0)   # let the done callback keep it
    if st.latest is None:
        if st.taking is not None:
            st.taking.result()   # the sampling's own error, to the error page
        raise RuntimeError("the gateway's metrics were not sampled")
    return st.latest, st.older


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


async def live_view(ctx: AppContext, filter_: str = "") -> LiveView:
    snap, old = await sampled(ctx)
    seconds = snap.at - old.at if old is not None else None
    samples = ctx.gateway_samples
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
    return LiveView(at=snap.at, window=seconds, gateway=samples is not None, rows=rows,
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
