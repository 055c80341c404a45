"""A token budget shared by several gateway processes on one Postgres is never passed
when every request states max_tokens; cut off from Postgres, a budget refuses once its
slice lapses."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from llmgw.catalog.decode import convert
from llmgw.catalog.model import Model
from llmgw.config import GatewayConfig, ServerConfig
from llmgw.gateway import Gateway
from llmgw.store.postgres import PostgresStore
from llmgw.tenancy import Limits
from llmgw.testing.simengine import SimEngine, SimSpec
from llmgw.testing.tcpproxy import through
from tests.gateway.conftest import serve
from tests.gateway.doubles import CatalogHolder, FakeBackend
from tests.gateway.test_tenants import make_key, make_team, until
from tests.store.conftest import FreezingProxy, fresh_schema

ROOT = Path(__file__).resolve().parents[2]
BUDGET = 12_000
CLIENTS = 48
MAX_TOKENS = 16
INSTANCES = 3


@asynccontextmanager
async def gateways(url: str, engine: str, tmp_path: Path, n: int, gateway: str = "{}"
                   ) -> AsyncIterator[list[tuple[str, asyncio.subprocess.Process]]]:
    """``n`` gateway processes on the store at ``url``, serving model m from ``engine``:
    each one's URL and process."""
    models = json.dumps([{"name": "m", "upstream": [engine], "health": {"path": None},
                          "routing": {"policy": "least-outstanding"}}])
    procs = [await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.gateway.gateway_process", "--database", url,
        "--dir", str(tmp_path), "--models", models, "--gateway", gateway, cwd=ROOT,
        stdout=asyncio.subprocess.PIPE) for _ in range(n)]
    try:
        urls = []
        for proc in procs:
            assert proc.stdout is not None
            urls.append((await asyncio.wait_for(proc.stdout.readline(), 120)).decode().strip())
        yield list(zip(urls, procs, strict=True))
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
            await proc.wait()


async def client(url: str, key: str, stream: bool) -> int:
    """Send requests one after another until the budget refuses one; how many were answered."""
    body = {"model": "m", "max_tokens": MAX_TOKENS, "stream": stream,
            "messages": [{"role": "user", "content": "count to sixteen"}]}
    answered = 0
    deadline = time.monotonic() + 300
    async with httpx.AsyncClient(base_url=url, timeout=120,
                                 headers={"Authorization": f"Bearer {key}"}) as http:
        while time.monotonic() < deadline:
            r = await http.post("/v1/chat/completions", json=body)
            if r.status_code == 200:
                answered += 1
                continue
            code = r.json()["error"]["code"]
            if code == "insufficient_quota":
                return answered
            assert code in {"invalid_api_key", "budget_refilling"}, r.text
            await asyncio.sleep(0.1)
    raise AssertionError("the budget never refused this client")


@pytest.mark.postgres
async def test_several_instances_never_serve_past_the_budget(
        postgres_url: str, tmp_path: Path) -> None:
    """Three gateway processes, 48 concurrent clients (streaming and not) with max_tokens,
    one 12,000-token daily budget: the tokens the engine served stay within it (and come
    near it, so the bound is not met by refusing everything)."""
    engine = SimEngine(SimSpec(max_seqs=64, step_time=0.005, default_max_tokens=MAX_TOKENS))
    engine_url = await engine.start()
    try:
        async with fresh_schema(postgres_url) as url:
            store = PostgresStore(url)
            await store.open()
            try:
                await make_team(store, "burst", Limits(tokens_per_day=BUDGET))
                key = await make_key(store, "burst-key", "burst")
            finally:
                await store.close()
            async with gateways(url, engine_url, tmp_path, INSTANCES) as served_by:
                urls = [u for u, _ in served_by]
                answered = await asyncio.gather(*(
                    client(urls[i % INSTANCES], key, stream=i % 2 == 0)
                    for i in range(CLIENTS)))
        served = engine.prompt_total + engine.generated_total
        assert sum(answered) > 0
        assert served <= BUDGET, f"served {served} tokens on a budget of {BUDGET}"
        assert served > BUDGET // 2, f"served only {served} tokens of {BUDGET}"
    finally:
        await engine.stop()


