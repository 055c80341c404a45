"""Usage ledger benchmark: Postgres ingestion, roll-up queries, gateway throughput with the
ledger on and off, and token-budget overshoot under a burst.

    .venv/bin/python bench/ledger_bench.py [--parts ingest,query,ab,overshoot]
        [--postgres postgresql://postgres@127.0.0.1:5432/test] [--duration 2] [--rounds 30]

Everything runs on loopback on this machine; each Postgres part works in a
schema of its own, dropped afterwards.

* ingest: records written the way the gateway's ledger writes them (batches
  of ``BATCH`` through ``PostgresStore.record_usage``, roll-ups included),
  timed end to end; the median of ``--ingest-runs`` runs.
* query: a month of hourly roll-ups for 100 teams (2 keys and 3 models each),
  then ``GET /api/v1/usage``'s query by team per hour over the month, and by
  model per day; median and worst of 20 runs each.
* ab: the gateway alone (``gateway_serve.py``, one uvicorn worker, the Python
  upstream) at 32 connections: ledger off, ledger on, and a second gateway with
  it off as a control, taking turns in ``--rounds`` rounds of ``--duration``
  runs in the same run; the median of the on/off ratios with a 95% interval,
  and the control's, which shows how fine a difference the machine resolves.
  ``ab-together``: the same with the three loaded at once in each round (wrk
  needed). ``ab-postgres``: the same as ab on Postgres;
  ``ab-unwritten``: the ledger on but writing only after the runs (the
  request path's share of the cost).
* overshoot: a team with a daily budget, 32 connections bursting through two
  gateway instances on one Postgres schema until every connection is
  refused; the tokens served past the budget.
* ab-full: as ab, with the gateway measured carrying the ledger, a token budget
  (every request from a key of a budgeted team) and the journal, against the
  same gateway with all three off (the same key, so authentication costs both
  alike) and a second one off as the control; target CPU per request off/on
  >= 0.97. Two more gateways, one without the journal and one without the
  journal and the budget, give each part's share. ``ab-full-postgres``: the
  same on Postgres (every gateway in one schema), where the store's work is
  the database's rather than a writer process of the gateway's.
* outage: two gateway instances with journals on one Postgres reached through
  ``llmgw.testing.tcpproxy``, ``--rate`` requests/s (every fourth streaming)
  spread over them; the proxy freezes every connection for each of
  ``--freezes`` seconds (30 and 300) with ``--settle`` s of normal traffic
  between, then one instance is SIGKILLed under the load and started again on
  its journal directory. Then the store's records against the requests the
  clients got answered 200 whole, which must be equal.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway_bench import (
    BODY,
    cpu_seconds,
    free_port,
    gateway,
    load,
    python_upstream,
    wrk_together,
)

from llmgw.gateway.ledger import BATCH
from llmgw.store.base import StoredKey, StoredTeam, UsageRecord
from llmgw.store.postgres import PostgresStore
from llmgw.store.schema import ROLL_UP_BY
from llmgw.tenancy import Limits, encode_limits, generate_key, hash_key
from llmgw.testing.tcpproxy import through as proxied

DEFAULT_PG = os.environ.get("LLMGW_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
# The Python upstream's canned answer reports 5 prompt and 1 completion token.
TOKENS_PER_REQUEST = 6


@contextlib.asynccontextmanager
async def schema(base: str) -> AsyncIterator[str]:
    name = f"llmgw_bench_{uuid.uuid4().hex[:10]}"
    async with await psycopg.AsyncConnection.connect(base, autocommit=True) as conn:
        await conn.execute(f'CREATE SCHEMA "{name}"')
    sep = "&" if "?" in base else "?"
    try:
        yield f"{base}{sep}options=-csearch_path%3D{name}"
    finally:
        async with await psycopg.AsyncConnection.connect(base, autocommit=True) as conn:
            await conn.execute(f'DROP SCHEMA "{name}" CASCADE')


def records(n: int, start: float) -> list[UsageRecord]:
    return [UsageRecord(id=uuid.uuid4().hex, at=start + i * 0.001, key=f"key-{i % 200}",
                        team=f"team-{i % 100}", model=f"model-{i % 3}",
                        replica="http://10.0.0.5:8000", gpu_class="h100-80g",
                        prompt_tokens=500 + i % 97, cached_tokens=i % 50,
                        completion_tokens=100 + i % 31, status=200, latency=1.25, ttft=0.08)
            for i in range(n)]


async def ingest(base: str, rounds: int, count: int) -> None:
    rates = []
    for _ in range(rounds):
        async with schema(base) as url:
            store = PostgresStore(url)
            await store.open()
            try:
                batch = records(count, time.time())
                started = time.perf_counter()
                for i in range(0, count, BATCH):
                    await store.record_usage(batch[i:i + BATCH])
                elapsed = time.perf_counter() - started
            finally:
                await store.close()
        rates.append(count / elapsed)
    print(f"ingestion into Postgres: {count:,} records in batches of {BATCH:,}, "
          f"{rounds} runs: median {statistics.median(rates):,.0f} records/s "
          f"(runs: {', '.join(f'{r:,.0f}' for r in rates)}; target >= 20,000)")


async def query(base: str) -> None:
    hours = 30 * 24
    end = int(time.time() // 3600) * 3600
    start = end - hours * 3600
    async with schema(base) as url:
        store = PostgresStore(url)
        await store.open()
        try:
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                async with conn.cursor().copy(
                        "COPY usage_hourly (hour, team, key, model, requests, prompt_tokens,"
                        " cached_tokens, completion_tokens) FROM STDIN") as copy:
                    for h in range(hours):
                        for t in range(100):
                            for k in range(2):
                                for m in range(3):
                                    await copy.write_row((start + h * 3600, f"team-{t}",
                                                          f"team-{t}-key-{k}", f"model-{m}",
                                                          10, 5000, 100, 900))
                # What the ledger's writes would have rolled up from those rows.
                await conn.execute(ROLL_UP_BY % "usage_hourly")
                await conn.execute("ANALYZE usage_hourly")
                await conn.execute("ANALYZE usage_rollup")
            rows = hours * 100 * 2 * 3
            for by, day in (("team", False), ("model", True)):
                times = []
                answer = []
                for _ in range(20):
                    t0 = time.perf_counter()
                    answer = await store.usage(by, start, end, day=day)
                    times.append(time.perf_counter() - t0)
                print(f"usage by {by} per {'day' if day else 'hour'} over 30 days, "
                      f"{rows:,} roll-up rows, {len(answer):,} buckets answered: median "
                      f"{statistics.median(times) * 1000:.1f} ms, worst "
                      f"{max(times) * 1000:.1f} ms (target < 200 ms)")
            # What every gateway reads each budget cycle while a team has a monthly budget.
            times = []
            totals = []
            for _ in range(20):
                t0 = time.perf_counter()
                totals = await store.token_totals(start)
                times.append(time.perf_counter() - t0)
            print(f"a month's token totals per key (budgets' re-read), {len(totals):,} keys: "
                  f"median {statistics.median(times) * 1000:.1f} ms, "
                  f"worst {max(times) * 1000:.1f} ms")
        finally:
            await store.close()


def pin(pid: int, core: int) -> None:
    """Every thread of ``pid`` on ``core`` (threads it starts later inherit it)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(int(task.name), {core})


