"""Teams and keys: what a key is, the limits a team sets and a key narrows.

Shared by the gateway (which enforces them) and the control plane (which
changes them); the keys file's format and reader live here for the same reason.

Teams and keys created at run time live beside the keys file.

A team holds limits; a key belongs to one team and may narrow them. Both
live in the store (``teams``, ``api_keys``), so every gateway instance sees
them: each polls ``tenants_version()`` — one primary-key read — every half
second (``gateway.tenants``) and, when it moved, reads the teams and keys
again and puts them in force beside the keys file's. A revoked team or key is therefore
refused by every instance within a second of the change.

**The keys file wins every conflict**, as ``server.yaml`` wins over runtime
models: a runtime key whose name or hash is also in the file is ignored
(logged), so a reviewed file cannot be overridden from the API. Keys from
the file belong to no team; the ledger files them under the team ``-``.

Limits (``Limits``) are the same fields on a team and on a key:

* ``models``: the allow-list (absent: every model). A key's list must be
  inside its team's.
* ``rpm``: requests per minute, per gateway process (as the keys file's).
  A team's limit is one bucket shared by its keys.
* ``tokens_per_minute``, ``tokens_per_day``, ``tokens_per_month``: token
  budgets (prompt + completion) enforced across instances: each gateway
  reserves a request's worst case against a slice of the budget it leases
  from the store (``llmgw.gateway.slices``). A team's budget counts every key
  of the team.
* ``when_store_down`` (``refuse``, the default, or ``admit``): what the
  token budgets set beside it do once a gateway's lease on them has run out
  because the store cannot be reached.
* ``priority``: the admission class (``interactive`` or ``batch``); a key
  may only lower it.

and on a team only (a key setting them is refused):

* ``cost_per_day``, ``cost_per_month``: budgets of the team's attributed GPU
  and CPU cost (``llmgw.control.costs``);
* ``log_requests`` (``off``, ``metadata``, ``bodies``) and
  ``log_retention_days``: the team's request logs.

**What owns a tenant's objects is a key's id, never its name.** Stored
responses, files, batches and their outputs belong to ``key_id(sha256)`` of
the key that made them (``keys.ApiKey.owner``), and every usage record names
it beside the key's name and team. A key's team never changes (moving a name
to another team is a revocation and a new key), so the id also fixes the
team a batch bills. The id is derived from the key's hash rather than drawn
at creation: the keys file, which a person edits, then needs no new field and
its existing entries have ids already; both sources give the same key the
same id on every instance without a write; and a new key — ``keys add`` or
the API after a revocation, under an old name or not — is new random bits,
so a new hash and a new id that owns nothing of the old one's. A revoked
key's id resolves to no key again unless the very same secret is put back
(an operator restoring a file entry), which is the same holder. The id is 128
bits of a SHA-256 of 256 random bits: it tells nothing about the key.

**Rotation keeps the id.** Rotating a runtime key gives it a new secret; its
id stays the one its first secret gave it (stored as the key's ``owner``),
so what it owns stays its own. The replaced secret is accepted until the
grace period chosen at rotation ends (``previous_until``), so clients can
move over without an outage, and never after. A key may also expire
(``expires_at``): from then on it is refused like a revoked one, though its
row stays, with its id, until it is revoked or given a later expiry.

Every number must be at least 1 (a cost more than 0) and at most
``MAX_TOKENS`` (``MAX_RPM`` for ``rpm``, ``MAX_COST``, ``MAX_LOG_DAYS``): zero,
negative or absurd values are refused naming the field.
"""

from __future__ import annotations

import hashlib
import logging
import re
import secrets
from collections.abc import Collection, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Literal

import msgspec

from llmgw.catalog.rules import rule
from llmgw.errors import ConfigError, DefinitionError, RefusedError
from llmgw.store.base import StoredKey, StoredTeam

log = logging.getLogger("llmgw.tenancy")

# The admission class of a key's requests when a model is saturated.
Priority = Literal["interactive", "batch"]

TEAM_NAME = rule(r"^[a-z][a-z0-9-]{0,62}$(?!\n)",
                 "a team name: 1 to 63 lowercase letters, digits and '-', starting with a letter")
