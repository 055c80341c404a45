"""The gateway on its own, for benchmarks: one external model in front of a given upstream.

    LLMGW_BENCH_MODELS=bench=http://127.0.0.1:18081,stream=http://127.0.0.1:18082 \\
        granian --interface asgi --workers 1 --working-dir bench gateway_serve:app
    # or: uvicorn --app-dir bench gateway_serve:app

Each ``NAME=URL`` is an external model whose only replica is URL
(``NAME=URL1|URL2|…`` for several replicas); no key is needed (loopback
listener, no keys_file). ``LLMGW_BENCH_ROUTING`` (JSON, optional) is the
``routing:`` block of every model, e.g. ``{"policy": "prefix-affinity",
"engine_metrics": true}``. The store is a throw-away SQLite file, or the
database ``LLMGW_BENCH_DATABASE`` names, opened in the ASGI lifespan.
``LLMGW_BENCH_LEDGER=0`` turns the usage ledger off; ``LLMGW_BENCH_LEDGER_INTERVAL``
sets how often it writes (``1h``: not during a run, to measure the request path alone);
``LLMGW_BENCH_JOURNAL`` is its journal directory (``gateway.journal_dir``;
``0``: no journal; unset: the default, beside the store's SQLite file).
``LLMGW_BENCH_KEY`` makes inference need that key: a runtime key of a team of its
own, created in the store at start, which has a daily token budget of
``LLMGW_BENCH_BUDGET`` (default: one no run reaches, so every request is checked
against it and none refused; ``none``: no budget).
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
from typing import Any

from llmgw.catalog.build import Catalog, build_catalog
from llmgw.catalog.decode import convert
from llmgw.catalog.model import Model
from llmgw.catalog.units import Duration
from llmgw.config import GatewayConfig, ServerConfig
from llmgw.gateway import Gateway
from llmgw.scheduler.base import BackendHealth, Fleet, Holding, ModelStatus, Replica, SameDisk
from llmgw.store import open_store
from llmgw.store.base import Store, StoredKey, StoredTeam
from llmgw.tenancy import Limits, encode_limits, hash_key


class StaticCatalog:
    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog


class NoScheduler(SameDisk):
    """A Backend with no scheduled model: the benchmark's model is external."""

    async def start(self) -> None: ...
    async def close(self) -> None: ...
    async def check_placement(self, model: Model, catalog: Catalog) -> None: ...
    async def apply(self, catalog: Catalog) -> None: ...
    async def set_demand(self, model: str, replicas: int) -> None: ...
    async def rollout(self, model: str) -> None: ...

    async def replicas(self, model: str | None = None) -> list[Replica]:
        return []

    async def holdings(self) -> list[Holding]:
        return []

    def status(self, model: str) -> ModelStatus:
        return ModelStatus()

    async def fleet(self) -> Fleet:
        return Fleet(nodes=[], pools=[])

    def health(self) -> BackendHealth:
        return BackendHealth(ok=True)

    def endpoints(self, model: str) -> list[str]:
        return []

    def profile_of(self, address: str) -> str | None:
        return None

    async def wait_changed(self, timeout: float) -> None: ...


async def _bench_key(gateway: Gateway, store: Store, key: str, budget: int | None) -> None:
    """The runtime key ``key`` of team ``bench`` with a daily budget (None: without one),
    followed before serving."""
    now = time.time()
    # Its own team and key name: gateways sharing one database each make theirs.
    team = f"bench-{hash_key(key)[:12]}"
    await store.put_team(StoredTeam(name=team, settings=encode_limits(
        Limits(tokens_per_day=budget)), created_by="bench", created_at=now), create=True)
    await store.put_key(StoredKey(name=f"{team}-key", team=team, sha256=hash_key(key),
                                  settings=b"{}", created_by="bench", created_at=now))
    deadline = now + 60
    while gateway.keys.lookup(key) is None:
        if time.time() > deadline:
            raise RuntimeError("the gateway did not follow the benchmark's key within 60 s")
        await asyncio.sleep(0.05)


def serving(gateway: Gateway, store: Store) -> Any:
    """``gateway`` as an ASGI app whose lifespan opens and closes it and ``store``."""
    key = os.environ.get("LLMGW_BENCH_KEY")
    budget_text = os.environ.get("LLMGW_BENCH_BUDGET", str(10**12))
    budget = None if budget_text == "none" else int(budget_text)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await store.open()
                    await gateway.start()
                    if key:
                        await _bench_key(gateway, store, key, budget)
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await gateway.close()
                    await store.close()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        await gateway(scope, receive, send)

    return app


def build() -> Any:
    spec = os.environ.get("LLMGW_BENCH_MODELS", "bench=http://127.0.0.1:18081")
    routing = json.loads(os.environ.get("LLMGW_BENCH_ROUTING", "{}"))
    models = [convert({"name": name, "upstream": urls.split("|"), "routing": routing}, Model)
              for name, _, urls in (item.partition("=") for item in spec.split(",") if item)]
    catalog = build_catalog(models)
    database = os.environ.get("LLMGW_BENCH_DATABASE")
    if database is None:
        state = tempfile.mkdtemp(prefix="llmgw-bench-")
        database = f"sqlite:///{state}/store.db"
    store = open_store(database)
    ledger = os.environ.get("LLMGW_BENCH_LEDGER", "1") != "0"
    interval = Duration.parse(os.environ.get("LLMGW_BENCH_LEDGER_INTERVAL", "1s"))
    journal = os.environ.get("LLMGW_BENCH_JOURNAL", "")
    config = ServerConfig(listen="127.0.0.1:0",
                          gateway=GatewayConfig(ledger=ledger, ledger_interval=interval,
                                                journal=journal != "0",
                                                journal_dir=journal or None))
    gateway = Gateway(config, StaticCatalog(catalog), NoScheduler(), store)
    return serving(gateway, store)


app = build()
