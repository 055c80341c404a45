"""Slices of token budgets, leased from the store, that admission reserves against.

A token budget (``tokens_per_minute``, ``tokens_per_day``, ``tokens_per_month``
of a team or of a key) is shared by every gateway process of a deployment.
Each process that serves a budgeted key holds a *slice* of each of its
budgets: a number of tokens the store granted it. A request is admitted only
when every slice of its key can reserve its worst case, and the reservation is
settled with the engine's real usage when the answer ends. Both are
arithmetic on this process's memory: no store round trip on the request path.
A loop (``run``) keeps the slices topped up in the background, before they run
dry: a slice aims at about a second of its recent pace of reservations and
twice its largest request, at most an eighth of the budget beyond one request,
and gives back what it holds past three times that. Only the first request of
a budget this process has not served yet, or one that finds its slice dry
while the budget has room, waits for the loop (``REFILL_WAIT`` at most).

Rejected: asking the store per request (a round trip on every request's
path, and the store's outage becomes every budgeted request's); comparing
totals re-read every ``budget_interval`` with the budget, which was the
design before this one: every instance admits on what it last read, so the
overshoot grows with the instances and the requests in flight (+27-47% with
two instances, 64 clients and ``max_tokens`` 64 on a 20,000-token day), and
with the store down each instance enforces the whole budget alone.

**Why it holds across any number of instances.** The store grants a slice
in one transaction under the budget's lock (``Store.lease_slice``): it admits
a slice only while

    tokens written to the ledger in the period + every live slice <= budget

where a slice counts ``granted - settled``: the tokens granted to it minus
those of its answered requests its ledger has already written. A process
never hands out more than it was granted, so at any moment the tokens
answered or in flight, across every process, are at most the written tokens
plus the slices, which is at most the budget. A request whose reservation
covers its real usage (its body's bytes bound its prompt, since no token of a
byte-level vocabulary is shorter than a byte and the JSON around the text is
bytes no token stands for; ``max_tokens`` bounds its answer) therefore never
takes a budget past its limit. A request without ``max_tokens`` reserves
``DEFAULT_ANSWER_TOKENS`` for its answer: what it generates beyond that is
the overshoot, at most its model's context per such request in flight.

**Nothing counts twice.** A token is in a slice until its record is written,
then in the written tokens: the holder reports ``settled`` (its tokens spent
under the slice, less those of records still in its ledger's buffer) with
every renewal. Between a record's write and its holder's next renewal the
tokens are in both, which only ever refuses a slice that would have fitted,
never grants one that does not, and lasts one renewal interval.

**Failure modes.** A process that dies holding a slice stops renewing it; the
store drops it ``gateway.budget_lease_ttl`` after its last renewal (the next
holder of the budget to renew does), and its tokens come back. What its
requests had spent and not yet written is then counted nowhere: without a
journal it is lost with its records; with one (``gateway.journal_dir``) it is
written when a process next starts on that directory, and the budget can pass
its limit by that much — at most the dead process's slice.
A process that cannot renew — the store is down — keeps serving from its
slice while its own lease has time left, measured from before its last
successful renewal was sent, so it never outlives the store's copy. After
that the budget's ``when_store_down`` decides: ``refuse`` (the default) answers
503 ``budget_unavailable`` until the store is back, so the budget holds
exactly; ``admit`` serves on, counted in
``llmgw_gateway_budget_unchecked_requests_total``, checked only against the
totals this process last read (``Budgets.check``): with N processes cut off
from the store, up to N times the budget. Availability over billing is the
operator's choice per budget, never the default.

A budget smaller than one request's reservation can never admit it: 429
``insufficient_quota`` saying so, with when the budget resets.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime

from llmgw.errors import LlmgwError, RateLimitedError, UnavailableError
from llmgw.gateway.budgets import QuotaExceededError
from llmgw.gateway.ledger import Ledger
from llmgw.store.base import SliceAsk, Store
from llmgw.tenancy import BUDGET_FIELDS, BudgetField, Limits, period_start, resets_at

log = logging.getLogger("llmgw.gateway.slices")

_PERIOD = {"tokens_per_minute": "minute", "tokens_per_day": "day (UTC)",
           "tokens_per_month": "month (UTC)"}
# How long a request whose slice ran dry waits for the loop to refill it.
REFILL_WAIT = 2.0
# How long close() spends giving slices back.
CLOSE_TIMEOUT = 10.0


class BudgetUnavailableError(UnavailableError):
    """A budget that refuses while its slice cannot be renewed (the store is down)."""

    code = "budget_unavailable"

    def __init__(self, message: str, *, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class SliceDryError(RateLimitedError):
    """The budget has room, but this process's slice was not refilled in time."""

    code = "budget_refilling"