def median_interval(values: list[float]) -> tuple[float, float]:
    """A 95% confidence interval for the median of ``values`` (order statistics: no
    assumption about their distribution)."""
    ordered = sorted(values)
    n = len(ordered)
    # The largest k with P(Binomial(n, 1/2) < k) <= 2.5%: the median lies between the
    # k-th smallest and the k-th largest with at least 95% confidence.
    k, below = 0, 0.0
    while k < n // 2:
        below_next = below + math.comb(n, k) / 2 ** n
        if below_next > 0.025:
            break
        below, k = below_next, k + 1
    if k == 0:
        return ordered[0], ordered[-1]
    return ordered[k - 1], ordered[n - k]


def ab(rounds: int, duration: float, database: str | None, interval: str = "1s",
       together: bool = False, full: bool = False) -> None:
    """The gateway with the ledger on, with it off, and a second one with it off (the
    control) run side by side. Loads take turns between them in short runs, the order
    reversed each round, so that what else the machine runs falls on all alike; or,
    ``together``, all three are loaded at once in each round (a wrk each), so that
    they share the very same moments: then the three share the first core (pinned
    to it, their threads included, so that the kernel gives each the same share of
    the same core rather than moving them between cores) and the load generators
    and the upstream have the second. Each round gives an on/off ratio; the
    control/off ratios show what the method can resolve on this machine, in the
    same run.

    Besides throughput, each run's gateway CPU time per request (its threads and
    the ledger's writer process included): what the ledger costs.

    ``full``: "on" is the ledger, a budget checked on every request and the
    journal; every gateway is sent a key (one of its own), so that
    authentication costs them all alike."""
    tmp = Path(os.environ.get("TMPDIR", "/tmp"))
    # With ``full``, "unjournaled" is "on" without the journal, and "unbudgeted" that
    # without the budget too (the ledger alone): each part's own share.
    names: tuple[str, ...] = ("off", "on", "unjournaled", "unbudgeted", "control") if full \
        else ("off", "on", "control")
    rps: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    env = {"LLMGW_BENCH_DATABASE": database} if database else {}
    # A key of its own for each gateway (they may share one database).
    keys = {name: generate_key() if full else None for name in names}
    assert not (full and together), "ab-full takes turns"
    journals = tempfile.TemporaryDirectory(prefix="llmgw-bench-journal-")
    where = "Postgres" if database else "SQLite"
    cores = sorted(os.sched_getaffinity(0))
    pinned = together and len(cores) >= 2
    with contextlib.ExitStack() as stack:
        if pinned:
            # This process, and so the upstream and every wrk, on the second core.
            stack.callback(os.sched_setaffinity, 0, set(cores))
            os.sched_setaffinity(0, {cores[1]})
        stack.enter_context(journals)
        upstream = stack.enter_context(python_upstream(100, 0.05))
        # The journal only where it is measured: "on" with ``full``.
        journal = journals.name if full else "0"
        servers = {
            name: stack.enter_context(gateway("uvicorn", {"bench": upstream}, env={
                **env, **({"LLMGW_BENCH_KEY": keys[name]} if keys[name] else {}),
                "LLMGW_BENCH_LEDGER": "0" if name in ("off", "control") else "1",
                **({"LLMGW_BENCH_BUDGET": "none"} if name == "unbudgeted" else {}),
                "LLMGW_BENCH_LEDGER_INTERVAL": interval,
                "LLMGW_BENCH_JOURNAL": journal if name == "on" else "0"}))
            for name in names}
        for name, (url, _pid) in servers.items():
            load(url, 32, 2.0, tmp, key=keys[name])     # warm up
        for i in range(rounds):
            if together:
                if pinned:
                    for _url, pid in servers.values():
                        pin(pid, cores[0])
                before = {name: cpu_seconds(pid) for name, (_url, pid) in servers.items()}
                figures = wrk_together([url for url, _pid in servers.values()], 32,
                                       duration, tmp)
                for (name, (_url, pid)), (got, _med, _bad) in zip(servers.items(), figures,
                                                                  strict=True):
                    rps[name].append(got)
                    cpu[name].append((cpu_seconds(pid) - before[name]) / (got * duration)
                                     * 1e6)
                continue
            for name in names if i % 2 == 0 else names[::-1]:
                url, pid = servers[name]
                before_one = cpu_seconds(pid)
                got, _med, bad = load(url, 32, duration, tmp, warm=False, key=keys[name])
                if bad:
                    raise RuntimeError(f"{bad} requests to the {name} gateway were not 2xx")
                rps[name].append(got)
                cpu[name].append((cpu_seconds(pid) - before_one) / (got * duration) * 1e6)
    ratios = [b / a for a, b in zip(rps["off"], rps["on"], strict=True)]
    control = [b / a for a, b in zip(rps["off"], rps["control"], strict=True)]
    cpu_ratios = [a / b for a, b in zip(cpu["off"], cpu["on"], strict=True)]
    low, high = median_interval(ratios)
    c_low, c_high = median_interval(control)
    how = "loaded together" if together else "taking turns"
    what = "ledger + budget + journal" if full else "ledger"
    print(f"gateway throughput at 32 connections each, {how}, store {where}, {what}, "
          f"writing every {interval}, {rounds} rounds of {duration:g} s: off median "
          f"{statistics.median(rps['off']):,.0f} req/s, on {statistics.median(rps['on']):,.0f}"
          f" req/s, control (off) {statistics.median(rps['control']):,.0f} req/s")
    print(f"  on/off: median of the pairs' ratios {statistics.median(ratios):.3f} "
          f"(95% interval {low:.3f}-{high:.3f}; target >= {0.97 if full else 0.95})")
    print(f"  control/off, the method's resolution: {statistics.median(control):.3f} "
          f"(95% interval {c_low:.3f}-{c_high:.3f})")
    cpu_low, cpu_high = median_interval(cpu_ratios)
    cpu_control = [a / b for a, b in zip(cpu["off"], cpu["control"], strict=True)]
    print(f"  gateway CPU per request: off median {statistics.median(cpu['off']):.0f} us, "
          f"on {statistics.median(cpu['on']):.0f} us, control "
          f"{statistics.median(cpu['control']):.0f} us; off/on median of the pairs "
          f"{statistics.median(cpu_ratios):.3f} (95% interval {cpu_low:.3f}-{cpu_high:.3f}"
          f"{'; target >= 0.97' if full else ''}), off/control "
          f"{statistics.median(cpu_control):.3f}")
    if full:
        for part, without, with_ in (("the journal", "unjournaled", "on"),
                                     ("the budget", "unbudgeted", "unjournaled"),
                                     ("the ledger", "off", "unbudgeted")):
            shares = [a / b for a, b in zip(cpu[without], cpu[with_], strict=True)]
            print(f"  {part}'s share: CPU per request without it median "
                  f"{statistics.median(cpu[without]):.0f} us, with it "
                  f"{statistics.median(cpu[with_]):.0f} us; without/with median of the "
                  f"pairs {statistics.median(shares):.3f}")


