"""Budget slices in a gateway process: reservations within the slice, and what a budget
does when its slice cannot be renewed (when_store_down)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llmgw.errors import StoreUnavailableError
from llmgw.gateway.budgets import QuotaExceededError
from llmgw.gateway.ledger import Ledger
from llmgw.gateway.slices import BudgetUnavailableError, Reservation, Slice, Slices
from llmgw.store.base import SliceAsk, SliceGrant, UsageRecord
from llmgw.store.sqlite import SqliteStore
from llmgw.tenancy import Limits


class FlakyStore(SqliteStore):
    """A real SQLite store whose budget slices cannot be leased while ``down``."""

    down = False

    async def lease_slice(self, ask: SliceAsk) -> SliceGrant:
        if self.down:
            raise StoreUnavailableError("the store is unreachable (a test outage)")
        return await super().lease_slice(ask)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[FlakyStore]:
    s = FlakyStore(f"sqlite:///{tmp_path / 'b.db'}")
    await s.open()
    yield s
    await s.close()


class Counts:
    def __init__(self) -> None:
        self.renewals: list[str] = []
        self.unchecked: list[tuple[str, str, str]] = []


def slices_on(store: FlakyStore, counts: Counts, holder: str = "gw") -> Slices:
    ledger = Ledger(store, interval=1, capacity=100, retention=86400)
    return Slices(store, ledger, holder, interval=0.05, ttl=0.5,
                  on_renewal=counts.renewals.append,
                  on_unchecked=lambda *a: counts.unchecked.append(a))


def spend(slices: Slices, res: Reservation, tokens: int) -> None:
    """What the gateway does when a request ends: settle it and record its usage."""
    slices.settle(res, tokens)
    slices.ledger.record(UsageRecord(
        id=slices.ledger.next_id(), at=time.time(), key="k", team="ml", model="m",
        replica="r", gpu_class="", prompt_tokens=tokens, cached_tokens=0,
        completion_tokens=0, status=200, latency=0.1, ttft=None))


async def leased(slices: Slices, held: tuple[Slice, ...], tokens: int) -> None:
    """Reserve once the first lease is in (what the request path waits for)."""
    assert slices.reserve(held, tokens) is None     # not leased yet: wait for it
    await slices.tick()
    res = slices.reserve(held, tokens)
    assert res is not None
    spend(slices, res, tokens // 2)


async def lapse(slices: Slices, held: tuple[Slice, ...]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < held[0].valid_until:
        assert time.monotonic() < deadline
        await slices.tick()


async def test_a_lapsed_slice_refuses_by_default(store: FlakyStore) -> None:
    """The store down past the lease: the budget refuses (503 budget_unavailable), and the
    failed renewals and the refusal are counted."""
    counts = Counts()
    slices = slices_on(store, counts)
    held = slices.slices_of("ml", "k", Limits(tokens_per_day=1000), None)
    await leased(slices, held, 100)
    store.down = True
    assert slices.reserve(held, 100) is not None    # the lease still has time: served
    await lapse(slices, held)
    with pytest.raises(BudgetUnavailableError, match="when_store_down: refuse") as err:
        slices.reserve(held, 100)
    assert err.value.status == 503
    assert "failed" in counts.renewals
    assert counts.unchecked == [("ml", "tokens_per_day", "refused")]


async def test_a_lapsed_slice_admits_when_the_budget_says_so(store: FlakyStore) -> None:
    """when_store_down: admit serves on, counted; once the store is back, what was spent
    meanwhile is reported and counts against the budget."""
    counts = Counts()
    slices = slices_on(store, counts)
    held = slices.slices_of("ml", "k", Limits(tokens_per_day=1000, when_store_down="admit"),
                            None)
    await leased(slices, held, 100)
    store.down = True
    await lapse(slices, held)
    res = slices.reserve(held, 700)
    assert res is not None
    assert counts.unchecked == [("ml", "tokens_per_day", "admitted")]
    spend(slices, res, 700)
    store.down = False
    await slices.renew(held[0])
    other = slices_on(store, Counts(), holder="other")
    theirs = other.slices_of("ml", "k", Limits(tokens_per_day=1000), None)
    await other.tick()
    # 1000 less the 750 spent here and written nowhere yet.
    assert theirs[0].granted <= 250


async def test_a_reservation_never_passes_what_the_store_granted(store: FlakyStore) -> None:
    """Two processes on one 1,000-token budget reserve until refused: what they reserved
    together stays within it, and the refusal says what was used or reserved."""
    a, b = slices_on(store, Counts(), "a"), slices_on(store, Counts(), "b")
    limits = Limits(tokens_per_day=1000)
    held = [s.slices_of("ml", "k", limits, None) for s in (a, b)]
    reserved = 0
    refusals: list[str] = []
    for _ in range(100):
        for s, h in zip((a, b), held, strict=True):
            try:
                got = s.reserve(h, 90)
            except QuotaExceededError as exc:
                refusals.append(exc.message)
                continue
            if got is None:
                await s.tick()
            else:
                reserved += 90
        if len(refusals) >= 4:
            break
    assert len(refusals) >= 4
    assert all("has used or reserved" in m for m in refusals)
    assert 0 < reserved <= 1000


async def test_a_budget_smaller_than_the_reservation_is_refused_at_once(
        store: FlakyStore) -> None:
    slices = slices_on(store, Counts())
    held = slices.slices_of("ml", "k", None, Limits(tokens_per_minute=50))
    with pytest.raises(QuotaExceededError,
                       match=r"key 'k''s budget of 50 tokens per minute is smaller than this "
                             r"request's reservation of 80 tokens"):
        slices.reserve(held, 80)


async def test_a_closing_process_gives_its_slice_back(store: FlakyStore) -> None:
    """On shutdown, after the ledger's last write, a process's slices go back: another
    process can lease everything the written tokens leave."""
    a = slices_on(store, Counts(), "a")
    held = a.slices_of("ml", "k", Limits(tokens_per_day=1000), None)
    await leased(a, held, 200)                        # 100 tokens spent and recorded
    assert held[0].granted > 100
    await a.ledger.flush()
    await a.close()
    b = slices_on(store, Counts(), "b")
    theirs = b.slices_of("ml", "k", Limits(tokens_per_day=1000), None)
    theirs[0].biggest = 1000
    await b.tick()
    assert theirs[0].granted == 900
