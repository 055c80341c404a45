"""What llmgw keeps in its database, and the Protocol both adapters implement.

The store holds the runtime models (the declared ones live in server.yaml),
the catalog version, and short leases used to pick one actor among several
llmgw processes (the reconciler's leader, the one process that scales an
on-demand model up). For the gateway's stateful OpenAI endpoints it also
keeps stored Responses (with an expiry), uploaded and generated files (their
bytes in chunks), batches and each batch's per-line results. Two adapters
pass the same tests: SQLite, a file and the default, and Postgres for
several API instances.

**File bytes live in the database, in chunks of at most ``CHUNK_SIZE``.**
Several gateway instances share nothing but the store, and the batch
worker runs on whichever instance holds its lease: a file uploaded to one
instance must be readable by all of them, which a directory on each host is
not (it would need a shared filesystem, a second thing to back up and keep
consistent with the rows that name it). Postgres large objects were the
other candidate and were rejected: they are not deleted with the row that
references them (orphans need ``vacuumlo``), need a transaction held open
across the whole stream, and have no SQLite counterpart, so the two adapters
would diverge. Chunk rows stream in both directions with bounded memory and
are deleted with their file in one transaction. A file is written chunk by
chunk in separate short transactions (a long one would block every other
writer of an SQLite file) under the status ``uploading``, and becomes
visible only when ``finish_file`` marks it complete; an upload that died
half-way is purged later by ``purge_uploads``.

Catalog changes are serialised across processes by ``change()``: a transaction
that holds the catalog lock (SQLite ``BEGIN IMMEDIATE``; Postgres a row lock on
the single ``catalog_version`` row) from the read of the stored models to the
commit that bumps the version. Two changes can therefore never apply catalogs
in an order that disagrees with the database.

Every other instance notices a change by polling ``catalog_version()`` — one
primary-key read — every half second. Polling rather than LISTEN/NOTIFY: it
works identically on SQLite, it cannot miss a notification across a dropped
connection (a missed NOTIFY would leave an instance serving an old catalog
until the next change), and its cost is negligible next to the one-second
visibility the system promises.

Reports are what processes publish for each other, a few times a minute:
each gateway's load (requests in flight and queued per model) and the
scaler's latest decisions, so that the one process deciding sees every
gateway's traffic and every instance's API can show why a model runs the
replicas it runs. Each is one row per (kind, key), overwritten in place;
rows nobody has refreshed for ``REPORT_RETENTION`` are deleted on the next
write of their kind.

Any failure to reach the database raises ``StoreUnavailableError`` (HTTP 503);
callers keep serving the catalog already in force.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from pathlib import Path
from typing import Any, NewType, Protocol

import msgspec

# Who owns a stored response, file or batch: the immutable id of the API key that made it
# (``tenancy.key_id``), never its name. A type of its own so that a caller handing the
# owner checks a name (``key.name``) fails the type check; ``ApiKey.owner`` makes one.
OwnerId = NewType("OwnerId", str)
# The owned tables, and the marks migration 10 and ``claim_legacy_owners`` leave in
# ``owner``: a name not yet given to a key id, and a name whose key was gone by then.
OWNED_TABLES = ("responses", "files", "batches")
LEGACY_OWNER = "name:"
REVOKED_OWNER = "revoked:"

# Reports older than this are deleted (their writer is gone).
REPORT_RETENTION = 600.0


class Report(msgspec.Struct, frozen=True, kw_only=True):
    key: str
    payload: bytes
    age: float                 # seconds since it was written (database time)


class StoredModel(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    definition: bytes          # the JSON encoding of catalog.Model
    added_by: str
    added_at: datetime         # timezone-aware UTC
    updated_by: str
    updated_at: datetime


CHUNK_SIZE = 1024 * 1024


class StoredResponse(msgspec.Struct, frozen=True, kw_only=True):
    """A Response kept for ``GET /v1/responses/{id}`` and ``previous_response_id``."""

    id: str
    owner: str                 # the API key's id (OwnerId): only it may read or delete it
    body: bytes                # the Response object, JSON
    context: bytes             # JSON array: the conversation's items through this response


class FileRecord(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    owner: str                 # the API key's id (OwnerId)
    purpose: str
    filename: str
    bytes: int
    created_at: int            # Unix seconds, the API's clock (OpenAI's ``created_at``)
    status: str = "uploading"  # "processed" once every chunk is written
    # Unix seconds after which the file is gone (OpenAI's ``expires_after``); None: kept.
    expires_at: int | None = None


class BatchRow(msgspec.Struct, frozen=True, kw_only=True):
    """A batch: the columns the store queries by, and the rest as one JSON document."""

    id: str
    owner: str                 # the API key's id (OwnerId)
    status: str
    created_at: int
    record: bytes              # the gateway's batch record, JSON


class BatchResult(msgspec.Struct, frozen=True, kw_only=True):
    """What became of one input line: one line of the output file (ok) or the error file."""

    line: int                  # 1-based line number in the input file
    ok: bool
    data: bytes


class StoredTeam(msgspec.Struct, frozen=True, kw_only=True):
    """A team created at run time; ``settings`` is its limits as JSON (``gateway.tenants``)."""

    name: str
    settings: bytes
    created_by: str
    created_at: float          # Unix seconds


class StoredKey(msgspec.Struct, frozen=True, kw_only=True):
    """A key created at run time: never the key itself, only its SHA-256."""

    name: str
    team: str
    sha256: str
    settings: bytes            # the key's narrowing of its team's limits, JSON
    created_by: str
    created_at: float
    expires_at: float | None = None       # refused from then on; None: never expires
    # After a rotation: the secret replaced, still accepted until previous_until.
    previous_sha256: str | None = None
    previous_until: float | None = None
    # The key's immutable id once it is not key_id(sha256) (a rotated key keeps its first).
    owner: str | None = None


class UsageRecord(msgspec.Struct, frozen=True, kw_only=True, array_like=True, gc=False):
    """One request in the usage ledger. No API key, no prompt: names and counts only.

    Not tracked by the garbage collector (it holds no container, so it can be in
    no cycle): a ledger buffering a store outage holds up to 100,000 of them.
    """

    id: str                    # made by the gateway; a record written twice is kept once
    at: float                  # Unix seconds when the request ended
    key: str                   # the key's name, as shown (a later key may reuse it)
    team: str
    model: str                 # the model that answered (a fallback's name if one did)
    replica: str
    gpu_class: str             # "" for a CPU or external model
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    status: int
    latency: float
    ttft: float | None
    # Whose request it was: the key's immutable id (``tenancy.key_id``); "" in records
    # written before key ids were recorded.
    key_id: str = ""


class UsageRow(msgspec.Struct, frozen=True, kw_only=True):
    """Requests and tokens of one group (a team, key or model) in one bucket."""

    bucket: int                # Unix seconds of the bucket's start (an hour or a UTC day)
    group: str
    requests: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int


class StatusCount(msgspec.Struct, frozen=True, kw_only=True):
    """Requests of one (team, key, model) answered with one status, and the latest."""

    team: str
    key: str
    model: str
    status: int
    requests: int
    last_at: float             # Unix seconds of the latest of them


class TokenTotal(msgspec.Struct, frozen=True, kw_only=True):
    team: str
    key: str
    tokens: int                # prompt + completion


class SliceAsk(msgspec.Struct, frozen=True, kw_only=True):
    """One gateway's lease on a slice of a token budget (``Store.lease_slice``).

    ``granted`` and ``settled`` are running totals of the holder's lease on
    ``scope``: tokens ever granted, and tokens of its answered requests that
    its ledger has written (so they are in the usage totals). What the lease
    holds against the budget is their difference, never a written token.
    """

    scope: str                 # the budget: "team/<team>/<field>" or "key/<team>/<key>/<field>"
    holder: str                # the gateway process
    team: str
    key: str                   # "" for a team's budget
    since: float               # start of the budget's period (Unix seconds, as usage.at)
    recent: bool               # a sliding minute: counted from raw records, not roll-ups
    limit: int
    settled: int
    floor: int                 # granted never drops below this (what the holder has used)
    want: int                  # granted wanted, room permitting
    ttl: float                 # seconds until the store gives the slice back unrenewed


class SliceGrant(msgspec.Struct, frozen=True, kw_only=True):
    granted: int               # the holder's running total granted, now
    used: int                  # the budget's period in the usage totals
    others: int                # what other live holders hold


def slice_grant(ask: SliceAsk, used: int, others: int) -> int:
    """The running total granted to ``ask``'s holder: as much as it wants while the
    written tokens, every other holder's slice and its own fit the budget, and never
    less than it has already handed out (that is spent whatever the store says)."""
    room = ask.limit - used - others
    return max(ask.floor, min(ask.want, ask.settled + room))


# A budget's tokens in the period, in both dialects ("?" placeholders): from the
# roll-ups (days since the day boundary, hours before it; see token_totals_params) for
# a day or a month, from the raw records for a sliding minute.
SLICE_USED = (
    "SELECT COALESCE(SUM(prompt_tokens + completion_tokens), 0) FROM usage_rollup"
    " WHERE dim = ? AND name = ? AND team = ? AND ((grain = 86400 AND bucket >= ?)"
    " OR (grain = 3600 AND bucket >= ? AND bucket < ?))"
)
SLICE_USED_RECENT = (
    "SELECT COALESCE(SUM(prompt_tokens + completion_tokens), 0) FROM usage"
    " WHERE team = ? AND (? = '' OR key = ?) AND at >= ?"
)
SLICE_OTHERS = (
    "SELECT COALESCE(SUM(granted - settled), 0) FROM budget_slices"
    " WHERE scope = ? AND holder <> ? AND granted > settled"
)


def slice_used_params(ask: SliceAsk) -> tuple[str, tuple[object, ...]]:
    """The query and parameters reading the tokens ``ask``'s budget has used."""
    if ask.recent:
        return SLICE_USED_RECENT, (ask.team, ask.key, ask.key, ask.since)
    dim, name, team = ("key", ask.key, ask.team) if ask.key else ("team", ask.team, "")
    return SLICE_USED, (dim, name, team, *token_totals_params(ask.since))