TeamName = Annotated[str, TEAM_NAME]
TEAM_RE = re.compile(TEAM_NAME.pattern or "")
# Team of the keys declared in the keys file (not a valid team name, so no clash).
FILE_TEAM = "-"
# 10^13 tokens is beyond any fleet's month; a larger budget is a typo.
MAX_TOKENS = 10**13
MAX_RPM = 10**8
MAX_LOG_DAYS = 3650
MAX_COST = 10**9
# What the type of each limit admits; ``check_limits`` says the same of limits built in code.
Rpm = Annotated[int, msgspec.Meta(ge=1, le=MAX_RPM)]
Tokens = Annotated[int, msgspec.Meta(ge=1, le=MAX_TOKENS)]
Cost = Annotated[float, msgspec.Meta(gt=0, le=MAX_COST)]
CostField = Literal["cost_per_day", "cost_per_month"]
COST_FIELDS: tuple[CostField, ...] = ("cost_per_day", "cost_per_month")
DEFAULT_LOG_DAYS = 30

BudgetField = Literal["tokens_per_minute", "tokens_per_day", "tokens_per_month"]
BUDGET_FIELDS: tuple[BudgetField, ...] = ("tokens_per_minute", "tokens_per_day",
                                          "tokens_per_month")


class Limits(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=True):
    """What a team allows, or how a key narrows its team."""

    models: Annotated[list[Annotated[str, msgspec.Meta(min_length=1)]],
                      msgspec.Meta(min_length=1)] | None = None
    rpm: Rpm | None = None
    tokens_per_minute: Tokens | None = None
    tokens_per_day: Tokens | None = None
    tokens_per_month: Tokens | None = None
    priority: Priority | None = None
    # Request logs, set on a team only: "metadata" keeps each request's record;
    # "bodies" also its prompt and answer. Kept for log_retention_days (30).
    log_requests: Literal["off", "metadata", "bodies"] | None = None
    log_retention_days: Annotated[int, msgspec.Meta(ge=1, le=MAX_LOG_DAYS)] | None = None
    # Cost budgets, set on a team only, in the currency of the configured prices
    # (``llmgw.control.costs``): the team's attributed GPU and CPU time per UTC day/month.
    cost_per_day: Cost | None = None
    cost_per_month: Cost | None = None
    # What the token budgets set here do while a gateway cannot renew its slice of them
    # (``llmgw.gateway.slices``): refuse (the default; the budget holds) or admit.
    when_store_down: Literal["refuse", "admit"] | None = None

    def has_budget(self) -> bool:
        return (self.tokens_per_minute is not None or self.tokens_per_day is not None
                or self.tokens_per_month is not None or self.has_cost_budget())

    def has_cost_budget(self) -> bool:
        return self.cost_per_day is not None or self.cost_per_month is not None

    def budget(self, name: BudgetField) -> int | None:
        value: int | None = getattr(self, name)
        return value


class KeyLimits(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=True):
    """What a key may set to narrow its team: every field of ``Limits`` but the team-wide
    ones (request logs and cost budgets), so the API's schema states that rule itself."""

    models: Annotated[list[Annotated[str, msgspec.Meta(min_length=1)]],
                      msgspec.Meta(min_length=1)] | None = None
    rpm: Rpm | None = None
    tokens_per_minute: Tokens | None = None
    tokens_per_day: Tokens | None = None
    tokens_per_month: Tokens | None = None
    priority: Priority | None = None
    when_store_down: Literal["refuse", "admit"] | None = None

    def limits(self) -> Limits:
        return msgspec.convert(msgspec.to_builtins(self), Limits)

    @classmethod
    def of(cls, limits: Limits) -> KeyLimits:
        """``limits`` as a key's; ``DefinitionError`` naming a team-wide field it sets."""
        for name in TEAM_WIDE:
            if getattr(limits, name) is not None:
                raise DefinitionError(f"{name} is set on the team, for all its keys",
                                      field=name)
        return msgspec.convert(msgspec.to_builtins(limits), cls)


# The limits only a team sets: they hold for all its keys.
TEAM_WIDE = ("log_requests", "log_retention_days", *COST_FIELDS)


class TeamCosts(msgspec.Struct, kw_only=True):
    """What the cost meter publishes (a store report) for the gateways' cost budgets:
    each team's cost since the UTC day's and month's start."""

    day_start: float
    month_start: float
    day: dict[str, float] = msgspec.field(default_factory=dict)
    month: dict[str, float] = msgspec.field(default_factory=dict)
    # When the figures were computed, and what each team's share of the replicas held
    # then costs per second: a gateway adds rate x (now - at), so a cost budget is
    # checked against the cost accrued up to the moment of the request, not up to the
    # meter's last pass (``llmgw.control.costs``).
    at: float = 0.0
    rate: dict[str, float] = msgspec.field(default_factory=dict)


