"""The database schema, as a numbered list of migrations both adapters apply.

Each migration carries its SQL for both dialects side by side, so a table can
never exist on one adapter and not the other: the store tests run against
both, and a migration written for only one would fail there.

Migrations are append-only. A shipped migration is never edited — a database
that already recorded number N will not run N again — so a fix is a new
number. Each adapter applies the pending ones in ``open()``, inside one
transaction that also holds a migration lock (SQLite ``BEGIN IMMEDIATE``,
Postgres ``pg_advisory_xact_lock``), so two processes starting at once apply
each migration exactly once and neither sees a half-built schema.

Time columns differ on purpose. ``models`` keeps the caller's timestamps
(who added a model and when is the application's statement, made with its
clock); SQLite stores them as ISO 8601 UTC text, which stays readable in an
``sqlite3`` shell and sorts correctly. ``leases``, ``activity`` and ``reports`` hold the
database's own clock — REAL Unix seconds on SQLite, ``timestamptz`` on
Postgres — because they are compared across hosts whose clocks may disagree.

``responses.expires_at`` is the database's clock too (it is compared with
the database's "now" by every instance). ``files.created_at`` and
``batches.created_at`` are the API's Unix seconds, because OpenAI's objects
report them and a client compares them with its own clock; so is
``files.expires_at`` (OpenAI's ``expires_at``, ``created_at`` plus the
``expires_after`` seconds), which is compared with the database's "now" like
a response's: an expiry at least an hour away does not care for the seconds
by which two clocks may differ, and every instance then agrees.

``definition`` is a blob (BLOB / bytea) rather than text: the Protocol hands
the adapters bytes, and a row that is not valid UTF-8 must still come back
out, so that startup can name and skip it instead of failing to read
the whole table.

Teams and runtime keys carry their limits as one JSON document
(``settings``), decoded and checked by ``llmgw.gateway.tenants``; the store
only keeps them. ``tenants_version`` is bumped by every change to either
table, and polled by every gateway the way ``catalog_version`` is.

The usage ledger's times (``usage.at``, ``usage_hourly.hour``) are Unix
seconds from the gateway that served the request, on both adapters: a record
states when its request was answered, and an hour bucket is a plain number
both dialects group and compare the same way. ``usage_hourly`` is written in
the same transaction as the raw rows it sums, and only for rows that were new
(a batch retried after a lost acknowledgement adds nothing twice), and so is
``usage_rollup``: the same sums by team, by key and by model, per hour and
per UTC day. Reports and budgets read those: a month's usage by team per hour
is a range of one index, with nothing left to add up, and a month's budget
reads about thirty rows per key rather than 720 per key and model.

This module does no I/O; ``pending`` is the one decision in it.
"""

from __future__ import annotations

from collections.abc import Collection

import msgspec

from llmgw.store.base import LEGACY_OWNER, OWNED_TABLES

# usage_rollup from rows shaped like usage_hourly's (``%s``: a table or a subquery), in
# both dialects. Each (hour, team, key, model) row adds to six roll-ups: by team, by key
# and by model, each per hour (``grain`` 3600) and per UTC day (86400). ``name`` is the
# team, key or model; ``team`` is the key's team for ``dim`` 'key' (budgets count a key
# within its team) and '' otherwise.
ROLL_UP_BY = (
    "INSERT INTO usage_rollup (grain, dim, bucket, name, team, requests, prompt_tokens,"
    " cached_tokens, completion_tokens)"
    " SELECT g.grain, d.dim, (u.hour / g.grain) * g.grain AS b,"
    " CASE d.dim WHEN 'team' THEN u.team WHEN 'key' THEN u.key ELSE u.model END AS n,"
    " CASE d.dim WHEN 'key' THEN u.team ELSE '' END AS t,"
    " SUM(u.requests), SUM(u.prompt_tokens), SUM(u.cached_tokens), SUM(u.completion_tokens)"
    " FROM %s AS u"
    " CROSS JOIN (SELECT 3600 AS grain UNION ALL SELECT 86400) AS g"
    " CROSS JOIN (SELECT 'team' AS dim UNION ALL SELECT 'key' UNION ALL SELECT 'model') AS d"
    # Ordered: concurrent writers take the rows' locks in one order (no deadlock).
    " WHERE true GROUP BY g.grain, d.dim, b, n, t ORDER BY 1, 2, 3, 4, 5"
    " ON CONFLICT (grain, dim, bucket, name, team) DO UPDATE SET"
    " requests = usage_rollup.requests + excluded.requests,"
    " prompt_tokens = usage_rollup.prompt_tokens + excluded.prompt_tokens,"
    " cached_tokens = usage_rollup.cached_tokens + excluded.cached_tokens,"
    " completion_tokens = usage_rollup.completion_tokens + excluded.completion_tokens"
)

