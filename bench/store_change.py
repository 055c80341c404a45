"""How long the store's operations take on each adapter.

    .venv/bin/python bench/store_change.py [--postgres URL] [--rounds N]

SQLite runs in a temporary directory; Postgres (from --postgres or
LLMGW_TEST_POSTGRES, skipped when neither is given) in a temporary schema
that is dropped afterwards. Prints the median and p95 of each operation in
milliseconds, and its ratio to the cheapest call on the same adapter
(``catalog_version()``, one primary-key read: the baseline every instance
polls twice a second).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from urllib.parse import quote

import psycopg

from llmgw.store.base import Store, StoredModel
from llmgw.store.postgres import PostgresStore
from llmgw.store.sqlite import SqliteStore

DEFINITION = (
    b'{"name":"%s","source":"hf://Qwen/Qwen2.5-Coder-32B-Instruct","engine":"vllm",'
    b'"profiles":[{"name":"h100","gpu_class":"h100-80g","gpus":2}],"scaling":{"min":1}}'
)


def model(name: str) -> StoredModel:
    now = datetime.now(UTC)
    return StoredModel(name=name, definition=DEFINITION % name.encode(), added_by="bench",
                       added_at=now, updated_by="bench", updated_at=now)


async def timed(fn: Callable[[], Awaitable[object]], rounds: int) -> list[float]:
    for _ in range(5):  # warm caches and the executor thread before measuring
        await fn()
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        await fn()
        samples.append((time.perf_counter() - start) * 1000)
    return samples


async def bench(label: str, make: Callable[[], Store], rounds: int) -> None:
    store, other = make(), make()
    await store.open()
    await other.open()
    try:
        async with store.change() as change:
            for i in range(2000):
                await change.put_model(model(f"model-{i:04d}"))
        counter = iter(range(10**9))

        async def one_change() -> None:
            async with store.change() as change:
                await change.put_model(model(f"scaled-{next(counter) % 50}"))

        async def empty_change() -> None:
            async with store.change():
                pass

        results = {
            "catalog_version()": await timed(store.catalog_version, rounds),
            "change(): put one model": await timed(one_change, rounds),
            "change(): empty": await timed(empty_change, rounds),
            "models(), 2,050 rows": await timed(store.models, max(5, rounds // 20)),
            "try_lease()": await timed(lambda: store.try_lease("reconciler", "bench", 10), rounds),
            "mark_activity()": await timed(lambda: store.mark_activity("model-0001"), rounds),
            "last_activity()": await timed(lambda: store.last_activity("model-0001"), rounds),
        }

        # Two instances changing at once: how many changes per second they
        # complete together, serialised by the catalog lock.
        per_side = max(20, rounds // 2)

        async def many(s: Store) -> None:
            for i in range(per_side):
                async with s.change() as change:
                    await change.put_model(model(f"contended-{i % 10}"))

        start = time.perf_counter()
        await asyncio.gather(many(store), many(other))
        contended = 2 * per_side / (time.perf_counter() - start)
    finally:
        await store.close()
        await other.close()

    base = statistics.median(results["catalog_version()"])
    print(f"\n{label}")
    print(f"  {'operation':28} {'median ms':>10} {'p95 ms':>9} {'x baseline':>11}")
    for name, samples in results.items():
        med = statistics.median(samples)
        p95 = statistics.quantiles(samples, n=20)[-1] if len(samples) >= 20 else max(samples)
        print(f"  {name:28} {med:10.3f} {p95:9.3f} {med / base:11.1f}")
    print(f"  two instances changing concurrently: {contended:.0f} changes/s in total")


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--postgres", default=os.environ.get("LLMGW_TEST_POSTGRES"))
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/llmgw.db"
        await bench(f"SQLite {url}", lambda: SqliteStore(url), args.rounds)

    if not args.postgres:
        print("\nPostgreSQL: skipped (give --postgres URL or set LLMGW_TEST_POSTGRES)")
        return
    schema = f"llmgw_bench_{uuid.uuid4().hex[:8]}"
    async with await psycopg.AsyncConnection.connect(args.postgres, autocommit=True) as conn:
        await conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        sep = "&" if "?" in args.postgres else "?"
        url = f"{args.postgres}{sep}options={quote(f'-csearch_path={schema}', safe='')}"
        await bench(f"PostgreSQL {args.postgres} (schema {schema})", lambda: PostgresStore(url),
                    args.rounds)
    finally:
        async with await psycopg.AsyncConnection.connect(args.postgres, autocommit=True) as conn:
            await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


if __name__ == "__main__":
    asyncio.run(main())
