"""Teams, runtime keys and the usage ledger, run unchanged against SQLite and Postgres."""

from __future__ import annotations

import asyncio

import msgspec

from llmgw.store.base import StoredKey, StoredTeam, UsageRecord
from llmgw.store.schema import MIGRATIONS

from .conftest import AnyStore, Database, StoreFactory

HOUR = 1_773_500_400          # a UTC hour boundary (divisible by 3600)
DAY = HOUR - HOUR % 86400


def team(name: str, settings: bytes = b"{}") -> StoredTeam:
    return StoredTeam(name=name, settings=settings, created_by="alice", created_at=1.5)


def key(name: str, team_name: str, sha: str | None = None) -> StoredKey:
    return StoredKey(name=name, team=team_name, sha256=sha or f"{name:0>64}"[-64:],
                     settings=b"{}", created_by="alice", created_at=2.5)


def record(id_: str, at: float, *, team_name: str = "ml", key_name: str = "k1",
           model: str = "m", prompt: int = 10, cached: int = 2,
           completion: int = 5) -> UsageRecord:
    return UsageRecord(id=id_, at=at, key=key_name, team=team_name, model=model,
                       replica="http://10.0.0.5:8000", gpu_class="l40s", prompt_tokens=prompt,
                       cached_tokens=cached, completion_tokens=completion, status=200,
                       latency=0.25, ttft=0.05)


async def test_team_and_key_changes_bump_the_version_seen_by_another_instance(
        store: AnyStore, make_store: StoreFactory) -> None:
    other = await make_store()
    v0 = await other.tenants_version()
    assert await store.put_team(team("ml"), create=True)
    assert await other.tenants_version() > v0
    assert not await store.put_team(team("ml"), create=True)       # name taken
    assert await store.put_key(key("k1", "ml"))
    assert not await store.put_key(key("k1", "ml", "f" * 64))       # name taken
    assert not await store.put_key(key("k2", "nobody"))             # no such team
    teams, keys = await other.tenants()
    assert [t.name for t in teams] == ["ml"]
    assert keys == [key("k1", "ml")]
    v1 = await other.tenants_version()
    assert await store.put_team(team("ml", b'{"tokens_per_day": 5}'), create=False)
    assert not await store.put_team(team("absent"), create=False)
    teams, _ = await other.tenants()
    assert teams[0].settings == b'{"tokens_per_day": 5}'
    assert await other.tenants_version() > v1


async def test_deleting_a_team_deletes_its_keys(store: AnyStore) -> None:
    await store.put_team(team("ml"), create=True)
    await store.put_team(team("web"), create=True)
    await store.put_key(key("k1", "ml"))
    await store.put_key(key("k2", "web"))
    assert await store.delete_team("ml")
    assert not await store.delete_team("ml")
    teams, keys = await store.tenants()
    assert [t.name for t in teams] == ["web"]
    assert [k.name for k in keys] == ["k2"]
    assert await store.delete_key("k2")
    assert not await store.delete_key("k2")


async def test_usage_records_roll_up_per_hour_and_count_once_when_retried(
        store: AnyStore, database: Database) -> None:
    batch = [record("a", HOUR + 10), record("b", HOUR + 20, team_name="web", key_name="k2"),
             record("c", HOUR + 3600 + 5, model="n", prompt=100)]
    assert await store.record_usage(batch) == 3
    # The same batch again (its acknowledgement was lost), with one new record.
    assert await store.record_usage([*batch, record("d", HOUR + 30)]) == 1
    rows = await store.usage("team", HOUR, HOUR + 7200, day=False)
    assert [(r.bucket, r.group, r.requests, r.prompt_tokens, r.cached_tokens,
             r.completion_tokens) for r in rows] == [
        (HOUR, "ml", 2, 20, 4, 10), (HOUR, "web", 1, 10, 2, 5),
        (HOUR + 3600, "ml", 1, 100, 2, 5)]
    by_model = await store.usage("model", DAY, DAY + 86400, day=True)
    assert [(r.bucket, r.group, r.requests) for r in by_model] == [(DAY, "m", 3), (DAY, "n", 1)]
    # until is exclusive, since inclusive, by the hour's start
    assert [r.group for r in await store.usage("key", HOUR + 3600, HOUR + 7200, day=False)] \
        == ["k1"]
    raw = await database.fetch("SELECT count(*) FROM usage")
    assert raw[0][0] == 4


