"""The admission queue: requests held in the gateway while every replica of a model is saturated.

Holding a request here rather than at the engine buys three things. Order: a
queue in the gateway serves ``interactive`` keys before ``batch`` keys (FIFO
within a class), where an engine's queue is one FIFO for everybody. Choice:
a held request goes to whichever replica frees first, not the one it happened
to be sent to. And a bound: beyond ``size`` waiting requests, or ``wait``
seconds in the queue, the client is told 429 with a Retry-After at once,
instead of a generation that starts minutes later or a timeout.

This module is only the queue, with no notion of replicas, so that anything
that must wait its turn for a model can use it. Whoever knows the capacity
calls ``admit(budget)`` when it may have changed (a request finished, a scrape
came in): the head tickets are admitted while the budget, less the tickets
admitted but not yet forwarded (``in_transit``), allows.

**Waiting is an awaitable the caller interleaves with other work.**
``Ticket.wait(timeout)`` returns True once admitted and False when
``timeout`` passes first, the ticket still in line; so a caller holding a
stream can send keep-alive comments between waits. It raises
``ModelBusyError`` (429) when the ticket's time in the queue is up.
``Ticket.close()`` must follow in a ``finally``: it leaves the line, or ends
the transit of an admitted ticket once its request is being forwarded.

**Within a class, teams share fairly**: deficit round robin by tokens. Each
ticket carries its team and an estimate of its tokens (``cost``: the prompt's
bytes / 4 plus the answer's ``max_tokens``, see ``request``); each team waiting
has its own line, the teams take turns, and a team's turn admits tickets while
its deficit covers them, the deficit growing by ``QUANTUM`` tokens each time it
comes round. One team's burst therefore waits behind a share of every other
team's requests instead of ahead of all of them; within a team the order stays
first come, first served.

Leaving is lazy (a ticket that timed out or whose client went away is marked,
and skipped when it reaches the head), so every operation is O(1) but the
skip.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Callable
from typing import Literal

from llmgw.gateway.errors import ModelBusyError
from llmgw.tenancy import Priority

PRIORITIES: tuple[Priority, ...] = ("interactive", "batch")
_State = Literal["waiting", "admitted", "gone"]
# Admissions remembered for the drain rate behind Retry-After.
_RATE_WINDOW = 10.0
# Tokens a team's deficit grows by each round (deficit round robin).
QUANTUM = 1024.0


class Ticket:
    """One request's place in line."""

    __slots__ = ("_future", "_queue", "_state", "cost", "deadline", "joined", "priority", "team")

    def __init__(self, queue: AdmissionQueue, priority: Priority, joined: float,
                 team: str = "", cost: float = 1.0) -> None:
        self._queue = queue
        self.priority = priority
        self.team = team
        self.cost = cost
        self.joined = joined
        self.deadline = joined + queue.wait
        self._future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._state: _State = "waiting"

    @property
    def admitted(self) -> bool:
        return self._state == "admitted"

    async def wait(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109 (a poll)
        """True once admitted; False after ``timeout`` with the ticket still in line.

        Raises ModelBusyError (the ticket leaves the line) when it has waited
        the queue's limit.
        """
        if self._state != "waiting":
            return self._state == "admitted"
        left = self.deadline - self._queue.clock()
        limit = left if timeout is None else min(timeout, left)
        if limit > 0:
            try:
                async with asyncio.timeout(limit):
                    await asyncio.shield(self._future)
            except TimeoutError:
                pass
        if self.admitted:
            return True
        if timeout is not None and timeout < left:
            return False
        self.close()
        queue = self._queue
        queue.expired += 1
        raise ModelBusyError(
            f"model {queue.name!r} is saturated and this request waited {queue.wait:g} s "
            "(routing.queue_wait) without a replica freeing up; retry later",
            retry_after=queue.retry_after())

    def close(self) -> None:
        """Leave the line, or end the transit of an admitted ticket."""
        if self._state == "waiting":
            self._queue._left(self)
        elif self._state == "admitted":
            self._queue.in_transit -= 1
        self._state = "gone"
        if not self._future.done():
            self._future.cancel()

    def _admit(self) -> None:
        self._state = "admitted"
        self._future.set_result(None)


class _Lane:
    """One priority class: a line per team, served by deficit round robin."""

    __slots__ = ("deficit", "lines", "order")

    def __init__(self) -> None:
        self.lines: dict[str, deque[Ticket]] = {}
        self.order: deque[str] = deque()        # teams with a line, in turn order
        self.deficit: dict[str, float] = {}

    def append(self, ticket: Ticket) -> None:
        line = self.lines.get(ticket.team)
        if line is None:
            line = self.lines[ticket.team] = deque()
            self.order.append(ticket.team)
            self.deficit[ticket.team] = 0.0
        line.append(ticket)

    def pop(self) -> Ticket | None:
        """The next ticket to admit, or None when no one waits."""
        order = self.order
        while order:
            team = order[0]
            line = self.lines[team]
            while line and line[0]._state != "waiting":
                line.popleft()
            if not line:
                order.popleft()
                del self.lines[team]
                del self.deficit[team]
                continue
            head = line[0]
            if self.deficit[team] >= head.cost or len(order) == 1:
                self.deficit[team] = max(0.0, self.deficit[team] - head.cost)
                return line.popleft()
            # Not enough for its head: the team's turn ends; it gains a quantum
            # for its next turn and goes last.
            self.deficit[team] += QUANTUM
            order.rotate(-1)
        return None

    def __bool__(self) -> bool:
        return bool(self.order)


class AdmissionQueue:
    """A bounded line of tickets in priority order for one model."""

    def __init__(self, name: str, size: int, wait: float, clock: Callable[[], float]) -> None:
        self.name = name
        self.size = size
        self.wait = wait
        self.clock = clock
        self._lanes: dict[Priority, _Lane] = {p: _Lane() for p in PRIORITIES}
        self._waiting: dict[Priority, int] = dict.fromkeys(PRIORITIES, 0)
        self.in_transit = 0
        self.expired = 0
        self._admissions: deque[float] = deque()

    def __len__(self) -> int:
        return sum(self._waiting.values())

    def waiting(self, priority: Priority) -> int:
        return self._waiting[priority]

    def join(self, priority: Priority, team: str = "", cost: float = 1.0) -> Ticket:
        """A place in ``team``'s line of the class; ModelBusyError (429) when the queue is full.

        ``cost``: the request's estimated tokens, what its team's turn is charged.
        """
        if len(self) >= self.size:
            raise ModelBusyError(
                f"model {self.name!r} is saturated and {len(self)} requests are already "
                f"waiting for it (routing.queue_size {self.size}); retry later",
                retry_after=self.retry_after())
        ticket = Ticket(self, priority, self.clock(), team, max(1.0, cost))
        self._lanes[priority].append(ticket)
        self._waiting[priority] += 1
        return ticket

    def admit(self, budget: float) -> int:
        """Admit head tickets while ``budget`` (free capacity) exceeds those in transit."""
        admitted = 0
        for priority in PRIORITIES:
            lane = self._lanes[priority]
            while budget - self.in_transit > 0:
                ticket = lane.pop()
                if ticket is None:
                    break
                self._waiting[priority] -= 1
                self.in_transit += 1
                ticket._admit()
                admitted += 1
        if admitted:
            now = self.clock()
            self._admissions.extend([now] * min(admitted, 1000))
            while self._admissions and self._admissions[0] < now - _RATE_WINDOW:
                self._admissions.popleft()
        return admitted

    def retry_after(self) -> float:
        """Seconds until the line has likely moved past a request joining now."""
        now = self.clock()
        while self._admissions and self._admissions[0] < now - _RATE_WINDOW:
            self._admissions.popleft()
        rate = len(self._admissions) / _RATE_WINDOW
        if rate <= 0:
            return max(1.0, min(self.wait, 5.0))
        return max(1.0, min(self.wait, math.ceil((len(self) + 1) / rate)))

    def _left(self, ticket: Ticket) -> None:
        self._waiting[ticket.priority] -= 1