async def _burst(urls: list[str], key: str, connections: int) -> int:
    """Each connection sends requests until it is refused; the requests answered 200."""
    answered = 0

    async def one(url: str) -> None:
        nonlocal answered
        host, port = url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        request = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: "
                   f"application/json\r\nAuthorization: Bearer {key}\r\nContent-Length: "
                   f"{len(BODY)}\r\n\r\n").encode() + BODY
        try:
            while True:
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                status = int(head.split(b" ", 2)[1])
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                await reader.readexactly(length)
                if status == 200:
                    answered += 1
                elif status in (401, 429):
                    if status == 429:
                        return
                    await asyncio.sleep(0.05)   # the key is not followed yet
                else:
                    raise RuntimeError(f"unexpected status {status}")
        finally:
            writer.close()

    await asyncio.gather(*(one(urls[i % len(urls)]) for i in range(connections)))
    return answered


async def overshoot(base: str, budget: int, instances: int) -> None:
    async with schema(base) as url:
        store = PostgresStore(url)
        await store.open()
        try:
            with contextlib.ExitStack() as stack:
                upstream = stack.enter_context(python_upstream(100, 0.05))
                gateways = [stack.enter_context(gateway(
                    "uvicorn", {"bench": upstream}, env={"LLMGW_BENCH_DATABASE": url}))[0]
                    for _ in range(instances)]
                await store.put_team(StoredTeam(
                    name="burst", settings=encode_limits(Limits(tokens_per_day=budget)),
                    created_by="bench", created_at=time.time()), create=True)
                key = generate_key()
                await store.put_key(StoredKey(name="burst-key", team="burst",
                                              sha256=hash_key(key), settings=b"{}",
                                              created_by="bench", created_at=time.time()))
                await asyncio.sleep(1.0)      # every gateway follows the key (0.5 s polls)
                answered = await _burst(gateways, key, 32)
                served = answered * TOKENS_PER_REQUEST
                print(f"budget overshoot, {instances} gateway instance(s), 32 connections, "
                      f"budget {budget:,} tokens ({budget // TOKENS_PER_REQUEST:,} requests of "
                      f"{TOKENS_PER_REQUEST} tokens): served {served:,} tokens in {answered:,} "
                      f"requests, {served - budget:,} past the budget "
                      f"({(served - budget) / budget:.1%})")
        finally:
            await store.close()


