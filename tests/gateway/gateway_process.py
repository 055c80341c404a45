"""One gateway in a process of its own, for tests that need two sharing a store.

``python -m tests.gateway.gateway_process --store PATH --dir DIR --models JSON``
serves a Gateway with the SQLite store at PATH and a FileBackend in DIR on a
free loopback port, and prints its base URL on the first line of stdout.
``--database URL`` names any store instead (a Postgres one), ``--gateway JSON``
gives the ``gateway:`` settings (``journal_dir``, ``ledger_interval``…).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

import uvicorn

from llmgw.catalog.decode import convert
from llmgw.catalog.model import Model
from llmgw.config import GatewayConfig, ServerConfig
from llmgw.gateway import Gateway
from llmgw.store import open_store
from tests.gateway.doubles import CatalogHolder, FileBackend


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store")
    parser.add_argument("--database")
    parser.add_argument("--dir", required=True)
    parser.add_argument("--models", required=True)
    parser.add_argument("--gateway", default="{}")
    args = parser.parse_args()
    models = convert(json.loads(args.models), list[Model])
    store = open_store(args.database or f"sqlite:///{args.store}")
    await store.open()
    config = ServerConfig(listen="127.0.0.1:0",
                          gateway=convert(json.loads(args.gateway), GatewayConfig))
    gateway = Gateway(config, CatalogHolder(models), FileBackend(Path(args.dir)), store)
    await gateway.start()
    config = uvicorn.Config(gateway, host="127.0.0.1", port=0, lifespan="off",
                            log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
            return
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    print(f"http://127.0.0.1:{port}", flush=True)
    # A process the test forgot ends by itself.
    await asyncio.wait_for(task, 600)


if __name__ == "__main__":
    asyncio.run(main())