COSTS_REPORT = "team-costs"

_decode_limits = msgspec.json.Decoder(Limits)
encode_limits = msgspec.json.Encoder().encode


# The periods of token budgets, as the gateways count them and the console shows them.
def period_start(field: BudgetField, now: float) -> float:
    """Where the period of ``field`` holding ``now`` began (Unix seconds, UTC)."""
    if field == "tokens_per_minute":
        return now - 60.0
    t = datetime.fromtimestamp(now, UTC)
    if field == "tokens_per_day":
        return t.replace(hour=0, minute=0, second=0, microsecond=0).timestamp()
    return t.replace(day=1, hour=0, minute=0, second=0, microsecond=0).timestamp()


def resets_at(field: BudgetField, now: float) -> float:
    """When the budget of ``field`` used up at ``now`` has room again (at the latest)."""
    if field == "tokens_per_minute":
        return now + 60.0
    t = datetime.fromtimestamp(period_start(field, now), UTC)
    if field == "tokens_per_day":
        return (t + timedelta(days=1)).timestamp()
    year, month = (t.year + 1, 1) if t.month == 12 else (t.year, t.month + 1)
    return t.replace(year=year, month=month).timestamp()


def check_limits(limits: Limits, where: str) -> None:
    """Refuse numbers below 1 or beyond belief, naming the field."""
    for name in ("rpm", *BUDGET_FIELDS):
        value = getattr(limits, name)
        if value is None:
            continue
        ceiling = MAX_RPM if name == "rpm" else MAX_TOKENS
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise DefinitionError(
                f"{where}: {name} {value!r} must be a whole number of at least 1; omit it for "
                "no limit", field=name)
        if value > ceiling:
            raise DefinitionError(
                f"{where}: {name} {value} is larger than {ceiling:,} (is it a typo?); omit it "
                "for no limit", field=name)
    for name in COST_FIELDS:
        cost = getattr(limits, name)
        if cost is None:
            continue
        if isinstance(cost, bool) or not isinstance(cost, int | float) or not cost > 0:
            raise DefinitionError(f"{where}: {name} {cost!r} must be more than 0; omit it for "
                                  "no limit", field=name)
        if cost > MAX_COST:
            raise DefinitionError(f"{where}: {name} {cost} is larger than {MAX_COST:,} (is it "
                                  "a typo?); omit it for no limit", field=name)
    days = limits.log_retention_days
    if days is not None and (isinstance(days, bool) or not 1 <= days <= MAX_LOG_DAYS):
        raise DefinitionError(f"{where}: log_retention_days {days!r} must be 1 to "
                              f"{MAX_LOG_DAYS}", field="log_retention_days")
    if limits.models is not None:
        if not limits.models:
            raise DefinitionError(
                f"{where}: models is an empty list, which would allow nothing; omit it to "
                "allow every model", field="models")
        for m in limits.models:
            if not isinstance(m, str) or not m:
                raise DefinitionError(f"{where}: models holds {m!r}, not a model name",
                                      field="models")


def check_models_known(limits: Limits, known: Collection[str], where: str) -> None:
    """Refuse an allow-list naming what the catalog does not serve (models and LoRA
    adapters): a typo there would lock the team out of the model it meant, silently.
    Every unknown name is listed at once. A conflict with the catalog in force (409),
    not a malformed request: the same list is accepted once the model is added."""
    if limits.models is None:
        return
    unknown = [m for m in limits.models if m not in known]
    if unknown:
        names = ", ".join(repr(m) for m in unknown)
        raise RefusedError(
            f"{where}: models {names} {'is' if len(unknown) == 1 else 'are'} not in the "
            "catalog; `llmgw ctl model list` shows what is served (add the model first, or "
            "correct the name)", field="models")


def check_narrowing(team: Limits, key: Limits, where: str) -> None:
    """A key may narrow its team's limits, never widen its allow-list or priority."""
    check_limits(key, where)
    for name in TEAM_WIDE:
        if getattr(key, name) is not None:
            raise DefinitionError(f"{where}: {name} is set on the team, for all its keys",
                                  field=name)
    if key.models is not None and team.models is not None:
        outside = sorted(set(key.models) - set(team.models))
        if outside:
            raise DefinitionError(
                f"{where}: models {outside} are not in the team's allow-list "
                f"{sorted(team.models)}; a key may only narrow it", field="models")
    if key.priority == "interactive" and team.priority == "batch":
        raise DefinitionError(
            f"{where}: priority interactive is above the team's batch; a key may only lower it",
            field="priority")