@pytest.mark.postgres
async def test_a_gateway_cut_off_from_the_store_refuses_once_its_lease_lapses(
        postgres_url: str) -> None:
    """Postgres stops answering: the gateway serves from its slice while its lease has time
    left, then refuses the budget (503 budget_unavailable, counted); once the store answers
    again it serves again."""
    engine = SimEngine(SimSpec(step_time=0.001, default_max_tokens=MAX_TOKENS))
    engine_url = await engine.start()
    async with fresh_schema(postgres_url) as url:
        parts = urlsplit(url)
        proxy = FreezingProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
        await proxy.start()
        store = PostgresStore(through(url, proxy.port), query_timeout=2.0)
        await store.open()
        models = [convert({"name": "m", "upstream": [engine_url], "health": {"path": None}},
                          Model)]
        gateway = Gateway(ServerConfig(listen="127.0.0.1:0", gateway=convert(
            {"budget_lease_ttl": "10s", "budget_interval": "100ms"}, GatewayConfig)),
            CatalogHolder(models), FakeBackend(), store)
        try:
            await make_team(store, "ml", Limits(tokens_per_day=1_000_000))
            key = await make_key(store, "k", "ml")
            await gateway.start()
            async with serve(gateway) as base, httpx.AsyncClient(
                    base_url=base, timeout=60,
                    headers={"Authorization": f"Bearer {key}"}) as http:
                body = {"model": "m", "max_tokens": MAX_TOKENS,
                        "messages": [{"role": "user", "content": "hi"}]}

                async def answered() -> bool:
                    return (await http.post("/v1/chat/completions", json=body)).status_code \
                        == 200

                await until(answered, "the key to be served")
                proxy.freeze()
                assert await answered()               # the lease still has time left

                async def refused() -> bool:
                    r = await http.post("/v1/chat/completions", json=body)
                    return r.status_code == 503 and \
                        r.json()["error"]["code"] == "budget_unavailable"

                await until(refused, "the lapsed slice to refuse", timeout=60)
                metrics = (await http.get("/metrics")).text
                assert 'llmgw_gateway_budget_unchecked_requests_total{budget="tokens_per_day",' \
                    'outcome="refused",team="ml"}' in metrics

                async def failure_counted() -> bool:
                    return 'llmgw_gateway_budget_slice_renewals_total{outcome="failed"}' in \
                        (await http.get("/metrics")).text

                await until(failure_counted, "the failed renewal to be counted", timeout=60)
                proxy.thaw()
                await until(answered, "the budget to be served again", timeout=60)
        finally:
            proxy.thaw()
            await gateway.close()
            await store.close()
            await proxy.close()
            await engine.stop()


@pytest.mark.postgres
async def test_the_slice_of_a_killed_gateway_comes_back_when_its_lease_expires(
        postgres_url: str, tmp_path: Path) -> None:
    """A gateway SIGKILLed holding a slice: another refuses what that slice holds until the
    lease expires, then serves it."""
    engine = SimEngine(SimSpec(step_time=0.001, default_max_tokens=MAX_TOKENS))
    engine_url = await engine.start()
    settings = json.dumps({"budget_lease_ttl": "3s", "budget_interval": "100ms"})
    body = {"model": "m", "max_tokens": MAX_TOKENS,
            "messages": [{"role": "user", "content": "hi"}]}
    try:
        async with fresh_schema(postgres_url) as url:
            store = PostgresStore(url)
            await store.open()
            try:
                await make_team(store, "ml", Limits(tokens_per_day=1_200))
                key = await make_key(store, "k", "ml")
            finally:
                await store.close()
            async with gateways(url, engine_url, tmp_path, 2, settings) as served_by, \
                    httpx.AsyncClient(timeout=60,
                                      headers={"Authorization": f"Bearer {key}"}) as http:
                (doomed, proc), (survivor, _) = served_by

                async def status(base: str) -> int:
                    r = await http.post(f"{base}/v1/chat/completions", json=body)
                    return r.status_code

                async def doomed_serves() -> bool:
                    return await status(doomed) == 200

                # Concurrent requests make the doomed gateway take a large slice.
                await until(doomed_serves, "the first gateway to serve the key")
                await asyncio.gather(*(status(doomed) for _ in range(8)))
                proc.kill()
                await proc.wait()

                async def survivor_refused() -> bool:
                    return await status(survivor) == 429

                await until(survivor_refused, "the survivor to run out of room", timeout=120)
                assert engine.prompt_total + engine.generated_total < 1_200 - 200

                async def survivor_serves() -> bool:
                    return await status(survivor) == 200

                await until(survivor_serves, "the dead gateway's slice to come back",
                            timeout=120)
    finally:
        await engine.stop()
