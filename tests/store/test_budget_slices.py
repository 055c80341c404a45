"""Budget slices in the store: granted atomically within the budget, written tokens
counted once, an expired holder's slice given back. Both adapters, for real."""

from __future__ import annotations

import asyncio
import time

from llmgw.store.base import SliceAsk, UsageRecord
from tests.store.conftest import AnyStore, StoreFactory

SCOPE = "team/ml/tokens_per_day"


def ask(holder: str, *, want: int, floor: int = 0, settled: int = 0, limit: int = 1000,
        ttl: float = 30.0, scope: str = SCOPE) -> SliceAsk:
    day = time.time() // 86400 * 86400
    return SliceAsk(scope=scope, holder=holder, team="ml", key="", since=day, recent=False,
                    limit=limit, settled=settled, floor=floor, want=want, ttl=ttl)


def record(id: str, tokens: int) -> UsageRecord:
    return UsageRecord(id=id, at=time.time(), key="k", team="ml", model="m", replica="r",
                       gpu_class="", prompt_tokens=tokens, cached_tokens=0,
                       completion_tokens=0, status=200, latency=0.1, ttft=None)


async def test_concurrent_holders_are_never_granted_more_than_the_budget(
        make_store: StoreFactory) -> None:
    """Eight instances asking at once for 300 tokens each of a 1,000-token budget, again
    and again: what they hold together never passes the budget."""
    stores = [await make_store() for _ in range(8)]
    granted = [0] * 8

    async def grow(i: int, store: AnyStore) -> None:
        for _ in range(5):
            got = await store.lease_slice(ask(f"gw{i}", want=granted[i] + 300,
                                              floor=granted[i]))
            granted[i] = got.granted

    await asyncio.gather(*(grow(i, s) for i, s in enumerate(stores)))
    assert sum(granted) == 1000
    assert all(g >= 0 for g in granted)


async def test_written_tokens_are_counted_once(store: AnyStore) -> None:
    """A holder's tokens are in its slice until it reports them written; then only in the
    totals, and the room another holder sees is the budget less both, once."""
    a = await store.lease_slice(ask("a", want=500))
    assert a.granted == 500
    assert (await store.lease_slice(ask("b", want=1000))).granted == 500
    await store.release_slice(SCOPE, "b")
    await store.record_usage([record("r1", 400)])
    # Written but not yet reported by a: counted twice, which only ever refuses.
    assert (await store.lease_slice(ask("b", want=1000))).granted == 100
    kept = await store.lease_slice(ask("a", want=500, floor=500, settled=400))
    assert (kept.used, kept.others) == (400, 100)
    got = await store.lease_slice(ask("b", want=1000, floor=100))
    assert got.granted == 500                    # 1000 - 400 written - a's 100 left
    assert (got.used, got.others) == (400, 100)


async def test_a_holder_never_drops_below_what_it_handed_out(store: AnyStore) -> None:
    """The floor (what a holder already reserved or spent) is granted even past the
    budget: the tokens are used whatever the store says, and must stay counted."""
    await store.lease_slice(ask("a", want=900))
    got = await store.lease_slice(ask("b", want=300, floor=200))
    assert got.granted == 200
    assert (await store.lease_slice(ask("c", want=100))).granted == 0


async def test_an_expired_slice_comes_back(make_store: StoreFactory) -> None:
    """A holder that stops renewing (it died) loses its slice after its ttl: the next
    holder to ask gets its tokens."""
    dead, alive = await make_store(), await make_store()
    assert (await dead.lease_slice(ask("dead", want=800, ttl=1.0))).granted == 800
    assert (await alive.lease_slice(ask("alive", want=1000))).granted == 200
    deadline = time.monotonic() + 60
    while (await alive.lease_slice(ask("alive", want=1000, floor=200))).granted < 1000:
        assert time.monotonic() < deadline, "the dead holder's slice never came back"
        await asyncio.sleep(0.2)


async def test_a_sliding_minute_reads_the_raw_records_of_the_key(store: AnyStore) -> None:
    await store.record_usage([record("r1", 300)])
    scope = "key/ml/k/tokens_per_minute"
    got = await store.lease_slice(SliceAsk(
        scope=scope, holder="a", team="ml", key="k", since=time.time() - 60, recent=True,
        limit=1000, settled=0, floor=0, want=1000, ttl=30))
    assert (got.used, got.granted) == (300, 700)
    other = await store.lease_slice(SliceAsk(
        scope="key/ml/other/tokens_per_minute", holder="a", team="ml", key="other",
        since=time.time() - 60, recent=True, limit=1000, settled=0, floor=0, want=1000,
        ttl=30))
    assert (other.used, other.granted) == (0, 1000)