class Slice:
    """This process's share of one budget."""

    __slots__ = ("asked_at", "biggest", "field", "free", "granted", "key", "limit", "open",
                 "owner", "pace", "renewing", "reserved", "scope", "settled", "spent", "team",
                 "tried", "valid_until", "wanted_at", "window")

    def __init__(self, scope: str, team: str, key: str, field: BudgetField, limit: int,
                 owner: str) -> None:
        self.scope, self.team, self.key, self.field = scope, team, key, field
        self.owner = owner                 # "team 'ml'" or "key 'k'", for messages
        self.limit = limit
        self.open = False                  # when_store_down: admit
        self.granted = 0                   # running total the store granted
        self.spent = 0                     # running total of settled usage
        self.reserved = 0                  # reservations of requests in flight
        self.settled = 0                   # spent that the ledger has written, last reported
        self.valid_until = 0.0             # loop time this process may use the grant until
        self.tried = False                 # a renewal was attempted
        self.renewing = False              # one is under way
        self.free = 0                      # room beyond this slice, at the last renewal
        self.biggest = 0                   # the largest reservation lately
        self.window = 0                    # tokens reserved since the last renewal
        self.pace = 0                      # tokens reserved per lookahead, at the last one
        self.asked_at = 0.0                # loop time of the last renewal sent
        self.wanted_at = 0.0               # loop time a request last asked for tokens

    @property
    def available(self) -> int:
        return self.granted - self.spent - self.reserved

    def target(self) -> int:
        """Slack to hold: the recent pace over the lookahead, and twice the largest
        request, but no more than an eighth of the budget beyond one request."""
        return max(min(max(self.pace, 2 * self.biggest), self.limit // 8), self.biggest, 1)


class Reservation:
    """The tokens a request holds on each slice of its key until it is settled."""

    __slots__ = ("slices", "tokens")

    def __init__(self, slices: tuple[Slice, ...], tokens: int) -> None:
        self.slices, self.tokens = slices, tokens


_Refusal = LlmgwError | None


class Slices:
    """Every slice this process holds, the reservations on them, and their renewal."""

    def __init__(self, store: Store, ledger: Ledger, holder: str, *, interval: float,
                 ttl: float, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time,
                 on_renewal: Callable[[str], object] = lambda outcome: None,
                 on_unchecked: Callable[[str, str, str], object] = lambda t, b, o: None
                 ) -> None:
        self.store, self.ledger, self.holder = store, ledger, holder
        self.interval, self.ttl = interval, ttl
        self.clock, self.wall = clock, wall
        self._on_renewal, self._on_unchecked = on_renewal, on_unchecked
        self._slices: dict[str, Slice] = {}
        # (team, key) -> (key limits, team limits, the key's slices), rebuilt on a change.
        self._of_key: dict[tuple[str, str], tuple[Limits | None, Limits | None,
                                                   tuple[Slice, ...]]] = {}
        self._wake = asyncio.Event()
        self._refilled = asyncio.Event()

    # ------------------------------------------------------------ the request path

    def slices_of(self, team: str, key: str, team_limits: Limits | None,
                  key_limits: Limits | None) -> tuple[Slice, ...]:
        cached = self._of_key.get((team, key))
        if cached is not None and cached[0] is key_limits and cached[1] is team_limits:
            return cached[2]
        out: list[Slice] = []
        for field in BUDGET_FIELDS:
            for limits, scope, owner, name in (
                    (key_limits, f"key/{team}/{key}/{field}", f"key {key!r}", key),
                    (team_limits, f"team/{team}/{field}", f"team {team!r}", "")):
                limit = limits.budget(field) if limits is not None else None
                if limit is None:
                    continue
                sl = self._slices.get(scope)
                if sl is None:
                    sl = self._slices[scope] = Slice(scope, team, name, field, limit, owner)
                assert limits is not None
                sl.limit, sl.open = limit, limits.when_store_down == "admit"
                out.append(sl)
        slices = tuple(out)
        self._of_key[(team, key)] = (key_limits, team_limits, slices)
        return slices

    def reserve(self, slices: tuple[Slice, ...], tokens: int) -> Reservation | None:
        """Reserve ``tokens`` on every slice, or raise why not; None: a slice must be
        refilled first (``refilled``), and nothing was reserved."""
        now = self.clock()
        unchecked: Slice | None = None
        for sl in slices:
            sl.wanted_at = now
            if tokens > sl.limit:
                raise self._too_small(sl, tokens)
            sl.biggest = max(sl.biggest, tokens)      # what the next renewal must cover
            if now < sl.valid_until:
                if sl.available >= tokens:
                    continue
                if sl.available + sl.free >= tokens:
                    self._wake.set()
                    return None
                raise self._spent(sl, tokens)
            if not sl.valid_until and (not sl.tried or sl.renewing):
                self._wake.set()       # never leased yet: the first lease is on its way
                return None
            if not sl.open:
                self._on_unchecked(sl.team, sl.field, "refused")
                raise BudgetUnavailableError(
                    f"{sl.owner}'s budget of {sl.limit:,} tokens per {_PERIOD[sl.field]} "
                    "cannot be checked: the store has not answered for longer than this "
                    "gateway's lease on it (gateway.budget_lease_ttl), and the budget "
                    "refuses while it cannot be checked (when_store_down: refuse); retry "
                    "when the store is back", retry_after=max(1.0, self.interval * 5))
            unchecked = sl
        if unchecked is not None:
            self._on_unchecked(unchecked.team, unchecked.field, "admitted")
        for sl in slices:
            sl.reserved += tokens
            sl.window += tokens
            if sl.available * 2 < sl.target():
                self._wake.set()
        return Reservation(slices, tokens)

    async def refilled(self) -> None:
        """Wait for the loop's next round of renewals."""
        await self._refilled.wait()

    async def reserve_waiting(self, slices: tuple[Slice, ...], tokens: int) -> Reservation:
        """``reserve``, waiting for refills while it says to (at most ``REFILL_WAIT``)."""
        deadline = self.clock() + REFILL_WAIT
        while True:
            got = self.reserve(slices, tokens)
            if got is not None:
                return got
            try:
                async with asyncio.timeout(max(0.0, deadline - self.clock())):
                    await self.refilled()
            except TimeoutError:
                raise SliceDryError(
                    "this gateway's share of the token budget is being refilled from the "
                    "store; retry in a second", retry_after=1.0) from None

    def settle(self, res: Reservation, tokens: int) -> None:
        """The request ended having used ``tokens``: its reservation becomes that."""
        for sl in res.slices:
            sl.reserved -= res.tokens
            sl.spent += tokens

    def charge(self, slices: Iterable[Slice], tokens: int) -> None:
        """Usage of a request that reserved nothing (one whose size is not known up front)."""
        for sl in slices:
            sl.spent += tokens

    def _too_small(self, sl: Slice, tokens: int) -> QuotaExceededError:
        now = self.wall()
        at = resets_at(sl.field, now)
        when = datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds")
        return QuotaExceededError(
            f"{sl.owner}'s budget of {sl.limit:,} tokens per {_PERIOD[sl.field]} is smaller "
            f"than this request's reservation of {tokens:,} tokens (its body's bytes, which "
            "bound its prompt, plus max_tokens), so it can never be admitted; send a shorter "
            f"request or a lower max_tokens, or raise the budget (it resets at {when})",
            retry_after=max(1.0, at - now), resets_at=at)

    def _spent(self, sl: Slice, tokens: int) -> QuotaExceededError:
        now = self.wall()
        at = resets_at(sl.field, now)
        when = datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds")
        held = max(0, sl.limit - sl.free - sl.available)
        return QuotaExceededError(
            f"{sl.owner} has used or reserved {held:,} of its {sl.limit:,} tokens per "
            f"{_PERIOD[sl.field]}, and this request reserves {tokens:,}; it resets at {when}"
            + (" (a sliding minute)" if sl.field == "tokens_per_minute" else ""),
            retry_after=max(1.0, at - now), resets_at=at)

    # ------------------------------------------------------------ renewal

    async def run(self) -> None:
        while True:
            try:
                async with asyncio.timeout(self.interval):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            try:
                await self.tick()
            except Exception:
                log.exception("renewing budget slices failed; retrying on the next round")

    async def tick(self) -> None:
        """Renew every slice that needs it, then wake the requests waiting for one."""
        if self.store.is_open:
            now = self.clock()
            for sl in list(self._slices.values()):
                if self._idle(sl, now):
                    await self._release(sl)
                elif self._due(sl, now):
                    await self.renew(sl)
        event, self._refilled = self._refilled, asyncio.Event()
        event.set()

    def _due(self, sl: Slice, now: float) -> bool:
        if now >= sl.valid_until - self.ttl * 2 / 3:
            return True                 # keep-alive, well before the lease runs out
        target = sl.target()
        if sl.available < sl.biggest or sl.available * 2 < target or sl.available > 3 * target:
            return True
        # Near the end of the budget, while requests want it: whatever other holders
        # give back is seen within an interval.
        return sl.free < target and now - sl.asked_at >= self.interval and \
            now - sl.wanted_at < self.ttl

    def _idle(self, sl: Slice, now: float) -> bool:
        return (sl.tried and not sl.reserved and now - sl.wanted_at > self.ttl
                and self._unwritten(sl) == 0)

    def _unwritten(self, sl: Slice) -> int:
        """Tokens spent under ``sl`` that may not be in the store's totals yet: at most
        the tokens of the ledger's buffered records of its team or key."""
        ledger = self.ledger
        pending = ledger.pending_keys.get((sl.team, sl.key), 0) if sl.key else \
            ledger.pending_teams.get(sl.team, 0)
        return min(sl.spent - sl.settled, pending) if sl.spent > sl.settled else 0

    async def renew(self, sl: Slice, *, final: bool = False) -> None:
        """Report what ``sl`` spent and ask for its target of slack (``final``: none)."""
        sent = self.clock()
        if sl.asked_at and sent > sl.asked_at:
            lookahead = max(4 * self.interval, 1.0)
            sl.pace = int(sl.window * lookahead / (sent - sl.asked_at))
        settled = sl.spent - self._unwritten(sl)
        committed = sl.spent + sl.reserved
        target = sl.target()
        # Slack beyond three targets goes back, and all of it once the lease lapsed (it
        # was the store's again); what is handed out never does. Lowered here, before
        # the store hears of it, so this process never holds more than the store counts.
        keep = committed + 3 * target if sent < sl.valid_until and not final else committed
        sl.granted = max(committed, min(sl.granted, keep))
        floor = sl.granted
        want = floor if final else max(floor, committed + 2 * target)
        # One large request sizes the slice for a while, not for good.
        sl.biggest -= sl.biggest // 4
        wall = self.wall()
        ask = SliceAsk(scope=sl.scope, holder=self.holder, team=sl.team, key=sl.key,
                       since=wall - 60.0 if sl.field == "tokens_per_minute"
                       else period_start(sl.field, wall),
                       recent=sl.field == "tokens_per_minute", limit=sl.limit,
                       settled=settled, floor=floor, want=want, ttl=self.ttl)
        sl.tried, sl.asked_at, sl.renewing, sl.window = True, sent, True, 0
        try:
            grant = await self.store.lease_slice(ask)
        except LlmgwError as exc:
            self._on_renewal("failed")
            log.warning("renewing this gateway's slice of %s failed (it lapses in %.1f s): "
                        "%s", sl.scope, max(0.0, sl.valid_until - self.clock()), exc.message)
            return
        finally:
            sl.renewing = False
        sl.granted = max(sl.granted, grant.granted)
        sl.settled = settled
        sl.valid_until = sent + self.ttl
        sl.free = sl.limit - grant.used - grant.others - (sl.granted - settled)
        self._on_renewal("granted" if grant.granted > floor else
                         "exhausted" if want > floor else "kept")

    async def _release(self, sl: Slice) -> None:
        # Forgotten before the store hears of it: a request meanwhile starts a new slice.
        self._slices.pop(sl.scope, None)
        self._of_key.clear()
        sl.valid_until = 0.0
        try:
            await self.store.release_slice(sl.scope, self.holder)
        except LlmgwError as exc:
            log.warning("giving back this gateway's slice of %s failed (the store drops "
                        "it when it expires): %s", sl.scope, exc.message)

    async def close(self) -> None:
        """Give back every slice (after the ledger's last write): what is written is in
        the totals, what is not stays held until the lease expires."""
        if not self.store.is_open:
            return
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT):
                for sl in list(self._slices.values()):
                    if self._unwritten(sl) == 0 and not sl.reserved:
                        await self._release(sl)
                    else:
                        await self.renew(sl, final=True)
        except TimeoutError:
            log.warning("giving back this gateway's budget slices took over %.0f s; the "
                        "store drops the rest when they expire", CLOSE_TIMEOUT)

    # ------------------------------------------------------------ metrics

    def figures(self) -> Iterator[tuple[str, tuple[str, ...], float]]:
        """Each slice's tokens by state, and the seconds its lease has left."""
        now = self.clock()
        for sl in self._slices.values():
            labels = (sl.team, sl.key, sl.field)
            yield "llmgw_gateway_budget_slice_tokens", (*labels, "available"), \
                float(max(0, sl.available) if now < sl.valid_until else 0)
            yield "llmgw_gateway_budget_slice_tokens", (*labels, "reserved"), \
                float(sl.reserved)
            yield "llmgw_gateway_budget_slice_tokens", (*labels, "unwritten"), \
                float(sl.spent - sl.settled)
            yield "llmgw_gateway_budget_slice_lease_seconds", labels, \
                max(0.0, sl.valid_until - now)