# ---------------------------------------------------------------- outage


class _Answers:
    """Requests sent at a fixed rate over the live gateways; those answered 200 whole."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.urls: list[str] = []
        self.sent = 0
        self.answered = 0
        self.failed = 0
        self.latencies: list[float] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def run(self, stop: asyncio.Event) -> None:
        async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(
                max_connections=1000, max_keepalive_connections=100)) as http:
            loop = asyncio.get_running_loop()
            start = loop.time()
            while not stop.is_set():
                self.sent += 1
                task = asyncio.create_task(self._one(http, self.urls[self.sent % len(self.urls)],
                                                     self.sent % 4 == 0))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                # Open loop: the next request leaves on time whatever became of this one.
                await asyncio.sleep(max(0.0, start + self.sent / self.rate - loop.time()))
            await asyncio.gather(*self._tasks)

    async def _one(self, http: httpx.AsyncClient, url: str, stream: bool) -> None:
        body = {"model": "bench", "stream": stream, "max_tokens": 8,
                "messages": [{"role": "user", "content": "hello"}]}
        started = time.perf_counter()
        try:
            r = await http.post(f"{url}/v1/chat/completions", json=body)
            whole = b"[DONE]" in r.content if stream else b'"choices"' in r.content
            if r.status_code == 200 and whole:
                self.answered += 1
                self.latencies.append(time.perf_counter() - started)
                return
        except httpx.HTTPError:
            pass
        self.failed += 1


async def _records(url: str) -> tuple[int, int]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT COUNT(*), COUNT(*) FILTER (WHERE status = 200) FROM usage")
        row = await cur.fetchone()
        assert row is not None
        return int(row[0]), int(row[1])


async def _waiting(urls: list[str]) -> str:
    """What the gateways' ledgers hold unwritten now (their /metrics)."""
    out = []
    async with httpx.AsyncClient(timeout=10) as http:
        for url in urls:
            try:
                text = (await http.get(f"{url}/metrics")).text
            except httpx.HTTPError:
                out.append("?")
                continue
            figures = dict(re.findall(
                r"^llmgw_gateway_ledger_(waiting_records|journal_bytes) ([\d.e+]+)$", text,
                re.MULTILINE))
            out.append(f"{float(figures.get('waiting_records', 0)):,.0f} records "
                       f"(journal files {float(figures.get('journal_bytes', 0)) / 1024:,.0f} "
                       "KiB)")
    return ", ".join(out)


