"""Usage ledger benchmark: Postgres ingestion, roll-up queries, gateway throughput with the
ledger on and off, and token-budget overshoot under a burst.

    .venv/bin/python bench/ledger_bench.py [--parts ingest,query,ab,overshoot]
        [--postgres postgresql://postgres@127.0.0.1:5432/test] [--duration 10] [--rounds 3]

Everything runs on loopback on this machine; each Postgres part works in a
schema of its own, dropped afterwards.

* ingest: records written the way the gateway's ledger writes them (batches
  of ``BATCH`` through ``PostgresStore.record_usage``, roll-ups included),
  timed end to end; the median of ``--rounds`` runs.
* query: a month of hourly roll-ups for 100 teams (2 keys and 3 models each),
  then ``GET /api/v1/usage``'s query by team per hour over the month, and by
  model per day; median and worst of 20 runs each.
* ab: the gateway alone (``gateway_serve.py``, one uvicorn worker, the Python
  upstream) at 32 connections, ledger off and on, alternated ``--rounds``
  times in the same run; medians. ``ab-postgres``: the same on Postgres;
  ``ab-unwritten``: the ledger on but writing only after the runs (the
  request path's share of the cost).
* overshoot: a team with a daily budget, 32 connections bursting through two
  gateway instances on one Postgres schema until every connection is
  refused; the tokens served past the budget.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway_bench import BODY, gateway, load, python_upstream

from llmgw.gateway.ledger import BATCH
from llmgw.store.base import StoredKey, StoredTeam, UsageRecord
from llmgw.store.postgres import PostgresStore
from llmgw.store.schema import ROLL_UP_BY
from llmgw.tenancy import Limits, encode_limits, generate_key, hash_key

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


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of ``pid`` so far (its threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ab(rounds: int, duration: float, database: str | None, interval: str = "1s") -> None:
    """Both gateways run side by side; loads alternate between them, the order flipped
    each round, so drift in what else the machine runs falls on both alike.

    Besides throughput, each run's gateway CPU time per request: what the ledger
    costs the process, which other load on a shared machine disturbs far less
    than it disturbs throughput (the writes' thread is included)."""
    tmp = Path(os.environ.get("TMPDIR", "/tmp"))
    off: list[float] = []
    on: list[float] = []
    cpu_off: list[float] = []
    cpu_on: list[float] = []
    env = {"LLMGW_BENCH_DATABASE": database} if database else {}
    where = "Postgres" if database else "SQLite"
    with contextlib.ExitStack() as stack:
        upstream = stack.enter_context(python_upstream(100, 0.05))
        url_off, pid_off = stack.enter_context(gateway(
            "uvicorn", {"bench": upstream}, env={**env, "LLMGW_BENCH_LEDGER": "0"}))
        url_on, pid_on = stack.enter_context(gateway(
            "uvicorn", {"bench": upstream}, env={**env, "LLMGW_BENCH_LEDGER": "1",
                                                 "LLMGW_BENCH_LEDGER_INTERVAL": interval}))
        for url in (url_off, url_on):
            load(url, 32, min(2.0, duration), tmp)     # warm up
        for i in range(rounds):
            pair = [(off, cpu_off, url_off, pid_off), (on, cpu_on, url_on, pid_on)]
            for results, cpu, url, pid in pair if i % 2 == 0 else pair[::-1]:
                before = cpu_seconds(pid)
                rps, _med, _bad = load(url, 32, duration, tmp)
                # load() warms up for 2 s before its measured run; CPU covers both, so
                # it is divided by the requests of both (at the measured rate).
                spent = cpu_seconds(pid) - before
                results.append(rps)
                cpu.append(spent / (rps * (duration + min(2.0, duration))) * 1e6)
    ratios = sorted(b / a for a, b in zip(off, on, strict=True))
    cpu_ratios = sorted(a / b for a, b in zip(cpu_off, cpu_on, strict=True))
    print(f"gateway throughput at 32 connections, store {where}, ledger writing every "
          f"{interval}, {rounds} alternated pairs of "
          f"{duration:g} s runs: ledger off median {statistics.median(off):,.0f} req/s, on "
          f"{statistics.median(on):,.0f} req/s; median of the pairs' ratios "
          f"{statistics.median(ratios):.3f} (target >= 0.95; pairs "
          f"{', '.join(f'{r:.2f}' for r in ratios)})")
    print(f"  gateway CPU per request: ledger off median {statistics.median(cpu_off):.0f} us,"
          f" on {statistics.median(cpu_on):.0f} us; off/on median of the pairs "
          f"{statistics.median(cpu_ratios):.3f} (pairs "
          f"{', '.join(f'{r:.2f}' for r in cpu_ratios)})")


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="ingest,query,ab,overshoot")
    parser.add_argument("--postgres", default=DEFAULT_PG)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--budget", type=int, default=30_000)
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    print(f"machine: {os.cpu_count()} cores; Postgres {args.postgres.rsplit('@', 1)[-1]}")
    if "ingest" in parts:
        asyncio.run(ingest(args.postgres, args.rounds, args.records))
    if "query" in parts:
        asyncio.run(query(args.postgres))
    if "ab" in parts:
        ab(args.rounds, args.duration, None)
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
