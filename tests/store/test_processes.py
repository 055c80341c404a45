"""Catalog changes from separate OS processes serialise on the database."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from .conftest import Database, StoreFactory

WORKER = Path(__file__).with_name("counter_worker.py")
REPO = Path(__file__).resolve().parents[2]


async def start_worker(url: str, count: int) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(WORKER), url, str(count),
        cwd=REPO,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 60)
    if line.strip() != b"ready":
        assert proc.stderr is not None
        err = await proc.stderr.read()
        raise AssertionError(f"worker failed to open the store: {line!r} {err.decode()}")
    return proc


async def test_two_processes_incrementing_one_model_lose_no_update(
        database: Database, make_store: StoreFactory) -> None:
    """Two OS processes each making 25 read-modify-write changes end with the counter at 50."""
    # Both workers open the fresh database at about the same time, which also
    # exercises concurrent migration across processes.
    workers = await asyncio.gather(*(start_worker(database.url, 25) for _ in range(2)))
    for proc in workers:  # release both at once
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
        await proc.stdin.drain()
    for proc in workers:
        out, err = await asyncio.wait_for(proc.communicate(), 120)
        assert proc.returncode == 0, err.decode()
        assert out.strip() == b"done"

    store = await make_store()
    [counter] = await store.models()
    assert json.loads(counter.definition) == {"n": 50}
    assert await store.catalog_version() == 50
