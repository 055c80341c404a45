"""Creating, limiting and revoking teams and runtime keys; the views the API answers with.

Every rule lives here, shared by the API and the CLI (through the API): names,
limits (``gateway.tenants.check_limits``), a key narrowing its team, and the
keys file winning every conflict — a runtime key may not take a name the file
declares. A key is made here, returned once in ``CreatedKey`` and stored only
as its SHA-256.
"""

from __future__ import annotations

import time

import msgspec

from llmgw.control.context import AppContext
from llmgw.errors import DefinitionError, NotFoundError, RefusedError, StoreUnavailableError
from llmgw.store.base import Store, StoredKey, StoredTeam
from llmgw.tenancy import (
    KeyLimits,
    KeyName,
    Limits,
    TeamName,
    check_key_name,
    check_limits,
    check_models_known,
    check_narrowing,
    check_team_name,
    decode_limits,
    encode_limits,
    generate_key,
    hash_key,
    key_id,
    read_keys_file,
)


class TeamRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    name: TeamName
    limits: Limits = msgspec.field(default_factory=Limits)


class KeyRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    name: KeyName
    team: TeamName
    limits: KeyLimits = msgspec.field(default_factory=KeyLimits)


class TeamView(msgspec.Struct, kw_only=True):
    name: str
    limits: Limits
    keys: list[str]
    created_by: str
    created_at: float


class KeyView(msgspec.Struct, kw_only=True):
    name: str
    # What owns the key's files, batches and responses and names it in usage records
    # (``tenancy.key_id``): a later key of the same name has another.
    id: str
    team: str
    limits: Limits
    created_by: str
    created_at: float
    expires_at: float | None = None       # refused from then on; None: never
    # After a rotation: the replaced secret is accepted until then.
    previous_until: float | None = None


class CreatedKey(msgspec.Struct, kw_only=True):
    """The one answer that carries a key: it is not stored and cannot be shown again."""

    name: str
    id: str
    team: str
    key: str


def served_names(ctx: AppContext) -> set[str]:
    """What a request may name as its model: the catalog's models and LoRA adapters."""
    catalog = ctx.models.catalog
    return {m.name for m in catalog} | set(catalog.adapters)


def _store(ctx: AppContext) -> Store:
    if not ctx.store.is_open:
        raise StoreUnavailableError(
            "the store is not open, so teams and keys cannot be changed; check database: in "
            "server.yaml (`/readyz` says why)")
    return ctx.store


# The store, open, for the other views of the tenants' traffic (``control.traffic``).
store_of = _store


async def _team(store: Store, name: str) -> StoredTeam:
    teams, _ = await store.tenants()
    for t in teams:
        if t.name == name:
            return t
    known = ", ".join(t.name for t in teams) or "none"
    raise NotFoundError(f"no team named {name!r} (teams: {known})", field="team")


async def list_teams(ctx: AppContext) -> list[TeamView]:
    return (await teams_and_keys(ctx))[0]


async def teams_and_keys(ctx: AppContext) -> tuple[list[TeamView], list[KeyView]]:
    """Every team and every key, from one read of the store."""
    teams, keys = await _store(ctx).tenants()
    names: dict[str, list[str]] = {}
    for k in keys:
        names.setdefault(k.team, []).append(k.name)
    return ([TeamView(name=t.name, limits=decode_limits(t.settings),
                      keys=names.get(t.name, []), created_by=t.created_by,
                      created_at=t.created_at) for t in teams],
            [key_view(k) for k in keys])


async def list_keys(ctx: AppContext, team: str | None = None) -> list[KeyView]:
    _, keys = await _store(ctx).tenants()
    return [key_view(k) for k in keys if team is None or k.team == team]


def key_view(k: StoredKey) -> KeyView:
    return KeyView(name=k.name, id=k.owner or key_id(k.sha256), team=k.team,
                   limits=decode_limits(k.settings), created_by=k.created_by,
                   created_at=k.created_at, expires_at=k.expires_at,
                   previous_until=k.previous_until)


async def create_team(ctx: AppContext, request: TeamRequest, by: str) -> TeamView:
    check_team_name(request.name)
    check_limits(request.limits, f"team {request.name!r}")
    check_models_known(request.limits, served_names(ctx), f"team {request.name!r}")
    row = StoredTeam(name=request.name, settings=encode_limits(request.limits), created_by=by,
                     created_at=time.time())
    if not await _store(ctx).put_team(row, create=True):
        raise RefusedError(f"a team named {request.name!r} already exists; change its limits "
                           "with `llmgw ctl team set`")
    return TeamView(name=row.name, limits=request.limits, keys=[], created_by=by,
                    created_at=row.created_at)


async def set_team_limits(ctx: AppContext, name: str, limits: Limits) -> TeamView:
    store = _store(ctx)
    check_limits(limits, f"team {name!r}")
    check_models_known(limits, served_names(ctx), f"team {name!r}")
    current = await _team(store, name)
    _, keys = await store.tenants()
    for k in keys:
        if k.team == name:
            check_narrowing(limits, decode_limits(k.settings),
                            f"team {name!r} (its key {k.name!r} would widen it)")
    row = StoredTeam(name=name, settings=encode_limits(limits), created_by=current.created_by,
                     created_at=current.created_at)
    if not await store.put_team(row, create=False):
        raise NotFoundError(f"team {name!r} was revoked meanwhile", field="name")
    return TeamView(name=name, limits=limits, keys=[k.name for k in keys if k.team == name],
                    created_by=row.created_by, created_at=row.created_at)


