"""What llmgw keeps in its database, and the Protocol both adapters implement.

The store holds the runtime models (the declared ones live in server.yaml),
the catalog version, and short leases used to pick one actor among several
llmgw processes (the reconciler's leader, the one process that scales an
on-demand model up). Two adapters pass the same tests: SQLite, a file and the
default, and Postgres for several API instances.

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

from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Protocol

import msgspec

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


class CatalogChange(Protocol):
    """The open transaction of one catalog change; all methods hold the lock."""

    async def models(self) -> list[StoredModel]: ...

    async def put_model(self, model: StoredModel) -> None: ...

    async def delete_model(self, name: str) -> bool: ...


class Store(Protocol):
    async def open(self) -> None:
        """Connect and apply schema migrations (idempotent, safe under concurrency)."""

    async def close(self) -> None: ...

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

    async def put_report(self, kind: str, key: str, payload: bytes) -> None:
        """Write (or overwrite) the report ``kind``/``key``, stamped with database time."""

    async def reports(self, kind: str, within: float) -> list[Report]:
        """The reports of ``kind`` written less than ``within`` seconds ago, by key."""
