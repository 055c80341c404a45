"""The usage ledger: a record per request, written in batches, nothing twice, bounded."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import msgspec
import pytest

from llmgw.catalog.model import GpuClass
from llmgw.catalog.units import Size
from llmgw.errors import StoreUnavailableError
from llmgw.gateway.keys import add_key, hash_key
from llmgw.gateway.ledger import Ledger
from llmgw.gateway.proxy import UsageChunkFilter
from llmgw.gateway.request import with_usage
from llmgw.redact import replica_id
from llmgw.store.base import UsageRecord
from llmgw.store.sqlite import SqliteStore
from llmgw.tenancy import key_id
from tests.gateway.conftest import GatewayFactory, chat_model, wait_for
from tests.gateway.doubles import FakeBackend
from tests.gateway.engine import FakeEngine

PROMPT = "a secret prompt about kittens"


def rec(id_: str, team: str = "ml", tokens: int = 10) -> UsageRecord:
    return UsageRecord(id=id_, at=time.time(), key="k", team=team, model="m", replica="r",
                       gpu_class="", prompt_tokens=tokens, cached_tokens=0,
                       completion_tokens=0, status=200, latency=0.1, ttft=None)


async def rows(store: SqliteStore) -> list[tuple[object, ...]]:
    def run() -> list[tuple[object, ...]]:
        import sqlite3
        db = sqlite3.connect(store.path)
        try:
            return db.execute("SELECT * FROM usage ORDER BY at").fetchall()
        finally:
            db.close()

    return await asyncio.to_thread(run)


async def test_each_request_is_recorded_without_its_key_or_prompt(
        make_gateway: GatewayFactory, engines: Callable[..., Awaitable[FakeEngine]],
        tmp_path: Path) -> None:
    engine = await engines()
    keys_file = tmp_path / "keys.json"
    key = add_key(keys_file, "alice")
    gw = await make_gateway([chat_model("m", upstream=[engine.url])], keys_file=keys_file,
                            ledger_interval="50ms")
    body = {"model": "m", "messages": [{"role": "user", "content": PROMPT}]}
    r = await gw.client.post("/v1/chat/completions", json=body,
                             headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200
    assert (await gw.chat("absent", key=key)).status_code == 404   # no model: no record
    found: list[tuple[object, ...]] = []

    async def written() -> bool:
        found[:] = await rows(gw.store)
        return bool(found)

    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while not await written():
        assert loop.time() < deadline, "no usage record was written"
        await asyncio.sleep(0.02)
    [row] = found
    (_, at, key_name, team, model, replica, _, prompt, cached, completion, status,
     latency, ttft, owner) = row
    assert (key_name, team, model, replica, prompt, cached, completion, status) == (
        "alice", "-", "m", replica_id(engine.url), 5, 0, 3, 200)
    assert owner == key_id(hash_key(key))
    assert isinstance(latency, float)
    assert ttft is None
    assert abs(float(at) - time.time()) < 600   # type: ignore[arg-type]
    text = json.dumps(row)
    assert key not in text
    assert "kittens" not in text
    metrics = (await gw.client.get("/metrics")).text
    assert 'llmgw_gateway_team_tokens_total{kind="completion",model="m",team="-"} 3.0' in metrics


async def test_the_record_names_the_gpu_class_of_the_profile_that_answered(
        make_gateway: GatewayFactory, engines: Callable[..., Awaitable[FakeEngine]],
        tmp_path: Path) -> None:
    """A model with a fallback profile: the record holds the class of the profile the
    answering replica runs, as the scheduler reports it, not the first one listed."""
    engine = await engines()
    keys_file = tmp_path / "keys.json"
    key = add_key(keys_file, "alice")
    backend = FakeBackend()
    model = chat_model("m", profiles=[
        {"name": "big", "gpu_class": "h100", "gpus": 1, "memory": "1GiB"},
        {"name": "small", "gpu_class": "l4", "gpus": 1, "memory": "1GiB"}])
    classes = {name: GpuClass(device=name, memory=Size.parse("16GiB")) for name in ("h100", "l4")}
    gw = await make_gateway([model], backend=backend, keys_file=keys_file, gpu_classes=classes,
                            ledger_interval="50ms")
    backend.profiles[engine.url] = "small"
    backend.set_endpoints("m", [engine.url])
    r = await gw.client.post("/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                             json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 200, r.text
    await gw.gateway.ledger.flush()            # type: ignore[union-attr]
    [row] = await rows(gw.store)
    assert (row[5], row[6]) == (replica_id(engine.url), "l4")


async def test_a_stream_is_counted_and_the_client_gets_no_usage_it_did_not_ask_for(
        make_gateway: GatewayFactory, engines: Callable[..., Awaitable[FakeEngine]]) -> None:
    engine = await engines()
    gw = await make_gateway([chat_model("m", upstream=[engine.url])])
    r = await gw.chat("m", stream=True)
    assert r.status_code == 200
    assert '"usage"' not in r.text
    assert r.text.rstrip().endswith("data: [DONE]")
    events = [e for e in r.text.split("\n\n") if e.strip()]
    assert len(events) == engine.chunks + 1
    asked = await gw.chat("m", stream=True, stream_options={"include_usage": True})
    assert '"usage"' in asked.text
    await gw.gateway.ledger.flush()   # type: ignore[union-attr]
    found = await rows(gw.store)
    assert [(row[7], row[9]) for row in found] == [(7, engine.chunks)] * 2
    assert all(row[12] is not None for row in found)     # time to first token


async def test_without_the_ledger_streams_pass_unchanged(
        make_gateway: GatewayFactory, engines: Callable[..., Awaitable[FakeEngine]]) -> None:
    engine = await engines()
    gw = await make_gateway([chat_model("m", upstream=[engine.url])], ledger=False)
    assert gw.gateway.ledger is None
    assert (await gw.chat("m", stream=True)).status_code == 200
    assert engine.requests[-1].get("stream_options") is None


def test_asking_for_usage_keeps_the_clients_other_options() -> None:
    body = b'{"model":"m","stream":true,"stream_options":{"continuous_usage_stats":true}}'
    out = with_usage(body, msgspec.Raw(b'{"continuous_usage_stats":true}'))
    assert out is not None
    assert json.loads(out)["stream_options"] == {"continuous_usage_stats": True,
                                                 "include_usage": True}
    assert with_usage(body, msgspec.Raw(b'{"include_usage": true}')) is None


def test_the_usage_chunk_is_dropped_across_chunk_boundaries() -> None:
    stream = (b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
              b'data: {"choices":[],"usage":{"prompt_tokens":1}}\n\n'
              b"data: [DONE]\n\n")
    for cut in range(1, len(stream)):
        f = UsageChunkFilter()
        out = f.feed(stream[:cut]) + f.feed(stream[cut:]) + f.tail
        assert out == (b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
                       b"data: [DONE]\n\n"), cut


class _FlakyStore:
    """A store that is down, or writes and then loses its acknowledgement."""

    def __init__(self, inner: SqliteStore) -> None:
        self.inner = inner
        self.down = False
        self.lose_ack = False
        self.is_open = True

    async def record_usage(self, records: list[UsageRecord]) -> int:
        if self.down:
            raise StoreUnavailableError("down")
        added = await self.inner.record_usage(records)
        if self.lose_ack:
            self.lose_ack = False
            raise StoreUnavailableError("the connection dropped before the commit was seen")
        return added

    async def purge_usage(self, before: float) -> int:
        return await self.inner.purge_usage(before)

    async def purge_request_logs(self, now: float) -> int:
        return await self.inner.purge_request_logs(now)


@pytest.fixture
async def sqlite_store(tmp_path: Path) -> SqliteStore:
    store = SqliteStore(f"sqlite:///{tmp_path / 'l.db'}")
    await store.open()
    yield store  # type: ignore[misc]
    await store.close()


async def test_a_retried_batch_is_written_once(sqlite_store: SqliteStore) -> None:
    flaky = _FlakyStore(sqlite_store)
    ledger = Ledger(flaky, interval=1, capacity=100, retention=86400)  # type: ignore[arg-type]
    for i in range(3):
        ledger.record(rec(f"r{i}"))
    assert ledger.pending_teams == {"ml": 30}
    flaky.lose_ack = True
    await ledger.tick()
    assert len(ledger) == 3          # kept: the write was not acknowledged
    await ledger.tick()
    assert len(ledger) == 0
    assert ledger.pending_teams == {}
    assert len(await rows(sqlite_store)) == 3
    [row] = await sqlite_store.usage("team", 0, 2**40, day=False)
    assert row.requests == 3


async def test_the_buffer_is_bounded_while_the_store_is_down_then_written(
        sqlite_store: SqliteStore) -> None:
    flaky = _FlakyStore(sqlite_store)
    dropped: list[int] = []
    ledger = Ledger(flaky, interval=1, capacity=5, retention=86400,  # type: ignore[arg-type]
                    on_drop=dropped.append)
    flaky.down = True
    for i in range(8):
        ledger.record(rec(f"r{i}"))
        await ledger.tick()
    assert len(ledger) == 5
    assert ledger.dropped == 3
    assert sum(dropped) == 3
    assert ledger.pending_teams == {"ml": 50}
    flaky.down = False
    await ledger.close()          # shutdown writes what is left
    assert [r[0] for r in await rows(sqlite_store)] == [f"r{i}" for i in range(3, 8)]


async def test_closing_the_gateway_flushes_the_ledger(
        make_gateway: GatewayFactory, engines: Callable[..., Awaitable[FakeEngine]]) -> None:
    engine = await engines()
    gw = await make_gateway([chat_model("m", upstream=[engine.url])], ledger_interval="1h")
    assert (await gw.chat("m")).status_code == 200
    await wait_for(lambda: len(gw.gateway.ledger or ()) == 1, what="the record")
    assert await rows(gw.store) == []
    await gw.gateway.close()
    assert len(await rows(gw.store)) == 1


async def test_budgeted_records_are_written_at_the_budget_pace(
        sqlite_store: SqliteStore) -> None:
    ledger = Ledger(sqlite_store, interval=3600, urgent_interval=0.05, capacity=100,
                    retention=86400)
    task = asyncio.create_task(ledger.run())
    try:
        ledger.record(rec("plain"))
        ledger.record(rec("budgeted"), urgent=True)
        await wait_for(lambda: len(ledger) == 0, what="the budgeted record to be written")
        assert ledger.written == 2
        ledger.record(rec("plain-again"))
        await asyncio.sleep(0.3)      # several budget ticks: nothing urgent waits
        assert len(ledger) == 1
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_request_logs_keep_bodies_only_for_teams_that_ask(
        make_gateway: GatewayFactory, engines: Callable[..., Awaitable[FakeEngine]]) -> None:
    from llmgw.tenancy import Limits
    from tests.gateway.test_tenants import make_key, make_team

    engine = await engines()
    gw = await make_gateway([chat_model("m", upstream=[engine.url])], listen="0.0.0.0:8080",
                            ledger_interval="50ms")
    await make_team(gw.store, "quiet")
    await make_team(gw.store, "meta", Limits(log_requests="metadata"))
    await make_team(gw.store, "full", Limits(log_requests="bodies", log_retention_days=7))
    keys = {t: await make_key(gw.store, f"{t}-key", t) for t in ("quiet", "meta", "full")}
    await wait_for(lambda: len(gw.gateway.keys) == 3, what="the runtime keys")
    body = {"model": "m", "messages": [{"role": "user", "content": PROMPT}]}
    for key in keys.values():
        r = await gw.client.post("/v1/chat/completions", json=body,
                                 headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200
    streamed = await gw.client.post("/v1/chat/completions", json={**body, "stream": True},
                                    headers={"Authorization": f"Bearer {keys['full']}"})
    assert streamed.status_code == 200
    await gw.gateway.ledger.flush()   # type: ignore[union-attr]
    assert await gw.store.request_logs("quiet", time.time() + 1, 10) == []
    [meta] = await gw.store.request_logs("meta", time.time() + 1, 10)
    assert meta.request is None
    assert meta.response is None
    entry = json.loads(meta.record)
    assert entry["path"] == "/v1/chat/completions"
    assert entry["usage"][2] == "meta-key"
    assert "kittens" not in meta.record.decode()
    assert keys["meta"] not in meta.record.decode()
    stream_log, plain_log = await gw.store.request_logs("full", time.time() + 1, 10)
    assert plain_log.request is not None
    assert "kittens" in plain_log.request.decode()
    assert plain_log.response is not None
    assert json.loads(plain_log.response)["usage"]["completion_tokens"] == 3
    assert stream_log.response is not None
    assert stream_log.response.decode() == streamed.text      # as the client received it
    assert round(plain_log.expires_at - plain_log.at) == 7 * 86400
    assert await gw.store.purge_request_logs(time.time() + 8 * 86400) == 2   # full's 7 days
    assert await gw.store.purge_request_logs(time.time() + 31 * 86400) == 1  # meta's 30


def test_log_settings_belong_to_the_team() -> None:
    from llmgw.errors import DefinitionError
    from llmgw.tenancy import Limits, check_limits, check_narrowing

    with pytest.raises(DefinitionError, match="log_requests is set on the team"):
        check_narrowing(Limits(), Limits(log_requests="bodies"), "key 'k'")
    with pytest.raises(DefinitionError) as err:
        check_limits(Limits(log_retention_days=0), "team 't'")
    assert err.value.field == "log_retention_days"


async def test_records_dropped_while_a_batch_is_written_do_not_take_newer_ones(
        sqlite_store: SqliteStore) -> None:
    """The buffer overflows during a write: the batch's records that were dropped meanwhile
    are not replaced by popping newer, unwritten ones."""
    gate = asyncio.Event()
    entered = asyncio.Event()

    class Slow:
        is_open = True

        async def record_usage(self, records: list[UsageRecord]) -> int:
            entered.set()
            await gate.wait()
            return await sqlite_store.record_usage(records)

    ledger = Ledger(Slow(), interval=1, capacity=3, retention=86400)  # type: ignore[arg-type]
    for i in range(3):
        ledger.record(rec(f"old{i}"))
    flushing = asyncio.create_task(ledger.flush())
    await entered.wait()
    for i in range(2):                       # drops old0 and old1, which are being written
        ledger.record(rec(f"new{i}"))
    gate.set()
    assert await flushing == 5               # the batch, then the two newer records
    assert len(ledger) == 0
    assert sorted(r[0] for r in await rows(sqlite_store)) == [
        "new0", "new1", "old0", "old1", "old2"]
    assert ledger.pending_teams == {}
    assert ledger.written_teams == {"ml": 50}