async def revoke_team(ctx: AppContext, name: str) -> None:
    if not await _store(ctx).delete_team(name):
        raise NotFoundError(f"no team named {name!r}", field="name")


async def create_key(ctx: AppContext, request: KeyRequest, by: str) -> CreatedKey:
    check_key_name(request.name)
    limits = request.limits.limits()
    check_models_known(limits, served_names(ctx), f"key {request.name!r}")
    store = _store(ctx)
    team = await _team(store, request.team)
    check_narrowing(decode_limits(team.settings), limits, f"key {request.name!r}")
    if ctx.config.keys_file and any(
            k.name == request.name for k in read_keys_file(ctx.config.keys_file).keys):
        raise RefusedError(f"the keys file {ctx.config.keys_file} declares a key named "
                           f"{request.name!r}, and the file wins; choose another name")
    key = generate_key()
    row = StoredKey(name=request.name, team=request.team, sha256=hash_key(key),
                    settings=encode_limits(limits), created_by=by,
                    created_at=time.time())
    if not await store.put_key(row):
        raise RefusedError(f"a key named {request.name!r} already exists (or team "
                           f"{request.team!r} was just revoked); revoke it first or choose "
                           "another name")
    return CreatedKey(name=request.name, id=key_id(row.sha256), team=request.team, key=key)


async def _key(store: Store, name: str) -> StoredKey:
    _, keys = await store.tenants()
    for k in keys:
        if k.name == name:
            return k
    raise NotFoundError(f"no runtime key named {name!r} (keys in the keys file are changed "
                        "with `llmgw keys` on the control-plane host)", field="name")


async def _update_key(store: Store, row: StoredKey) -> KeyView:
    if not await store.update_key(row):
        raise NotFoundError(f"key {row.name!r} was revoked meanwhile", field="name")
    return key_view(row)


async def set_key_limits(ctx: AppContext, name: str, limits: Limits) -> KeyView:
    """Replace how a key narrows its team's limits (its secret and id stay)."""
    store = _store(ctx)
    current = await _key(store, name)
    team = await _team(store, current.team)
    check_narrowing(decode_limits(team.settings), limits, f"key {name!r}")
    return await _update_key(store, msgspec.structs.replace(
        current, settings=encode_limits(limits)))


# The longest a replaced secret may stay valid: long enough for a slow fleet to move.
MAX_GRACE = 30 * 86400.0


async def set_key_expiry(ctx: AppContext, name: str, expires_at: float | None) -> KeyView:
    """Set (or, with None, clear) when a key stops being accepted."""
    if expires_at is not None and expires_at <= time.time():
        raise DefinitionError("expires: the time is in the past; revoke the key to refuse it "
                              "now", field="expires_at")
    store = _store(ctx)
    current = await _key(store, name)
    return await _update_key(store, msgspec.structs.replace(current, expires_at=expires_at))


async def rotate_key(ctx: AppContext, name: str, grace: float) -> CreatedKey:
    """A new secret for a key; the old one is accepted for ``grace`` more seconds. The key
    keeps its id (what owns its files, batches and responses), team and limits."""
    if not 0 <= grace <= MAX_GRACE:
        raise DefinitionError(f"grace: {grace:.0f} s is outside 0 to {MAX_GRACE:.0f} s "
                              "(30 days)", field="grace")
    store = _store(ctx)
    current = await _key(store, name)
    key = generate_key()
    row = msgspec.structs.replace(
        current, sha256=hash_key(key), owner=current.owner or key_id(current.sha256),
        previous_sha256=current.sha256 if grace > 0 else None,
        previous_until=time.time() + grace if grace > 0 else None)
    await _update_key(store, row)
    return CreatedKey(name=name, id=row.owner or key_id(row.sha256), team=row.team, key=key)


async def revoke_key(ctx: AppContext, name: str) -> None:
    if not await _store(ctx).delete_key(name):
        raise NotFoundError(f"no runtime key named {name!r} (keys in the keys file are revoked "
                            "with `llmgw keys revoke` on the control-plane host)", field="name")


class LoggedRequest(msgspec.Struct, kw_only=True):
    id: str
    at: float
    key: str
    entry: msgspec.Raw            # path, requested model, stream, and its usage record
    request: str | None           # the bodies, for a team that logs them
    response: str | None


# The most request logs one read returns (the API's ``limit`` parameter says so too).
MAX_LOGS = 1000


async def request_logs(ctx: AppContext, team: str, before: float | None,
                       limit: int) -> list[LoggedRequest]:
    if not 1 <= limit <= MAX_LOGS:
        raise DefinitionError(f"limit {limit} must be 1 to {MAX_LOGS}", field="limit")
    store = _store(ctx)
    await _team(store, team)   # no such team (or revoked): 404, as every read of a team
    logs = await store.request_logs(team, before if before is not None else time.time() + 1,
                                    limit)
    return [LoggedRequest(id=g.id, at=g.at, key=g.key, entry=msgspec.Raw(g.record),
                          request=None if g.request is None
                          else g.request.decode("utf-8", "replace"),
                          response=None if g.response is None
                          else g.response.decode("utf-8", "replace")) for g in logs]