# Responses, files and batches were owned by a key's name; they are owned by a key's id
# now (``Store.claim_legacy_owners``). SQL cannot know which id a name meant, since the
# keys file is not in the database, so the migration only marks each such owner as a
# name; the first gateway to start with this schema gives each to the key of that name
# in force then, and marks the rest revoked.
MARK_LEGACY_OWNERS = tuple(
    f"UPDATE {table} SET owner = '{LEGACY_OWNER}' || owner"  # noqa: S608 - constants
    for table in OWNED_TABLES)

# Replica time metered per hour becomes, per (hour, model, gpu class), one holding of
# that hour with its average cards and cores: every report adds up as before.
CARRY_REPLICA_TIME = (
    "INSERT INTO holdings (id, model, gpu_class, gpus, cores, started, ended, seen)"
    " SELECT 'metered:' || hour || ':' || model || ':' || gpu_class, model, gpu_class,"
    " gpu_seconds / 3600.0, core_seconds / 3600.0, hour, hour + 3600, hour + 3600"
    " FROM replica_time"
)


class Migration(msgspec.Struct, frozen=True, kw_only=True):
    number: int
    name: str
    sqlite: tuple[str, ...]
    postgres: tuple[str, ...]


class SchemaTooNewError(Exception):
    """The database records migrations this llmgw does not know."""


