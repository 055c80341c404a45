"""Runtime teams and keys in the gateway: followed from the store, beside the keys file."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest

from llmgw.gateway.keys import add_key, generate_key, hash_key
from llmgw.store.base import Store, StoredKey, StoredTeam
from llmgw.tenancy import Limits, encode_limits
from tests.gateway.conftest import GatewayFactory, chat_model, wait_for
from tests.gateway.engine import FakeEngine


async def make_team(store: Store, name: str, limits: Limits | None = None) -> None:
    assert await store.put_team(StoredTeam(
        name=name, settings=encode_limits(limits or Limits()), created_by="t",
        created_at=time.time()), create=True)


async def make_key(store: Store, name: str, team: str, limits: Limits | None = None,
                   key: str | None = None) -> str:
    key = key or generate_key()
    assert await store.put_key(StoredKey(
        name=name, team=team, sha256=hash_key(key), settings=encode_limits(limits or Limits()),
        created_by="t", created_at=time.time()))
    return key


async def until(probe: Callable[[], Awaitable[bool]], what: str, timeout: float = 30.0) -> float:
    """Poll ``probe`` until true; the seconds it took."""
    start = time.monotonic()
    while not await probe():
        assert time.monotonic() - start < timeout, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)
    return time.monotonic() - start


async def test_a_runtime_key_works_and_stops_when_its_team_is_revoked(
        make_gateway: GatewayFactory, engines: Callable[..., Awaitable[FakeEngine]],
        tmp_path: Path) -> None:
    engine = await engines()
    keys_file = tmp_path / "keys.json"
    add_key(keys_file, "declared")
    gw = await make_gateway([chat_model(n, upstream=[engine.url]) for n in ("a", "b")],
                            keys_file=keys_file, listen="0.0.0.0:8080")
    await make_team(gw.store, "ml", Limits(models=["a"]))
    key = await make_key(gw.store, "ml-ci", "ml")

    async def accepted() -> bool:
        return (await gw.chat("a", key=key)).status_code == 200

    await until(accepted, "the runtime key to be accepted")
    assert (await gw.chat("b", key=key)).status_code == 403     # the team's allow-list
    await gw.store.delete_team("ml")

    async def refused() -> bool:
        r: httpx.Response = await gw.chat("a", key=key)
        return r.status_code == 401

    # Polled every half second: the revocation is in force well within a second
    # of the gateway's next poll (the bound is asserted loosely; the machine is loaded).
    await until(refused, "the revoked team's key to be refused")


async def test_the_keys_file_wins_over_a_runtime_key_of_the_same_name(
        make_gateway: GatewayFactory, engines: Callable[..., Awaitable[FakeEngine]],
        tmp_path: Path) -> None:
    engine = await engines()
    keys_file = tmp_path / "keys.json"
    declared = add_key(keys_file, "shared-name", models=["a"])
    gw = await make_gateway([chat_model(n, upstream=[engine.url]) for n in ("a", "b")],
                            keys_file=keys_file)
    await make_team(gw.store, "ml")
    runtime = await make_key(gw.store, "shared-name", "ml")
    other = await make_key(gw.store, "other", "ml")

    async def other_accepted() -> bool:
        return (await gw.chat("b", key=other)).status_code == 200

    await until(other_accepted, "the runtime keys to be read")
    assert (await gw.chat("a", key=runtime)).status_code == 401
    assert (await gw.chat("b", key=declared)).status_code == 403   # the file's allow-list


async def test_a_team_rate_limit_is_shared_by_its_keys(
        make_gateway: GatewayFactory, engines: Callable[..., Awaitable[FakeEngine]]) -> None:
    engine = await engines()
    gw = await make_gateway([chat_model("a", upstream=[engine.url])], listen="0.0.0.0:8080")
    await make_team(gw.store, "ml", Limits(rpm=2))
    k1 = await make_key(gw.store, "k1", "ml")
    k2 = await make_key(gw.store, "k2", "ml")

    async def accepted() -> bool:
        return (await gw.chat("a", key=k1)).status_code == 200

    await until(accepted, "the runtime key to be accepted")
    assert (await gw.chat("a", key=k2)).status_code == 200
    r = await gw.chat("a", key=k2)
    assert r.status_code == 429
    assert r.json()["error"]["code"] == "rate_limit_exceeded"


async def test_loopback_without_a_keys_file_closes_once_a_runtime_key_exists(
        make_gateway: GatewayFactory, engines: Callable[..., Awaitable[FakeEngine]]) -> None:
    engine = await engines()
    gw = await make_gateway([chat_model("a", upstream=[engine.url])])
    assert (await gw.chat("a")).status_code == 200
    await make_team(gw.store, "ml")
    key = await make_key(gw.store, "k", "ml")

    async def closed() -> bool:
        return (await gw.chat("a")).status_code == 401

    await until(closed, "open access to end")
    assert (await gw.chat("a", key=key)).status_code == 200


async def test_keys_stay_in_force_while_the_store_cannot_be_read(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A store outage keeps the runtime keys read last; it is logged once, not every poll."""
    from llmgw.errors import StoreUnavailableError
    from llmgw.gateway.keys import KeyRing
    from llmgw.gateway.tenants import TenantsFollower
    from llmgw.store.sqlite import SqliteStore

    store = SqliteStore(f"sqlite:///{tmp_path / 't.db'}")
    await store.open()
    try:
        await make_team(store, "ml")
        key = await make_key(store, "k", "ml")
        ring = KeyRing()
        follower = TenantsFollower(store, ring.replace_runtime, interval=0.01)
        assert await follower.refresh()
        assert ring.lookup(key) is not None
        polls = 0

        class Down:
            is_open = True

            async def tenants_version(self) -> int:
                nonlocal polls
                polls += 1
                raise StoreUnavailableError("the database is down")

        follower.store = Down()  # type: ignore[assignment]
        task = asyncio.create_task(follower.run())
        try:
            await wait_for(lambda: polls >= 5, what="several failed polls")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        assert ring.lookup(key) is not None
        assert sum("reading teams and keys failed" in r.message for r in caplog.records) == 1
    finally:
        await store.close()
