"""The playground: chat with any model as a key or a team would, and see how it answered.

The browser talks to the gateway itself (``/v1/chat/completions`` on this
origin, streamed), so what the page measures — time to the first token,
tokens per second — is what a client of the gateway sees, through the same
admission, routing and budgets. It acts as a key: one whose secret the
operator pastes, or one minted here for a team (``playground-<team>-…``),
which expires after ``MINTED_FOR`` on its own and is never shown: the page's
script holds it in memory, and a reload forgets it.

The gateway names the replica that answered by an opaque tag
(``x-llmgw-replica``, ``llmgw.redact.replica_tag``); ``/admin/playground/replica``
resolves it against the scheduler's replicas and the catalog's upstreams, for
the signed-in operator only.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

import msgspec
from litestar import Request, Response, get, post
from litestar.params import FromQuery
from litestar.response import Template

from llmgw.admin.actions import Form
from llmgw.admin.pages import signed_in
from llmgw.admin.prg import landing
from llmgw.admin.render import page
from llmgw.control import tenants
from llmgw.control.context import Ctx
from llmgw.control.tenants import KeyRequest
from llmgw.control.views import replicas_of
from llmgw.errors import LlmgwError
from llmgw.redact import replica_id, replica_tag, tag_key

MINTED_FOR = 3600.0
# The model list offered as suggestions; any name can be typed.
SUGGESTED = 300
_encode = msgspec.json.Encoder().encode


def _json(value: object, status: int = 200) -> Response[bytes]:
    return Response(_encode(value), media_type="application/json", status_code=status)


@get("/playground")
async def playground_page(request: Request[Any, Any, Any], ctx: Ctx,
                          model: FromQuery[str] = "") -> Template:
    names = [m.name for m in ctx.models.catalog]
    teams: list[str] = []
    teams_error = None
    try:
        teams = [t.name for t in await tenants.list_teams(ctx)]
    except LlmgwError as exc:
        teams_error = exc.message
    base = (ctx.config.public_url or str(request.base_url)).rstrip("/")
    return page(request, "console/playground.html", session=signed_in(request),
                models=names[:SUGGESTED], model=model or (names[0] if names else ""),
                teams=teams, teams_error=teams_error, base_url=base,
                minted_minutes=int(MINTED_FOR // 60))


class Minted(msgspec.Struct, kw_only=True):
    key: str
    name: str
    team: str
    expires_at: float


@post("/playground/key", opt={"fragment": True})
async def mint_key(request: Request[Any, Any, Any], ctx: Ctx, data: Form) -> Response[bytes]:
    """A short-lived key of a team for the playground's script; JSON, never a page."""
    team = data.get("team", "").strip()
    name = f"playground-{team}-{secrets.token_hex(3)}"[:64]
    try:
        created = await tenants.create_key(ctx, KeyRequest(name=name, team=team),
                                           signed_in(request).name)
        until = time.time() + MINTED_FOR
        await tenants.set_key_expiry(ctx, name, until)
    except LlmgwError as exc:
        return _json({"error": exc.message}, exc.status)
    return _json(Minted(key=created.key, name=name, team=team, expires_at=until))


class Answered(msgspec.Struct, kw_only=True):
    tag: str
    replica: str | None = None       # the scheduler's replica id
    model: str | None = None
    node: str | None = None
    upstream: str | None = None      # an external model's upstream, as host:port


@get("/playground/replica", opt={"fragment": True})
async def which_replica(ctx: Ctx, tag: FromQuery[str]) -> Response[bytes]:
    key = tag_key(ctx.config.admin_token_names())
    for r in await replicas_of(ctx) or []:
        if r.address and replica_tag(r.address, key) == tag:
            return _json(Answered(tag=tag, replica=r.id, model=r.model, node=r.node))
    for m in ctx.models.catalog:
        for url in m.upstream or []:
            if replica_tag(url, key) == tag:
                return _json(Answered(tag=tag, model=m.name, upstream=replica_id(url)))
    return _json(Answered(tag=tag))


route_handlers = [playground_page, mint_key, which_replica,
                  landing("/playground/key", "/admin/playground")]
