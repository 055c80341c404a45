"""Request logs of the teams that keep them: filtered by key, model, status and time;
one request opened with its record and, for a team that logs bodies, its prompt and answer.

The store reads a team's logs newest first before an instant
(``llmgw.control.tenants.request_logs``, what ``/api/v1/teams/{name}/logs``
answers); the filters other than time are applied here, reading ``BATCH`` logs
at a time, newest first before ``until``, until a page is full or ``SCAN``
were read; an "older" link goes on from where the reading stopped. One request is found again by its
team, id and instant, so opening it reads a handful of rows, not the team's log.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import msgspec
from litestar import Request, get
from litestar.params import FromQuery
from litestar.response import Template

from llmgw.admin.pages import signed_in
from llmgw.admin.render import page
from llmgw.control import tenants
from llmgw.control.context import AppContext, Ctx
from llmgw.errors import DefinitionError, LlmgwError, NotFoundError
from llmgw.store.base import UsageRecord

SHOWN = 50
SCAN = tenants.MAX_LOGS
BATCH = 200


class Entry(msgspec.Struct):
    """The record a request log keeps beside its bodies (the gateway writes it)."""

    path: str
    requested: str
    stream: bool
    usage: UsageRecord
    request_id: str | None = None


_decode_entry = msgspec.json.Decoder(Entry).decode


class Shown(msgspec.Struct, kw_only=True):
    id: str
    at: float
    key: str
    entry: Entry
    request: str | None
    response: str | None


def shown(g: tenants.LoggedRequest) -> Shown:
    return Shown(id=g.id, at=g.at, key=g.key, entry=_decode_entry(g.entry),
                 request=g.request, response=g.response)


def parse_instant(raw: str, offset_minutes: str, field: str) -> float | None:
    """A ``datetime-local`` field in the viewer's zone as Unix seconds; "" for none."""
    raw = raw.strip()
    if not raw:
        return None
    try:
        return (datetime.fromisoformat(raw).replace(tzinfo=UTC).timestamp()
                + int(offset_minutes or "0") * 60)
    except ValueError:
        raise DefinitionError(f"{field}: {raw!r} is not a date and time", field=field) from None


def matches(s: Shown, key: str, model: str, status: str, since: float | None) -> bool:
    u = s.entry.usage
    if key and s.key != key:
        return False
    if model and model not in (u.model, s.entry.requested):
        return False
    if status:
        code = str(u.status)
        # "4xx" matches every 4xx; "429" exactly 429.
        if not (code == status or (len(status) == 3 and status.endswith("xx")
                                   and code[0] == status[0])):
            return False
    return since is None or s.at >= since


async def logging_teams(ctx: AppContext) -> list[str]:
    return [t.name for t in await tenants.list_teams(ctx)
            if t.limits.log_requests not in (None, "off")]


@get("/logs")
async def logs_page(request: Request[Any, Any, Any], ctx: Ctx, team: FromQuery[str] = "",
                    key: FromQuery[str] = "", model: FromQuery[str] = "",
                    status: FromQuery[str] = "", since: FromQuery[str] = "",
                    until: FromQuery[str] = "", before: FromQuery[float | None] = None,
                    tz: FromQuery[str] = "0") -> Template:
    context: dict[str, Any] = {"team": team, "key": key, "model": model,
                               "status_filter": status,
                               "since": since, "until": until, "tz": tz, "rows": [],
                               "teams": [], "logs_error": None, "more_before": None,
                               "scanned": 0, "keys": []}
    try:
        teams = context["teams"] = await logging_teams(ctx)
        if not team and teams:
            team = context["team"] = teams[0]
        if team:
            context["keys"] = [k.name for k in await tenants.list_keys(ctx, team)]
            lo = parse_instant(since, tz, "since")
            hi = before if before is not None else parse_instant(until, tz, "until")
            rows: list[Shown] = []
            scanned = 0
            cursor = hi
            # Newest first, a batch at a time, until a page and one more match (so
            # "older" knows there are more), the logs end, or SCAN were read.
            while len(rows) <= SHOWN and scanned < SCAN:
                found = await tenants.request_logs(ctx, team, cursor, BATCH)
                scanned += len(found)
                rows += [s for s in map(shown, found) if matches(s, key, model, status, lo)]
                if len(found) < BATCH or (lo is not None and found[-1].at < lo):
                    cursor = None
                    break
                cursor = found[-1].at
            context["rows"] = rows[:SHOWN]
            context["scanned"] = scanned
            context["more_before"] = rows[SHOWN - 1].at if len(rows) > SHOWN else cursor
    except LlmgwError as exc:
        context["logs_error"] = exc.message
    return page(request, "console/logs.html", session=signed_in(request), **context)


@get("/logs/request")
async def log_entry_page(request: Request[Any, Any, Any], ctx: Ctx, team: FromQuery[str],
                         id: FromQuery[str], at: FromQuery[float]) -> Template:
    # Logs at the same instant are few; the one asked for is among the newest at or
    # before it.
    found = await tenants.request_logs(ctx, team, at + 1e-3, 20)
    entry = next((shown(g) for g in found if g.id == id), None)
    if entry is None:
        raise NotFoundError(f"team {team!r} has no request log {id!r} (it may have expired)")
    return page(request, "console/log_entry.html", session=signed_in(request), team=team,
                e=entry)


route_handlers = [logs_page, log_entry_page]
