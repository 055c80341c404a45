"""A second llmgw-like process for the store tests: increments a counter model.

Run as ``python counter_worker.py URL COUNT``. It opens the store, prints
``ready``, waits for a line on stdin (so the test can start several workers at
the same instant), then makes COUNT read-modify-write changes and prints
``done``. Not a test module: pytest does not collect it.
"""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import UTC, datetime

from llmgw.store import StoredModel, open_store


async def main(url: str, count: int) -> None:
    store = open_store(url)
    await store.open()
    try:
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        for _ in range(count):
            async with store.change() as change:
                current = {m.name: m for m in await change.models()}
                n = json.loads(current["counter"].definition)["n"] if "counter" in current else 0
                # A second round trip between the read and the write widens the
                # window another process would slip into if changes were not
                # serialised.
                await change.models()
                now = datetime.now(UTC)
                await change.put_model(StoredModel(
                    name="counter", definition=json.dumps({"n": n + 1}).encode(),
                    added_by="worker", added_at=now, updated_by="worker", updated_at=now,
                ))
    finally:
        await store.close()
    print("done", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
