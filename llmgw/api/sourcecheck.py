"""``POST /api/v1/source-check``: is a model's source there, before it is added?

The admin page calls this before it submits a pasted model; anything else may
too. It answers ``{"ok": true}``, or the llmgw error body (400, field
``source``) naming the source and the reason: not found, gated or
unauthorised, unreachable. The check only reads, and only where a model can
come from (``llmgw.weights.reach``: the mirror, ``source_check.allow_hosts``,
public addresses; local paths under ``source_check.local_roots`` on a server
listening beyond loopback), saying nothing of ports or files elsewhere.
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import post
from litestar.params import JSONBody
from litestar.status_codes import HTTP_200_OK

from llmgw.catalog.source import Source
from llmgw.control.context import Ctx
from llmgw.weights.check import check_source, reach_of


class SourceCheckRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    source: Source


class SourceCheckAnswer(msgspec.Struct, kw_only=True):
    ok: bool


@post("/source-check", status_code=HTTP_200_OK,
      summary="Check that a model source exists and is reachable")
async def source_check(ctx: Ctx, data: JSONBody[SourceCheckRequest]) -> SourceCheckAnswer:
    await check_source(data.source, mirror=ctx.config.mirror, reach=reach_of(ctx.config))
    return SourceCheckAnswer(ok=True)


route_handlers: list[Any] = [source_check]
