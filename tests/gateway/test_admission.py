"""The admission queue on its own: bounds, priority order, and waiting as an awaitable."""

from __future__ import annotations

import asyncio

import pytest

from llmgw.gateway.admission import AdmissionQueue
from llmgw.gateway.errors import ModelBusyError


def queue(size: int = 10, wait: float = 30.0) -> AdmissionQueue:
    return AdmissionQueue("qwen", size, wait, lambda: asyncio.get_running_loop().time())


async def test_a_full_queue_answers_429_with_a_retry_after() -> None:
    """Beyond queue_size waiting tickets, join raises ModelBusyError carrying a delay."""
    q = queue(size=2)
    q.join("interactive")
    q.join("batch")
    with pytest.raises(ModelBusyError) as caught:
        q.join("interactive")
    assert caught.value.status == 429
    assert caught.value.retry_after >= 1
    assert "routing.queue_size" in caught.value.message


async def test_interactive_tickets_go_before_batch_and_fifo_within_a_class() -> None:
    """Admission takes every interactive ticket, oldest first, before any batch ticket."""
    q = queue()
    b1 = q.join("batch")
    i1 = q.join("interactive")
    b2 = q.join("batch")
    i2 = q.join("interactive")
    order = []
    for _ in range(4):
        q.admit(1)
        admitted = [t for t in (b1, i1, b2, i2) if t.admitted and t not in order]
        order += admitted
        for t in admitted:
            t.close()       # forwarded: its transit ends
    assert order == [i1, i2, b1, b2]


async def test_waiting_can_be_interleaved_with_other_work() -> None:
    """wait(timeout) returns False while still in line, then True once admitted."""
    q = queue()
    ticket = q.join("interactive")
    beats = 0
    while not await ticket.wait(0.01):
        beats += 1          # a caller would send an SSE keep-alive comment here
        if beats == 3:
            q.admit(1)
    assert beats == 3
    assert ticket.admitted
    assert q.in_transit == 1
    ticket.close()
    assert q.in_transit == 0


async def test_a_ticket_that_waits_too_long_is_answered_429_and_leaves_the_line() -> None:
    """Past queue_wait the ticket raises ModelBusyError and no longer counts as waiting."""
    q = queue(wait=0.05)
    ticket = q.join("batch")
    with pytest.raises(ModelBusyError) as caught:
        await ticket.wait()
    assert "routing.queue_wait" in caught.value.message
    assert len(q) == 0
    assert q.admit(5) == 0


async def test_admission_counts_tickets_in_transit_against_the_budget() -> None:
    """Tickets admitted but not yet forwarded use up capacity; closing one frees it."""
    q = queue()
    tickets = [q.join("interactive") for _ in range(3)]
    assert q.admit(2) == 2
    assert q.admit(2) == 0
    tickets[0].close()
    assert q.admit(2) == 1
    assert [t.admitted for t in tickets] == [False, True, True]


async def test_a_client_leaving_the_line_frees_its_place() -> None:
    """close() of a waiting ticket removes it; admission skips it."""
    q = queue(size=1)
    gone = q.join("interactive")
    gone.close()
    assert len(q) == 0
    stays = q.join("interactive")
    assert q.admit(1) == 1
    assert stays.admitted


async def test_teams_in_one_class_take_turns_by_tokens() -> None:
    """A team's burst does not hold back another team's requests (deficit round robin)."""
    q = AdmissionQueue("m", 100, 60, lambda: 0.0)
    burst = [q.join("interactive", "a", cost=1000) for _ in range(10)]
    late = [q.join("interactive", "b", cost=1000) for _ in range(2)]
    order = []
    for _ in range(12):
        assert q.admit(1) == 1
        admitted = next(t for t in burst + late if t.admitted and t not in order)
        order.append(admitted)
        admitted.close()
    teams = "".join("a" if t in burst else "b" for t in order)
    assert teams.index("b") <= 2
    assert teams[:4].count("b") == 2
    assert [t for t in order if t in burst] == burst      # first come, first served in a team


async def test_a_team_of_large_requests_gets_its_share_in_tokens() -> None:
    """Costs count: one team's 4,000-token requests go a quarter as often as 1,000-token ones."""
    q = AdmissionQueue("m", 100, 60, lambda: 0.0)
    big = [q.join("batch", "big", cost=4000) for _ in range(5)]
    small = [q.join("batch", "small", cost=1000) for _ in range(20)]
    done: list[str] = []
    for _ in range(15):
        assert q.admit(1) == 1
        t = next(t for t in big + small if t.admitted)
        done.append("big" if t in big else "small")
        t.close()
    assert 2 <= done.count("big") <= 4
    assert 11 <= done.count("small") <= 13


async def test_interactive_still_goes_before_batch_whatever_the_team() -> None:
    q = AdmissionQueue("m", 100, 60, lambda: 0.0)
    b = q.join("batch", "a")
    i = q.join("interactive", "b")
    assert q.admit(1) == 1
    assert i.admitted
    assert not b.admitted
