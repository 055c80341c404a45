"""Every replica of every model: phase, node, restarts, the last event, and the engine's log.

The list is the scheduler's (``Control.replicas``, what ``llmgw ctl
replicas`` prints), decorated by ``replica_view`` (stale profile, memory).
"The last event" is the replica's own account: its phase and the last
failure message the scheduler recorded (Nomad's task events, the local
supervisor's exit and output summary). One replica's page adds the engine's
recent output when the backend can read it (``ReplicaLogs``: the local
supervisor's kept lines, Nomad's ``/v1/client/fs/logs``); a scheduler that
cannot is said so, not shown as an empty log.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from litestar import Request, get
from litestar.params import FromQuery
from litestar.response import Template

from llmgw.admin.pages import signed_in
from llmgw.admin.render import page
from llmgw.control.context import Ctx
from llmgw.control.views import replica_view, replicas_of
from llmgw.errors import LlmgwError, NotFoundError
from llmgw.scheduler.base import ReplicaLogs

log = logging.getLogger("llmgw.admin")

SHOWN = 200
LOG_LINES = 200
LOG_TIMEOUT = 5.0


@get("/replicas")
async def replicas_page(request: Request[Any, Any, Any], ctx: Ctx,
                        model: FromQuery[str] = "") -> Template:
    answered = await replicas_of(ctx, model or None)
    found = sorted(answered or [], key=lambda r: (r.model, r.id))
    catalog = ctx.models.catalog
    views = [replica_view(r, catalog.get(r.model)) for r in found[:SHOWN]]
    return page(request, "console/replicas.html", session=signed_in(request),
                replicas=views, hidden=max(0, len(found) - SHOWN),
                replicas_unknown=answered is None, filter=model,
                backend=ctx.backend.health())


@get("/replica")
async def replica_page(request: Request[Any, Any, Any], ctx: Ctx,
                       id: FromQuery[str], model: FromQuery[str] = "") -> Template:
    # The list's links name the model too, so one model's replicas are asked for.
    found = await replicas_of(ctx, model or None)
    if found is None:
        raise NotFoundError("the scheduler did not answer, so replica "
                            f"{id!r} cannot be shown; /readyz says why")
    r = next((r for r in found if r.id == id), None)
    if r is None:
        raise NotFoundError(f"no replica {id!r} now (it may have stopped); the replicas "
                            "page lists those there are")
    view = replica_view(r, ctx.models.catalog.get(r.model))
    lines: list[str] | None = None
    log_error = None
    backend = ctx.backend
    if isinstance(backend, ReplicaLogs):
        try:
            lines = await asyncio.wait_for(backend.replica_log(id, LOG_LINES), LOG_TIMEOUT)
        except LlmgwError as exc:
            log_error = exc.message
        except TimeoutError:
            log_error = f"the scheduler did not send the log within {LOG_TIMEOUT:.0f} s"
        except Exception as exc:  # the page answers without the log when its source fails
            log.warning("log of replica %s: %s", id, exc)
            log_error = f"the log could not be read ({type(exc).__name__}); see the server's log"
    else:
        log_error = "this scheduler does not expose its replicas' output"
    return page(request, "console/replica.html", session=signed_in(request), r=view,
                lines=lines, log_error=log_error)


route_handlers = [replicas_page, replica_page]