async def test_a_large_batch_partly_stored_adds_each_new_record_once(
        store: AnyStore, database: Database) -> None:
    # More rows than one statement carries, of odd sizes, over two hours, two teams and
    # more keys than one statement's worth of roll-up groups.
    batch = [record(f"r{i}", HOUR + i * 3, team_name=("ml", "web")[i % 2],
                    key_name=f"k{i % 700}", prompt=i % 7) for i in range(1337)]
    assert await store.record_usage(batch[:700]) == 700
    assert await store.record_usage(batch[350:]) == 637
    assert await store.record_usage(batch) == 0
    for by in ("team", "key"):
        rows = await store.usage(by, HOUR, HOUR + 7200, day=False)
        assert [(r.bucket, r.group, r.requests, r.prompt_tokens) for r in rows] == \
            _brute_force(batch, by, HOUR, HOUR + 7200, 3600)
    raw = await database.fetch("SELECT count(*), sum(prompt_tokens) FROM usage")
    assert tuple(raw[0]) == (1337, sum(r.prompt_tokens for r in batch))


async def test_token_totals_from_roll_ups_and_recent_records(store: AnyStore) -> None:
    await store.record_usage([record("a", HOUR + 10), record("b", HOUR + 3700),
                              record("c", HOUR + 3800, key_name="k2")])
    totals = {(t.team, t.key): t.tokens for t in await store.token_totals(HOUR + 3600)}
    assert totals == {("ml", "k1"): 15, ("ml", "k2"): 15}
    recent = {(t.team, t.key): t.tokens for t in await store.recent_tokens(HOUR + 3750)}
    assert recent == {("ml", "k2"): 15}


async def test_requests_by_status_with_the_latest_of_each(store: AnyStore) -> None:
    """Raw records since a moment, counted per team, key, model and status."""
    await store.record_usage([
        msgspec.structs.replace(record("a", HOUR + 10), status=502),
        msgspec.structs.replace(record("b", HOUR + 20), status=502),
        msgspec.structs.replace(record("c", HOUR + 30, key_name="k2"), status=429),
        record("d", HOUR + 40), record("e", HOUR - 10)])
    counts = [(c.key, c.status, c.requests, c.last_at)
              for c in await store.status_counts(HOUR)]
    assert counts == [("k1", 200, 1, HOUR + 40), ("k1", 502, 2, HOUR + 20),
                      ("k2", 429, 1, HOUR + 30)]
    refused = [(c.key, c.status, c.requests, c.last_at)
               for c in await store.status_counts(HOUR, 403)]
    assert refused == [("k1", 502, 2, HOUR + 20), ("k2", 429, 1, HOUR + 30)]
    assert await store.requests_since(HOUR) == 4