def decode_limits(data: bytes) -> Limits:
    return _decode_limits.decode(data) if data else Limits()


def check_team_name(name: str, field: str = "name") -> None:
    if not TEAM_RE.match(name):
        raise DefinitionError(f"team name {name!r}: must be {TEAM_NAME.description}",
                              field=field)


def check_key_name(name: str) -> None:
    if not NAME_RE.match(name):
        raise DefinitionError(f"key name {name!r}: must be {KEY_NAME.description}",
                              field="name")


class RuntimeTeam(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    limits: Limits


class RuntimeKey(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    team: str
    sha256: str
    limits: Limits
    expires_at: float | None = None       # refused from then on
    previous_sha256: str | None = None    # the secret a rotation replaced ...
    previous_until: float | None = None   # ... accepted until then
    owner: str | None = None              # the key's id, when not key_id(sha256)

    @property
    def id(self) -> str:
        """The key's immutable id: its first secret's, kept through rotations."""
        return self.owner or key_id(self.sha256)


def effective(team: Limits, key: Limits) -> Limits:
    """The limits a key's own requests see (its team's budgets are checked separately)."""
    models = team.models if key.models is None else (
        key.models if team.models is None else sorted(set(key.models) & set(team.models)))
    rpm = key.rpm if key.rpm is not None else None
    priority = key.priority or team.priority
    return Limits(models=models, rpm=rpm, tokens_per_minute=key.tokens_per_minute,
                  tokens_per_day=key.tokens_per_day, tokens_per_month=key.tokens_per_month,
                  priority=priority)


def from_store(teams: Sequence[StoredTeam], keys: Sequence[StoredKey]
               ) -> tuple[dict[str, RuntimeTeam], list[RuntimeKey]]:
    """Decode stored rows; a row that does not decode is skipped (logged), not fatal."""
    out_teams: dict[str, RuntimeTeam] = {}
    for t in teams:
        try:
            out_teams[t.name] = RuntimeTeam(name=t.name, limits=decode_limits(t.settings))
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.error("team %r: stored limits do not decode (%s); its keys are refused",  # noqa: TRY400
                      t.name, exc)
    out_keys: list[RuntimeKey] = []
    for k in keys:
        if k.team not in out_teams:
            continue
        try:
            limits = decode_limits(k.settings)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.error("key %r: stored limits do not decode (%s); it is refused",  # noqa: TRY400
                      k.name, exc)
            continue
        out_keys.append(RuntimeKey(name=k.name, team=k.team, sha256=k.sha256, limits=limits,
                                   expires_at=k.expires_at, previous_sha256=k.previous_sha256,
                                   previous_until=k.previous_until, owner=k.owner))
    return out_teams, out_keys


# ---------------------------------------------------------------- keys and the keys file

KEY_PREFIX = "sk-llmgw-"
KEY_NAME = rule(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$(?!\n)",
                "a key name: 1 to 64 letters, digits, '_', '.', '@' or '-', starting with a "
                "letter or digit")
KeyName = Annotated[str, KEY_NAME]
NAME_RE = re.compile(KEY_NAME.pattern or "")


class KeyEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True,
               omit_defaults=True):
    """One key as stored: never the key itself."""

    name: str
    sha256: str                     # hex digest of the key
    models: list[str] = []          # empty: every model
    rpm: int | None = None          # requests per minute; None: unlimited
    priority: Priority = "interactive"
    created_at: datetime | None = None


class KeysFile(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    version: int = 1
    keys: list[KeyEntry] = []


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def key_id(sha256: str) -> str:
    """The immutable id of the key whose SHA-256 is ``sha256``: what owns its objects."""
    return "key-" + sha256[:32]


def generate_key() -> str:
    """A new key: 256 random bits, with a prefix that secret scanners can match."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


# ---------------------------------------------------------------- the file


def read_keys_file(path: str | Path) -> KeysFile:
    """The keys in ``path``; an absent file has none. ConfigError naming the file if it is bad."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        return KeysFile()
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read the keys file: {exc.strerror}",
                          field="keys_file") from None
    if not data.strip():
        return KeysFile()
    try:
        return msgspec.json.decode(data, type=KeysFile)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ConfigError(
            f"{p}: not a valid keys file ({exc}); fix or restore it, or remove it and add "
            "the keys again with `llmgw keys add`", field="keys_file",
        ) from None
