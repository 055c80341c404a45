"""The gateway alone with a store and its batch worker, for ``batch_bench.py``.

    LLMGW_BENCH_UPSTREAM=http://127.0.0.1:18081 LLMGW_BENCH_STATE=/tmp/x \\
    LLMGW_BENCH_BATCH_CONCURRENCY=4 uvicorn --app-dir bench batch_serve:app

One external model, ``sim``, whose only replica is the upstream; no key is
needed (loopback listener, no keys_file). The SQLite store lives in
``LLMGW_BENCH_STATE``.
"""

from __future__ import annotations

import os
from typing import Any

from gateway_serve import (  # type: ignore[import-not-found]
    NoScheduler,
    StaticCatalog,
    serving,
)

from llmgw.catalog.build import build_catalog
from llmgw.catalog.decode import convert
from llmgw.catalog.model import Model
from llmgw.config import GatewayConfig, ServerConfig
from llmgw.gateway import Gateway
from llmgw.store.sqlite import SqliteStore


def build() -> Any:
    upstream = os.environ.get("LLMGW_BENCH_UPSTREAM", "http://127.0.0.1:18081")
    state = os.environ.get("LLMGW_BENCH_STATE", "/tmp/llmgw-batch-bench")
    concurrency = int(os.environ.get("LLMGW_BENCH_BATCH_CONCURRENCY", "4"))
    catalog = build_catalog([Model(name="sim", upstream=[upstream])])
    store = SqliteStore(f"sqlite:///{state}/store.db")
    config = ServerConfig(listen="127.0.0.1:0", gateway=convert(
        {"batch_concurrency": concurrency, "max_file_size": "1GiB"}, GatewayConfig))
    gateway = Gateway(config, StaticCatalog(catalog), NoScheduler(), store)
    return serving(gateway, store)


app = build()