def _brute_force(batch: list[UsageRecord], by: str, since: float, until: float,
                 bucket: int) -> list[tuple[int, str, int, int]]:
    """What a usage query must answer, added up from the records themselves."""
    sums: dict[tuple[int, str], list[int]] = {}
    for r in batch:
        hour = int(r.at // 3600) * 3600
        if since <= hour < until:
            group = {"team": r.team, "key": r.key, "model": r.model}[by]
            s = sums.setdefault((hour // bucket * bucket, group), [0, 0])
            s[0] += 1
            s[1] += r.prompt_tokens
    return [(b, g, n, p) for (b, g), (n, p) in sorted(sums.items())]


async def test_usage_by_day_and_by_hour_agree_with_the_records_on_any_window(
        store: AnyStore) -> None:
    # Four days of traffic, a record every 50 minutes, over two teams, keys and models.
    batch = [record(f"r{i}", DAY - 86400 + i * 3000 + 7, team_name=("ml", "web")[i % 2],
                    key_name=("k1", "k2", "k3")[i % 3], model=("m", "n")[i // 7 % 2],
                    prompt=i + 1) for i in range(4 * 86400 // 3000)]
    assert await store.record_usage(batch) == len(batch)
    windows = [(DAY - 86400, DAY + 3 * 86400),                  # whole days
               (DAY - 86400 + 5 * 3600, DAY + 2 * 86400 + 7 * 3600),  # partial at both ends
               (DAY + 3600, DAY + 5 * 3600),                    # inside one day
               (DAY + 3600 + 0.5, DAY + 3 * 3600 - 0.5)]        # not on hour boundaries
    for since, until in windows:
        for by in ("team", "key", "model"):
            for day in (False, True):
                rows = await store.usage(by, since, until, day=day)
                got = [(r.bucket, r.group, r.requests, r.prompt_tokens) for r in rows]
                assert got == _brute_force(batch, by, since, until, 86400 if day else 3600), \
                    (since, until, by, day)


async def test_token_totals_since_a_time_inside_a_day(store: AnyStore) -> None:
    batch = [record("a", DAY - 3600 + 5), record("b", DAY + 7200 + 5),
             record("c", DAY + 86400 + 5, key_name="k2"), record("d", DAY + 2 * 86400 + 5)]
    await store.record_usage(batch)
    for since, expected in ((DAY - 7200, {("ml", "k1"): 45, ("ml", "k2"): 15}),
                            (DAY + 3600, {("ml", "k1"): 30, ("ml", "k2"): 15}),
                            (DAY + 86400, {("ml", "k1"): 15, ("ml", "k2"): 15}),
                            (DAY + 7200 + 1, {("ml", "k1"): 15, ("ml", "k2"): 15})):
        totals = {(t.team, t.key): t.tokens for t in await store.token_totals(since)}
        assert totals == expected, since


async def test_the_roll_up_migration_fills_from_the_hourly_roll_ups(
        store: AnyStore, database: Database) -> None:
    batch = [record("a", HOUR + 10), record("b", HOUR + 20, team_name="web", key_name="k2"),
             record("c", HOUR + 86400, model="n", prompt=100)]
    await store.record_usage(batch)
    before = [await store.usage(by, DAY, DAY + 2 * 86400, day=day)
              for by in ("team", "key", "model") for day in (False, True)]
    # An older database had only the hourly roll-ups: the migration derives the rest.
    await database.execute("DELETE FROM usage_rollup")
    [migration] = [m for m in MIGRATIONS if m.number == 7]
    statements = migration.sqlite if database.kind == "sqlite" else migration.postgres
    await database.execute(statements[-1])
    after = [await store.usage(by, DAY, DAY + 2 * 86400, day=day)
             for by in ("team", "key", "model") for day in (False, True)]
    assert after == before
    assert sum(r.requests for r in after[0]) == 3


async def test_holdings_are_stored_as_reported_and_closed_when_forgotten(
        store: AnyStore) -> None:
    from llmgw.store.base import StoredHolding

    def held(id_: str, started: float, ended: float | None = None) -> StoredHolding:
        return StoredHolding(id=id_, model="big", gpu_class="h100", gpus=2, cores=16,
                             started=started, ended=ended, seen=0)

    await store.put_holdings([held("a", HOUR), held("b", HOUR + 60)], HOUR + 100)
    await store.put_holdings([held("a", HOUR, HOUR + 150)], HOUR + 200)   # b forgotten
    got = {h.id: (h.ended, h.seen) for h in await store.holdings(0, HOUR + 7200)}
    assert got == {"a": (HOUR + 150, HOUR + 200), "b": (HOUR + 100, HOUR + 100)}
    await store.put_holdings([held("b", HOUR + 60)], HOUR + 300)          # b reported again
    got = {h.id: (h.ended, h.seen) for h in await store.holdings(0, HOUR + 7200)}
    assert got == {"a": (HOUR + 150, HOUR + 200), "b": (None, HOUR + 300)}
    # Overlap with [since, until): a ended at HOUR + 150 is out of [HOUR + 150, …).
    assert [h.id for h in await store.holdings(HOUR + 150, HOUR + 7200)] == ["b"]
    assert [h.id for h in await store.holdings(0, HOUR + 60)] == ["a"]
    await store.put_holdings([], HOUR + 400)
    assert [h.ended for h in await store.holdings(0, HOUR + 7200)] == [HOUR + 150, HOUR + 300]


async def test_metered_replica_time_is_carried_into_holdings(
        store: AnyStore, database: Database) -> None:
    """An older database metered replica time per hour; migration 8 keeps every hour's
    card- and core-seconds as a holding of that hour."""
    from llmgw.control.costs import held_time
    from llmgw.store.schema import CARRY_REPLICA_TIME

    await database.execute("CREATE TABLE replica_time (hour BIGINT NOT NULL, model TEXT NOT NULL,"
                           " gpu_class TEXT NOT NULL, gpu_seconds DOUBLE PRECISION NOT NULL,"
                           " core_seconds DOUBLE PRECISION NOT NULL)")
    await database.execute(f"INSERT INTO replica_time VALUES ({HOUR}, 'big', 'h100', 5400, 0),"
                           f" ({HOUR + 3600}, 'small', '', 0, 1800)")
    await database.execute(CARRY_REPLICA_TIME)
    await database.execute("DROP TABLE replica_time")
    times = held_time(await store.holdings(HOUR, HOUR + 7200), HOUR, HOUR + 7200, HOUR + 9000)
    assert [(t.hour, t.model, t.gpu_class, t.gpu_seconds, t.core_seconds) for t in times] == [
        (HOUR, "big", "h100", 5400.0, 0.0), (HOUR + 3600, "small", "", 0.0, 1800.0)]


async def test_purging_raw_records_keeps_the_roll_ups(store: AnyStore) -> None:
    await store.record_usage([record("a", HOUR + 10), record("b", HOUR + 5000)])
    assert await store.purge_usage(HOUR + 4000) == 1
    assert [t.tokens for t in await store.recent_tokens(0)] == [15]
    rows = await store.usage("team", HOUR, HOUR + 7200, day=False)
    assert sum(r.requests for r in rows) == 2


async def test_concurrent_batches_from_two_instances_add_up(
        store: AnyStore, make_store: StoreFactory) -> None:
    other = await make_store()
    first = [record(f"x{i}", HOUR + i) for i in range(200)]
    second = [record(f"y{i}", HOUR + i) for i in range(200)]
    added = await asyncio.gather(store.record_usage(first), other.record_usage(second),
                                 store.record_usage(first[:50]))
    assert sum(added) == 400
    [row] = await store.usage("team", HOUR, HOUR + 3600, day=False)
    assert row.requests == 400
    assert row.prompt_tokens == 4000


async def test_request_logs_are_kept_read_newest_first_and_purged(store: AnyStore) -> None:
    import time

    from llmgw.store.base import RequestLog

    now = time.time()
    logs = [RequestLog(id=f"l{i}", at=now - 10 + i, expires_at=now + 100 * (i + 1), team="ml",
                       key="k", record=b'{"n": %d}' % i,
                       request=b"prompt" if i == 1 else None, response=None)
            for i in range(3)]
    await store.put_request_logs(logs)
    await store.put_request_logs(logs[:1])          # a retry keeps one
    got = await store.request_logs("ml", now + 1, 10)
    assert [g.id for g in got] == ["l2", "l1", "l0"]
    assert got[1].request == b"prompt"
    assert got[1].record == b'{"n": 1}'
    assert [g.id for g in await store.request_logs("ml", now - 9.5, 10)] == ["l0"]
    assert await store.request_logs("web", now + 1, 10) == []
    assert await store.purge_request_logs(now + 150) == 1
    assert [g.id for g in await store.request_logs("ml", now + 1, 10)] == ["l2", "l1"]


async def test_update_key_replaces_secret_expiry_and_rotation_fields(
        store: AnyStore, make_store: StoreFactory) -> None:
    """A rotation's fields (new hash, old hash and its grace, the kept id) and an expiry
    round-trip through the store, bump the version, and a missing key is reported."""
    other = await make_store()
    await store.put_team(team("ml"), create=True)
    await store.put_key(key("k1", "ml"))
    v0 = await other.tenants_version()
    rotated = StoredKey(name="k1", team="ml", sha256="e" * 64, settings=b'{"rpm": 5}',
                        created_by="alice", created_at=2.5, expires_at=1_900_000_000.5,
                        previous_sha256=key("k1", "ml").sha256, previous_until=1_800_000_000.0,
                        owner="key-" + "1" * 32)
    assert await store.update_key(rotated)
    assert await other.tenants_version() > v0
    _, keys = await other.tenants()
    assert keys == [rotated]
    assert not await store.update_key(key("absent", "ml"))