# The bookkeeping table, created before anything else (not itself a migration:
# it is what records them).
SQLITE_MIGRATIONS_TABLE = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    INTEGER PRIMARY KEY,
    name       TEXT NOT NULL,
    applied_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
)"""

POSTGRES_MIGRATIONS_TABLE = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)"""


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        number=1,
        name="runtime models, catalog version, leases, activity",
        sqlite=(
            """CREATE TABLE models (
                name       TEXT PRIMARY KEY,
                definition BLOB NOT NULL,
                added_by   TEXT NOT NULL,
                added_at   TEXT NOT NULL,
                updated_by TEXT NOT NULL,
                updated_at TEXT NOT NULL
            )""",
            """CREATE TABLE catalog_version (
                id      INTEGER PRIMARY KEY CHECK (id = 1),
                version INTEGER NOT NULL
            )""",
            "INSERT INTO catalog_version (id, version) VALUES (1, 0)",
            """CREATE TABLE leases (
                name       TEXT PRIMARY KEY,
                holder     TEXT NOT NULL,
                expires_at REAL NOT NULL
            )""",
            """CREATE TABLE activity (
                model TEXT PRIMARY KEY,
                at    REAL NOT NULL
            )""",
        ),
        postgres=(
            """CREATE TABLE models (
                name       text PRIMARY KEY,
                definition bytea NOT NULL,
                added_by   text NOT NULL,
                added_at   timestamptz NOT NULL,
                updated_by text NOT NULL,
                updated_at timestamptz NOT NULL
            )""",
            """CREATE TABLE catalog_version (
                id      smallint PRIMARY KEY CHECK (id = 1),
                version bigint NOT NULL
            )""",
            "INSERT INTO catalog_version (id, version) VALUES (1, 0)",
            """CREATE TABLE leases (
                name       text PRIMARY KEY,
                holder     text NOT NULL,
                expires_at timestamptz NOT NULL
            )""",
            """CREATE TABLE activity (
                model text PRIMARY KEY,
                at    timestamptz NOT NULL
            )""",
        ),
    ),
    Migration(
        number=2,
        name="stored responses, files in chunks, batches and their results",
        sqlite=(
            """CREATE TABLE responses (
                id         TEXT PRIMARY KEY,
                owner      TEXT NOT NULL,
                body       BLOB NOT NULL,
                context    BLOB NOT NULL,
                expires_at REAL NOT NULL
            )""",
            "CREATE INDEX responses_expiry ON responses (expires_at)",
            """CREATE TABLE files (
                id         TEXT PRIMARY KEY,
                owner      TEXT NOT NULL,
                purpose    TEXT NOT NULL,
                filename   TEXT NOT NULL,
                bytes      INTEGER NOT NULL,
                created_at INTEGER NOT NULL,
                status     TEXT NOT NULL
            )""",
            """CREATE TABLE file_chunks (
                file_id TEXT NOT NULL,
                seq     INTEGER NOT NULL,
                data    BLOB NOT NULL,
                PRIMARY KEY (file_id, seq)
            )""",
            """CREATE TABLE batches (
                id         TEXT PRIMARY KEY,
                owner      TEXT NOT NULL,
                status     TEXT NOT NULL,
                created_at INTEGER NOT NULL,
                record     BLOB NOT NULL
            )""",
            "CREATE INDEX batches_owner ON batches (owner, created_at)",
            "CREATE INDEX batches_status ON batches (status)",
            """CREATE TABLE batch_results (
                batch_id TEXT NOT NULL,
                line     INTEGER NOT NULL,
                ok       INTEGER NOT NULL,
                data     BLOB NOT NULL,
                PRIMARY KEY (batch_id, line)
            )""",
        ),
        postgres=(
            """CREATE TABLE responses (
                id         text PRIMARY KEY,
                owner      text NOT NULL,
                body       bytea NOT NULL,
                context    bytea NOT NULL,
                expires_at timestamptz NOT NULL
            )""",
            "CREATE INDEX responses_expiry ON responses (expires_at)",
            """CREATE TABLE files (
                id         text PRIMARY KEY,
                owner      text NOT NULL,
                purpose    text NOT NULL,
                filename   text NOT NULL,
                bytes      bigint NOT NULL,
                created_at bigint NOT NULL,
                status     text NOT NULL
            )""",
            """CREATE TABLE file_chunks (
                file_id text NOT NULL,
                seq     integer NOT NULL,
                data    bytea NOT NULL,
                PRIMARY KEY (file_id, seq)
            )""",
            """CREATE TABLE batches (
                id         text PRIMARY KEY,
                owner      text NOT NULL,
                status     text NOT NULL,
                created_at bigint NOT NULL,
                record     bytea NOT NULL
            )""",
            "CREATE INDEX batches_owner ON batches (owner, created_at)",
            "CREATE INDEX batches_status ON batches (status)",
            """CREATE TABLE batch_results (
                batch_id text NOT NULL,
                line     integer NOT NULL,
                ok       boolean NOT NULL,
                data     bytea NOT NULL,
                PRIMARY KEY (batch_id, line)
            )""",
        ),
    ),
    Migration(
        number=3,
        name="reports: each gateway's load and the scaler's decisions",
        sqlite=(
            """CREATE TABLE reports (
                kind    TEXT NOT NULL,
                key     TEXT NOT NULL,
                payload BLOB NOT NULL,
                at      REAL NOT NULL,
                PRIMARY KEY (kind, key)
            )""",
        ),
        postgres=(
            """CREATE TABLE reports (
                kind    text NOT NULL,
                key     text NOT NULL,
                payload bytea NOT NULL,
                at      timestamptz NOT NULL,
                PRIMARY KEY (kind, key)
            )""",
        ),
    ),
    Migration(
        number=4,
        name="teams and keys at run time, the usage ledger and its hourly roll-ups",
        sqlite=(
            """CREATE TABLE teams (
                name       TEXT PRIMARY KEY,
                settings   BLOB NOT NULL,
                created_by TEXT NOT NULL,
                created_at REAL NOT NULL
            )""",
            """CREATE TABLE api_keys (
                name       TEXT PRIMARY KEY,
                team       TEXT NOT NULL REFERENCES teams (name) ON DELETE CASCADE,
                sha256     TEXT NOT NULL UNIQUE,
                settings   BLOB NOT NULL,
                created_by TEXT NOT NULL,
                created_at REAL NOT NULL
            )""",
            "CREATE INDEX api_keys_team ON api_keys (team)",
            """CREATE TABLE tenants_version (
                id      INTEGER PRIMARY KEY CHECK (id = 1),
                version INTEGER NOT NULL
            )""",
            "INSERT INTO tenants_version (id, version) VALUES (1, 0)",
            """CREATE TABLE usage (
                id                TEXT PRIMARY KEY,
                at                REAL NOT NULL,
                key               TEXT NOT NULL,
                team              TEXT NOT NULL,
                model             TEXT NOT NULL,
                replica           TEXT NOT NULL,
                gpu_class         TEXT NOT NULL,
                prompt_tokens     INTEGER NOT NULL,
                cached_tokens     INTEGER NOT NULL,
                completion_tokens INTEGER NOT NULL,
                status            INTEGER NOT NULL,
                latency           REAL NOT NULL,
                ttft              REAL
            )""",
            "CREATE INDEX usage_at ON usage (at)",
            """CREATE TABLE usage_hourly (
                hour              INTEGER NOT NULL,
                team              TEXT NOT NULL,
                key               TEXT NOT NULL,
                model             TEXT NOT NULL,
                requests          INTEGER NOT NULL,
                prompt_tokens     INTEGER NOT NULL,
                cached_tokens     INTEGER NOT NULL,
                completion_tokens INTEGER NOT NULL,
                PRIMARY KEY (hour, team, key, model)
            )""",
        ),
        postgres=(
            """CREATE TABLE teams (
                name       text PRIMARY KEY,
                settings   bytea NOT NULL,
                created_by text NOT NULL,
                created_at double precision NOT NULL
            )""",
            """CREATE TABLE api_keys (
                name       text PRIMARY KEY,
                team       text NOT NULL REFERENCES teams (name) ON DELETE CASCADE,
                sha256     text NOT NULL UNIQUE,
                settings   bytea NOT NULL,
                created_by text NOT NULL,
                created_at double precision NOT NULL
            )""",
            "CREATE INDEX api_keys_team ON api_keys (team)",
            """CREATE TABLE tenants_version (
                id      smallint PRIMARY KEY CHECK (id = 1),
                version bigint NOT NULL
            )""",
            "INSERT INTO tenants_version (id, version) VALUES (1, 0)",
            """CREATE TABLE usage (
                id                text PRIMARY KEY,
                at                double precision NOT NULL,
                key               text NOT NULL,
                team              text NOT NULL,
                model             text NOT NULL,
                replica           text NOT NULL,
                gpu_class         text NOT NULL,
                prompt_tokens     bigint NOT NULL,
                cached_tokens     bigint NOT NULL,
                completion_tokens bigint NOT NULL,
                status            smallint NOT NULL,
                latency           double precision NOT NULL,
                ttft              double precision
            )""",
            "CREATE INDEX usage_at ON usage (at)",
            """CREATE TABLE usage_hourly (
                hour              bigint NOT NULL,
                team              text NOT NULL,
                key               text NOT NULL,
                model             text NOT NULL,
                requests          bigint NOT NULL,
                prompt_tokens     bigint NOT NULL,
                cached_tokens     bigint NOT NULL,
                completion_tokens bigint NOT NULL,
                PRIMARY KEY (hour, team, key, model)
            )""",
        ),
    ),
    Migration(
        number=5,
        name="replica time per model and hour, for costs",
        sqlite=(
            """CREATE TABLE replica_time (
                hour         INTEGER NOT NULL,
                model        TEXT NOT NULL,
                gpu_class    TEXT NOT NULL,
                gpu_seconds  REAL NOT NULL,
                core_seconds REAL NOT NULL,
                PRIMARY KEY (hour, model, gpu_class)
            )""",
        ),
        postgres=(
            """CREATE TABLE replica_time (
                hour         bigint NOT NULL,
                model        text NOT NULL,
                gpu_class    text NOT NULL,
                gpu_seconds  double precision NOT NULL,
                core_seconds double precision NOT NULL,
                PRIMARY KEY (hour, model, gpu_class)
            )""",
        ),
    ),
    Migration(
        number=6,
        name="request logs, kept for teams that ask for them",
        sqlite=(
            """CREATE TABLE request_logs (
                id         TEXT PRIMARY KEY,
                at         REAL NOT NULL,
                expires_at REAL NOT NULL,
                team       TEXT NOT NULL,
                key        TEXT NOT NULL,
                record     BLOB NOT NULL,
                request    BLOB,
                response   BLOB
            )""",
            "CREATE INDEX request_logs_team ON request_logs (team, at)",
            "CREATE INDEX request_logs_expiry ON request_logs (expires_at)",
        ),
        postgres=(
            """CREATE TABLE request_logs (
                id         text PRIMARY KEY,
                at         double precision NOT NULL,
                expires_at double precision NOT NULL,
                team       text NOT NULL,
                key        text NOT NULL,
                record     bytea NOT NULL,
                request    bytea,
                response   bytea
            )""",
            "CREATE INDEX request_logs_team ON request_logs (team, at)",
            "CREATE INDEX request_logs_expiry ON request_logs (expires_at)",
        ),
    ),
    Migration(
        number=7,
        name="usage rolled up by team, key and model, per hour and per day",
        sqlite=(
            """CREATE TABLE usage_rollup (
                grain             INTEGER NOT NULL,
                dim               TEXT NOT NULL,
                bucket            INTEGER NOT NULL,
                name              TEXT NOT NULL,
                team              TEXT NOT NULL,
                requests          INTEGER NOT NULL,
                prompt_tokens     INTEGER NOT NULL,
                cached_tokens     INTEGER NOT NULL,
                completion_tokens INTEGER NOT NULL,
                PRIMARY KEY (grain, dim, bucket, name, team)
            )""",
            ROLL_UP_BY % "usage_hourly",
        ),
        postgres=(
            """CREATE TABLE usage_rollup (
                grain             integer NOT NULL,
                dim               text NOT NULL,
                bucket            bigint NOT NULL,
                name              text NOT NULL,
                team              text NOT NULL,
                requests          bigint NOT NULL,
                prompt_tokens     bigint NOT NULL,
                cached_tokens     bigint NOT NULL,
                completion_tokens bigint NOT NULL,
                PRIMARY KEY (grain, dim, bucket, name, team)
            )""",
            ROLL_UP_BY % "usage_hourly",
        ),
    ),
    Migration(
        number=8,
        name="costs from the scheduler's holdings rather than sampled replica time",
        sqlite=(
            """CREATE TABLE holdings (
                id        TEXT PRIMARY KEY,
                model     TEXT NOT NULL,
                gpu_class TEXT NOT NULL,
                gpus      REAL NOT NULL,
                cores     REAL NOT NULL,
                started   REAL NOT NULL,
                ended     REAL,
                seen      REAL NOT NULL
            )""",
            "CREATE INDEX holdings_started ON holdings (started)",
            CARRY_REPLICA_TIME,
            "DROP TABLE replica_time",
        ),
        postgres=(
            """CREATE TABLE holdings (
                id        text PRIMARY KEY,
                model     text NOT NULL,
                gpu_class text NOT NULL,
                gpus      double precision NOT NULL,
                cores     double precision NOT NULL,
                started   double precision NOT NULL,
                ended     double precision,
                seen      double precision NOT NULL
            )""",
            "CREATE INDEX holdings_started ON holdings (started)",
            CARRY_REPLICA_TIME,
            "DROP TABLE replica_time",
        ),
    ),
    Migration(
        number=9,
        name="files that expire (expires_after, a batch's output_expires_after)",
        sqlite=(
            "ALTER TABLE files ADD COLUMN expires_at INTEGER",
            "CREATE INDEX files_owner ON files (owner, created_at)",
            "CREATE INDEX files_expiry ON files (expires_at) WHERE expires_at IS NOT NULL",
        ),
        postgres=(
            "ALTER TABLE files ADD COLUMN expires_at bigint",
            "CREATE INDEX files_owner ON files (owner, created_at)",
            "CREATE INDEX files_expiry ON files (expires_at) WHERE expires_at IS NOT NULL",
        ),
    ),
    Migration(
        number=10,
        name="owned objects belong to key ids, and usage records name theirs",
        sqlite=(*MARK_LEGACY_OWNERS,
                "ALTER TABLE usage ADD COLUMN key_id TEXT NOT NULL DEFAULT ''"),
        postgres=(*MARK_LEGACY_OWNERS,
                  "ALTER TABLE usage ADD COLUMN key_id text NOT NULL DEFAULT ''"),
    ),
    Migration(
        number=11,
        name="keys that expire, and rotation: a new secret with the old one kept a while",
        # owner: the key's id when it is not key_id(sha256) any more (a rotated key keeps
        # the id its first secret gave it); NULL for a key never rotated.
        sqlite=(
            "ALTER TABLE api_keys ADD COLUMN expires_at REAL",
            "ALTER TABLE api_keys ADD COLUMN previous_sha256 TEXT",
            "ALTER TABLE api_keys ADD COLUMN previous_until REAL",
            "ALTER TABLE api_keys ADD COLUMN owner TEXT",
        ),
        postgres=(
            "ALTER TABLE api_keys ADD COLUMN expires_at double precision",
            "ALTER TABLE api_keys ADD COLUMN previous_sha256 text",
            "ALTER TABLE api_keys ADD COLUMN previous_until double precision",
            "ALTER TABLE api_keys ADD COLUMN owner text",
        ),
    ),
    Migration(
        number=12,
        name="slices of token budgets leased by gateway instances",
        sqlite=(
            """CREATE TABLE budget_slices (
                scope      TEXT NOT NULL,
                holder     TEXT NOT NULL,
                granted    INTEGER NOT NULL,
                settled    INTEGER NOT NULL,
                expires_at REAL NOT NULL,
                PRIMARY KEY (scope, holder)
            )""",
        ),
        postgres=(
            """CREATE TABLE budget_slices (
                scope      text NOT NULL,
                holder     text NOT NULL,
                granted    bigint NOT NULL,
                settled    bigint NOT NULL,
                expires_at timestamptz NOT NULL,
                PRIMARY KEY (scope, holder)
            )""",
        ),
    ),
)

LATEST = MIGRATIONS[-1].number


def pending(applied: Collection[int]) -> list[Migration]:
    """The migrations still to apply, in order, given the numbers already recorded.

    Raises ``SchemaTooNewError`` when the database holds a number this code
    does not know: it was migrated by a newer llmgw, and writing to it with
    the older code could undo what the newer one relies on.
    """
    unknown = sorted(set(applied) - {m.number for m in MIGRATIONS})
    if unknown:
        raise SchemaTooNewError(
            f"the database schema has migration(s) {unknown} that this llmgw does not know "
            f"(it knows 1 to {LATEST}); run the llmgw version that migrated it, or a newer one"
        )
    done = set(applied)
    return [m for m in MIGRATIONS if m.number not in done]


def _check_numbering() -> None:
    # A repeat would make "applied" ambiguous, and an order other than the numbers'
    # would apply them differently on two databases; fail at import rather than on
    # some operator's database. A number may be missing: ``pending`` applies what a
    # database lacks by number, so one held back for another change comes in later.
    numbers = [m.number for m in MIGRATIONS]
    if numbers != sorted(set(numbers)) or numbers[0] != 1:
        raise AssertionError(f"MIGRATIONS must be numbered from 1, increasing, got {numbers}")


_check_numbering()