async def outage(base: str, freezes: list[float], rate: float, settle: float) -> None:
    async with schema(base) as url:
        parts = urlsplit(url)
        port = free_port()
        proxy = subprocess.Popen(
            [sys.executable, "-m", "llmgw.testing.tcpproxy", "--target",
             f"{parts.hostname}:{parts.port or 5432}", "--port", str(port)],
            stdout=subprocess.PIPE, cwd=Path(__file__).resolve().parents[1])
        assert proxy.stdout is not None
        proxy.stdout.readline()
        through = proxied(url, port)
        try:
            with contextlib.ExitStack() as stack:
                journals = [stack.enter_context(tempfile.TemporaryDirectory(
                    prefix="llmgw-bench-journal-")) for _ in range(2)]
                upstream = stack.enter_context(python_upstream(20, 0.05))

                def start(i: int) -> tuple[str, int]:
                    return stack.enter_context(gateway("uvicorn", {"bench": upstream}, env={
                        "LLMGW_BENCH_DATABASE": through, "LLMGW_BENCH_JOURNAL": journals[i],
                        "LLMGW_BENCH_LEDGER_INTERVAL": "1s"}))

                servers = [start(0), start(1)]
                answers = _Answers(rate)
                answers.urls = [u for u, _pid in servers]
                stop = asyncio.Event()
                driver = asyncio.create_task(answers.run(stop))
                await asyncio.sleep(settle)
                print(f"outage: 2 gateway instances with journals, Postgres through a TCP "
                      f"proxy, {rate:g} requests/s (every fourth streaming, 1 s streams)")
                for seconds in freezes:
                    before, lat_from = answers.answered, len(answers.latencies)
                    proxy.send_signal(signal.SIGUSR1)
                    await asyncio.sleep(seconds)
                    held = await _waiting(answers.urls)
                    proxy.send_signal(signal.SIGUSR2)
                    during = answers.latencies[lat_from:]
                    print(f"  Postgres frozen {seconds:g} s: {answers.answered - before:,} "
                          f"requests answered 200 during it (median "
                          f"{statistics.median(during) * 1000 if during else 0:.0f} ms); "
                          f"unwritten at its end: {held}")
                    await asyncio.sleep(settle)
                pid_a = servers[0][1]
                answers.urls = [servers[1][0]]
                os.kill(pid_a, signal.SIGKILL)
                killed_at = answers.answered
                await asyncio.sleep(settle)
                restarted = await asyncio.to_thread(start, 0)   # the load goes on meanwhile
                answers.urls = [restarted[0], servers[1][0]]
                await asyncio.sleep(settle)
                stop.set()
                await driver
                print(f"  one instance SIGKILLed under the load and restarted on its journal "
                      f"{settle:g} s later; {answers.answered - killed_at:,} answered since")
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 300
                records = await _records(url)
                while records[1] < answers.answered and loop.time() < deadline:
                    await asyncio.sleep(1)
                    records = await _records(url)
                await asyncio.sleep(3)          # and nothing more arrives
                records = await _records(url)
                verdict = "equal" if records == (answers.answered, answers.answered) else \
                    "NOT EQUAL"
                print(f"  requests sent {answers.sent:,}, answered 200 {answers.answered:,}, "
                      f"failed {answers.failed:,} (those in flight to the killed instance); "
                      f"ledger records {records[0]:,} ({records[1]:,} of status 200): {verdict}")
        finally:
            proxy.terminate()
            proxy.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="ingest,query,ab,overshoot")
    parser.add_argument("--postgres", default=DEFAULT_PG)
    parser.add_argument("--duration", type=float, default=2.0,
                        help="seconds of each A/B run")
    parser.add_argument("--rounds", type=int, default=30,
                        help="rounds of the A/B parts")
    parser.add_argument("--ingest-runs", type=int, default=3)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--budget", type=int, default=30_000)
    parser.add_argument("--freezes", default="30,300",
                        help="seconds of each freeze of Postgres in the outage part")
    parser.add_argument("--rate", type=float, default=20.0,
                        help="requests/s in the outage part")
    parser.add_argument("--settle", type=float, default=15.0,
                        help="seconds of normal traffic around each event of the outage part")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    print(f"machine: {os.cpu_count()} cores; Postgres {args.postgres.rsplit('@', 1)[-1]}")
    if "ingest" in parts:
        asyncio.run(ingest(args.postgres, args.ingest_runs, args.records))
    if "query" in parts:
        asyncio.run(query(args.postgres))
    if "ab" in parts:
        ab(args.rounds, args.duration, None)
    if "ab-full" in parts:
        ab(args.rounds, args.duration, None, full=True)
    if "ab-full-postgres" in parts:
        async def run_ab_full() -> None:
            async with schema(args.postgres) as url:
                await asyncio.to_thread(ab, args.rounds, args.duration, url, full=True)
        asyncio.run(run_ab_full())
    if "outage" in parts:
        asyncio.run(outage(args.postgres, [float(x) for x in args.freezes.split(",")],
                           args.rate, args.settle))
    if "ab-together" in parts:
        ab(args.rounds, args.duration, None, together=True)
    if "ab-unwritten" in parts:
        ab(args.rounds, args.duration, None, interval="1h")
    if "ab-postgres" in parts:
        async def run_ab() -> None:
            async with schema(args.postgres) as url:
                await asyncio.to_thread(ab, args.rounds, args.duration, url)
        asyncio.run(run_ab())
    if "overshoot" in parts:
        for instances in (1, 2):
            asyncio.run(overshoot(args.postgres, args.budget, instances))


if __name__ == "__main__":
    main()