class RequestLog(msgspec.Struct, frozen=True, kw_only=True):
    """A request kept for a team that logs requests: its usage record as JSON, and its
    bodies only when the team logs bodies."""

    id: str                    # the usage record's id
    at: float
    expires_at: float          # Unix seconds; purged after
    team: str
    key: str
    record: bytes
    request: bytes | None = None
    response: bytes | None = None


class ReplicaTime(msgspec.Struct, frozen=True, kw_only=True):
    """Allocated replica time of one model (on one GPU class, "" for CPU) in one hour."""

    hour: int                  # Unix seconds of the hour's start
    model: str
    gpu_class: str
    gpu_seconds: float         # cards x seconds
    core_seconds: float        # reserved CPU cores x seconds (CPU models)


class StoredHolding(msgspec.Struct, frozen=True, kw_only=True):
    """A replica's hold on cards and cores, as the cost meter last saw it.

    ``gpus`` and ``cores`` are counts, fractional only for rows carried over
    from per-hour sums (an hour's card-seconds over 3600).
    """

    id: str
    model: str
    gpu_class: str
    gpus: float
    cores: float
    started: float
    ended: float | None        # None: held when last seen
    seen: float                # when the scheduler last reported it


class TeamModelTokens(msgspec.Struct, frozen=True, kw_only=True):
    hour: int
    team: str
    model: str
    tokens: int


USAGE_GROUPS = ("team", "key", "model")


def hour_of(at: float) -> int:
    """The start of the UTC hour holding ``at`` (Unix seconds)."""
    return int(at // 3600) * 3600


def usage_column(by: str) -> str:
    """The roll-up column to group by; only ever one of ``USAGE_GROUPS`` reaches SQL."""
    if by not in USAGE_GROUPS:
        raise ValueError(f"usage grouped by {by!r}: use one of {', '.join(USAGE_GROUPS)}")
    return by


# The roll-up reads, written once for both dialects ("?" placeholders; the Postgres
# adapter swaps them). Bounds are whole seconds (``rollup_bounds``): an integer column
# compared with a float parameter would not use its index on Postgres.
# By team or by model a bucket holds one row per name, nothing to add up (``team`` is
# ''); by key, a key name that moved between teams has a row for each.
USAGE_BY_HOUR = (
    "SELECT bucket, name, requests, prompt_tokens, cached_tokens, completion_tokens"
    " FROM usage_rollup WHERE grain = 3600 AND dim = ? AND bucket >= ? AND bucket < ?"
    " ORDER BY bucket, name"
)
USAGE_BY_HOUR_KEY = (
    "SELECT bucket, name, CAST(SUM(requests) AS BIGINT), CAST(SUM(prompt_tokens) AS BIGINT),"
    " CAST(SUM(cached_tokens) AS BIGINT), CAST(SUM(completion_tokens) AS BIGINT)"
    " FROM usage_rollup WHERE grain = 3600 AND dim = ? AND bucket >= ? AND bucket < ?"
    " GROUP BY bucket, name ORDER BY bucket, name"
)
# Whole days from the daily roll-up, the partial days at either end from the hourly.
USAGE_BY_DAY = (
    "SELECT b, name, CAST(SUM(requests) AS BIGINT), CAST(SUM(prompt_tokens) AS BIGINT),"
    " CAST(SUM(cached_tokens) AS BIGINT), CAST(SUM(completion_tokens) AS BIGINT) FROM ("
    " SELECT bucket AS b, name, requests, prompt_tokens, cached_tokens, completion_tokens"
    " FROM usage_rollup WHERE grain = 86400 AND dim = ? AND bucket >= ? AND bucket < ?"
    " UNION ALL"
    " SELECT (bucket / 86400) * 86400, name, requests, prompt_tokens, cached_tokens,"
    " completion_tokens FROM usage_rollup WHERE grain = 3600 AND dim = ?"
    " AND ((bucket >= ? AND bucket < ?) OR (bucket >= ? AND bucket < ?))"
    ") AS x GROUP BY b, name ORDER BY b, name"
)
# Since ``since``: its partial first day from the hourly roll-up, every day after from
# the daily one (today's row holds today so far).
KEY_USAGE_SINCE = (
    "SELECT team, name, CAST(SUM(prompt_tokens + completion_tokens) AS BIGINT)"
    " FROM usage_rollup WHERE dim = 'key' AND ((grain = 86400 AND bucket >= ?)"
    " OR (grain = 3600 AND bucket >= ? AND bucket < ?)) GROUP BY team, name"
)


# Requests by status since a moment, from the raw records (kept for the ledger's
# retention); both dialects ("?" placeholders).
STATUS_COUNTS = (
    "SELECT team, key, model, status, COUNT(*), MAX(at) FROM usage WHERE at >= ?"
    " AND status >= ? GROUP BY team, key, model, status ORDER BY team, key, model, status"
)


# Records since a moment, whatever their status.
REQUESTS_SINCE = "SELECT COUNT(*) FROM usage WHERE at >= ?"


def status_count(r: Sequence[Any]) -> StatusCount:
    return StatusCount(team=r[0], key=r[1], model=r[2], status=int(r[3]), requests=int(r[4]),
                       last_at=float(r[5]))


# Holdings, in both dialects ("?" placeholders). A reported holding is stored as
# reported; one still open that this report left out ends when it was last seen.
PUT_HOLDING = (
    "INSERT INTO holdings (id, model, gpu_class, gpus, cores, started, ended, seen)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET"
    " gpus = excluded.gpus, cores = excluded.cores, started = excluded.started,"
    " ended = excluded.ended, seen = excluded.seen"
)
CLOSE_UNSEEN = "UPDATE holdings SET ended = seen WHERE ended IS NULL AND seen < ?"
HOLDINGS_BETWEEN = (
    "SELECT id, model, gpu_class, gpus, cores, started, ended, seen FROM holdings"
    " WHERE started < ? AND (ended IS NULL OR ended > ?) ORDER BY started, id"
)


def holding_row(r: Sequence[Any]) -> StoredHolding:
    return StoredHolding(id=r[0], model=r[1], gpu_class=r[2], gpus=float(r[3]),
                         cores=float(r[4]), started=float(r[5]),
                         ended=None if r[6] is None else float(r[6]), seen=float(r[7]))


def rollup_bounds(since: float, until: float) -> tuple[int, int, int, int]:
    """[since, until) in whole seconds, and the UTC days wholly inside it as [lo, hi).

    Buckets start on whole seconds, so rounding both ends up selects the same ones.
    When no whole day fits, lo == hi == until and the hourly rows cover it all.
    """
    start, end = math.ceil(since), math.ceil(until)
    lo = _day_at_or_after(start)
    hi = end // 86400 * 86400
    if hi <= lo:
        lo = hi = max(start, end)
    return start, end, lo, hi


def usage_params(by: str, since: float, until: float, day: bool) -> tuple[str, tuple[object, ...]]:
    """The query and parameters of ``Store.usage``; ``by`` is checked here."""
    dim = usage_column(by)
    start, end, lo, hi = rollup_bounds(since, until)
    if not day:
        return USAGE_BY_HOUR_KEY if dim == "key" else USAGE_BY_HOUR, (dim, start, end)
    return USAGE_BY_DAY, (dim, lo, hi, dim, start, lo, hi, end)


def token_totals_params(since: float) -> tuple[int, int, int]:
    start = math.ceil(since)
    lo = _day_at_or_after(start)
    return lo, start, lo


def _day_at_or_after(t: int) -> int:
    """The first UTC day boundary at or after ``t``."""
    return -(-t // 86400) * 86400


class CatalogChange(Protocol):
    """The open transaction of one catalog change; all methods hold the lock."""

    async def models(self) -> list[StoredModel]: ...

    async def put_model(self, model: StoredModel) -> None: ...

    async def delete_model(self, name: str) -> bool: ...


class Store(Protocol):
    async def open(self) -> None:
        """Connect and apply schema migrations (idempotent, safe under concurrency)."""

    async def close(self) -> None: ...

    @property
    def is_open(self) -> bool:
        """Whether ``open()`` succeeded and ``close()`` has not been called.

        A server whose store was unreachable at start-up runs with it unopened
        until it can be opened; callers that may run meanwhile ask first.
        """

    @property
    def state_dir(self) -> Path:
        """Where this host keeps what belongs to this database and must outlive a process
        (the gateway's journal, ``gateway.journal``): beside a SQLite file, so it goes
        where the database goes (``<file>.d``); ``state_home`` for a database server's."""

    async def models(self) -> list[StoredModel]:
        """All runtime models, read without taking the catalog lock."""

    def change(self) -> AbstractAsyncContextManager[CatalogChange]:
        """A serialised catalog change: commits and bumps the version on clean exit,
        rolls back (nothing written) if the block raises or is cancelled.

        Keep the block to database work and the catalog build (do network
        checks before entering): while it is open, other changes wait — and on
        SQLite every other write to the file. Waiting longer than the adapter's
        ``lock_timeout`` (30 s) for the lock raises ``StoreUnavailableError``.
        """

    async def catalog_version(self) -> int:
        """Increases with every committed change; cheap enough to poll."""

    async def try_lease(self, name: str, holder: str, ttl: float) -> bool:
        """Take or renew the lease ``name`` for ``holder`` for ``ttl`` seconds.

        True when ``holder`` holds it afterwards: it was free, expired, or
        already ``holder``'s. Time is the database's, so clocks of different
        hosts do not matter.
        """

    async def release_lease(self, name: str, holder: str) -> None: ...

    async def lease_holder(self, name: str) -> str | None:
        """The current unexpired holder, if any."""

    async def mark_activity(self, model: str) -> None:
        """Record that ``model`` served a request now (database time).

        Shared by every gateway process, so an on-demand model is only scaled
        back to zero when no instance has used it for its idle timeout. Each
        call is one database write: mark a model at most about once a second
        per process, not once per request.
        """

    async def last_activity(self, model: str) -> float | None:
        """Seconds since ``model``'s last recorded activity, or None if never."""

    # --- stored Responses -------------------------------------------------------

    async def put_response(self, response: StoredResponse, ttl: float) -> None:
        """Keep ``response`` for ``ttl`` seconds of database time (replacing one of that id)."""

    async def get_response(self, id: str, owner: OwnerId) -> StoredResponse | None:
        """The unexpired response ``id`` if ``owner`` stored it, else None."""

    async def delete_response(self, id: str, owner: OwnerId) -> bool: ...

    async def purge_responses(self) -> int:
        """Delete every expired response; the number deleted."""

    # --- files --------------------------------------------------------------------

    async def create_file(self, file: FileRecord) -> None:
        """Record a file whose chunks are about to be written (status ``uploading``)."""

    async def put_file_chunk(self, file_id: str, seq: int, data: bytes) -> None:
        """Write chunk ``seq`` (0-based, at most ``CHUNK_SIZE`` bytes) of ``file_id``."""

    async def finish_file(self, file_id: str, size: int, expires_at: int | None = None) -> None:
        """Mark ``file_id`` complete (``processed``) with its size, and its expiry when given
        (a form may name it after the file); only then is it visible."""

    async def get_file(self, id: str, owner: OwnerId | None) -> FileRecord | None:
        """A complete, unexpired file of ``owner`` (any owner when None)."""

    async def list_files(self, owner: OwnerId, *, purpose: str | None, after: str | None,
                         limit: int, ascending: bool) -> list[FileRecord]:
        """``owner``'s complete, unexpired files (of ``purpose`` when given), newest first by
        (created_at, id) or oldest first when ``ascending``, starting after the file
        ``after`` (none if that is not one of ``owner``'s files)."""

    async def read_file_chunks(self, file_id: str, first: int, count: int) -> list[bytes]:
        """Chunks ``first`` .. ``first + count - 1`` in order (fewer at the end)."""

    async def delete_file(self, id: str, owner: OwnerId | None) -> bool:
        """Delete a file and its chunks in one transaction; False if there was none."""

    async def purge_uploads(self, before: int) -> int:
        """Delete files still ``uploading`` that were created before ``before`` (Unix s)."""

    async def purge_files(self) -> int:
        """Delete every file past its ``expires_at`` (database time), with its chunks."""

    # --- batches ------------------------------------------------------------------

    async def create_batch(self, batch: BatchRow) -> None: ...

    async def get_batch(self, id: str, owner: OwnerId | None) -> BatchRow | None: ...

    async def list_batches(self, owner: OwnerId, after: str | None, limit: int) -> list[BatchRow]:
        """``owner``'s batches, newest first, starting after the batch ``after``."""

    async def update_batch(self, batch: BatchRow, expect: str) -> bool:
        """Replace the batch's status and record if its status is still ``expect``.

        The compare-and-set is what keeps a cancel from being lost: the API
        moves a batch to ``cancelling`` while the worker may be about to write
        its own next state; the worker's write then fails and it reads again.
        """

    async def active_batches(self) -> list[BatchRow]:
        """Batches not yet in a final state, oldest first."""

    async def put_batch_results(self, batch_id: str, results: list[BatchResult]) -> None:
        """Record results; a line recorded already keeps its first result."""

    async def batch_results(self, batch_id: str, after: int, limit: int) -> list[BatchResult]:
        """Results with line > ``after``, in line order."""

    async def batch_result_lines(self, batch_id: str, after: int) -> list[int]:
        """Line numbers > ``after`` that have a result."""

    async def count_batch_results(self, batch_id: str) -> tuple[int, int]:
        """(lines that succeeded, lines that failed)."""

    async def delete_batch_results(self, batch_id: str) -> None: ...

    # --- reports ------------------------------------------------------------------

    async def put_report(self, kind: str, key: str, payload: bytes) -> None:
        """Write (or overwrite) the report ``kind``/``key``, stamped with database time."""

    async def reports(self, kind: str, within: float) -> list[Report]:
        """The reports of ``kind`` written less than ``within`` seconds ago, by key."""

    # --- teams and keys created at run time ----------------------------------------

    async def tenants_version(self) -> int:
        """Increases with every change to teams or keys; cheap enough to poll."""

    async def tenants(self) -> tuple[list[StoredTeam], list[StoredKey]]:
        """Every runtime team and key, by name."""

    async def put_team(self, team: StoredTeam, *, create: bool) -> bool:
        """Create (``create``: False if the name is taken) or update (False if absent) a team."""

    async def delete_team(self, name: str) -> bool:
        """Delete a team and every key of it in one transaction; False if there was none."""

    async def put_key(self, key: StoredKey) -> bool:
        """Create a key; False if its name is taken or its team does not exist."""

    async def update_key(self, key: StoredKey) -> bool:
        """Replace a key's secret hash, limits, expiry and rotation fields (its name and
        team stay); False if there is no key of that name."""

    async def delete_key(self, name: str) -> bool: ...

    async def claim_legacy_owners(self, ids: dict[str, str]) -> int:
        """Give the responses, files and batches that a key *name* owned (rows from before
        owners were key ids, marked ``name:`` by migration 10) to the id of the key of that
        name in force now (``ids``: name to id); those of names not in ``ids`` become
        ``revoked:NAME``, which no key can ever be. One transaction; after it no ``name:``
        row is left, so a later call (another instance, a restart) changes nothing and a
        name created after the first claim never owns them. The number claimed."""

    # --- the usage ledger -----------------------------------------------------------

    async def record_usage(self, records: list[UsageRecord]) -> int:
        """Insert records and add the new ones to the hourly roll-ups, in one transaction.

        A record whose id is already stored is skipped, so a batch retried
        after a lost acknowledgement counts once. Returns the records added.
        """

    async def usage(self, by: str, since: float, until: float, day: bool) -> list[UsageRow]:
        """Roll-ups grouped by ``by`` (``team``, ``key`` or ``model``) and by hour (or UTC
        day with ``day``), over the hours that start in [since, until)."""

    async def token_totals(self, since: float) -> list[TokenTotal]:
        """Tokens per (team, key) in the hours starting at or after ``since`` (roll-ups)."""

    async def recent_tokens(self, since: float) -> list[TokenTotal]:
        """Tokens per (team, key) of records at or after ``since`` (raw records)."""

    async def status_counts(self, since: float, least: int = 0) -> list[StatusCount]:
        """Requests per (team, key, model, status) of records at or after ``since`` (raw
        records), each with its latest time; only statuses ``least`` and above (a page
        that shows refusals and failures groups a tenth of the span's records, not all).
        """

    async def requests_since(self, since: float) -> int:
        """How many records there are at or after ``since`` (raw records)."""

    async def lease_slice(self, ask: SliceAsk) -> SliceGrant:
        """Take, renew, grow or shrink ``ask.holder``'s slice of a token budget, in one
        transaction that holds the budget's lock: slices other holders let expire are
        dropped (their tokens come back), then the slice is granted by ``slice_grant``
        against the period's written tokens and every live slice, and renewed for
        ``ask.ttl`` seconds of the database's clock."""

    async def release_slice(self, scope: str, holder: str) -> None:
        """Drop ``holder``'s slice of ``scope`` (it holds nothing unwritten)."""

    async def purge_usage(self, before: float) -> int:
        """Delete raw records older than ``before`` (the roll-ups stay); the number deleted."""

    async def team_model_tokens(self, since: float, until: float) -> list[TeamModelTokens]:
        """Tokens per (hour, team, model) over the hours starting in [since, until)."""

    # --- request logs ----------------------------------------------------------------

    async def put_request_logs(self, logs: list[RequestLog]) -> None:
        """Keep ``logs``; an id already kept is skipped."""

    async def request_logs(self, team: str, before: float, limit: int) -> list[RequestLog]:
        """``team``'s unexpired logs older than ``before``, newest first."""

    async def purge_request_logs(self, now: float) -> int:
        """Delete logs whose ``expires_at`` has passed; the number deleted."""

    # --- holdings, for costs ----------------------------------------------------------

    async def put_holdings(self, holdings: list[StoredHolding], seen: float) -> None:
        """Record what the scheduler reports now (``seen``), in one transaction.

        A reported holding is stored as reported, ended or not: the scheduler's
        word is the truth, so a holding closed while it went unreported opens
        again when it is reported held. One held at its last report and not
        reported now (the scheduler forgot it) ends when it was last seen.
        """

    async def holdings(self, since: float, until: float) -> list[StoredHolding]:
        """Holdings that overlap [since, until): started before ``until`` and not ended
        by ``since``."""


def state_home(url: str) -> Path:
    """This host's directory for what belongs to the database server's database ``url``
    and must outlive a process (a SQLite store keeps its own beside its file):
    ``$XDG_STATE_HOME/llmgw/<digest>`` (``~/.local/state`` when unset), the digest of the
    URL with its password masked, so a rotated password finds the same directory and two
    databases (or two schemas of one) never share one."""
    from llmgw.redact import redact_url

    base = os.environ.get("XDG_STATE_HOME", "")
    # The XDG rule: a relative path is ignored.
    root = Path(base) if os.path.isabs(base) else Path.home() / ".local" / "state"
    return root / "llmgw" / hashlib.sha256(redact_url(url).encode()).hexdigest()[:16]
