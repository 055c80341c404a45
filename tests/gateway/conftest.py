"""Fixtures for the gateway: fake engines on loopback, and a real gateway served by uvicorn."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from llmgw.catalog.decode import convert
from llmgw.catalog.model import GpuClass, Model
from llmgw.config import GatewayConfig, ServerConfig
from llmgw.gateway import Gateway
from llmgw.store.sqlite import SqliteStore
from llmgw.testing.serving import serve
from tests.gateway.doubles import CatalogHolder, FakeBackend
from tests.gateway.engine import FakeEngine


async def wait_for(condition: Callable[[], bool], timeout: float = 30.0,
                   what: str = "condition") -> None:
    """Poll ``condition`` until true; fail with ``what`` after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def chat_model(name: str, upstream: list[str] | None = None, **kw: Any) -> Model:
    """An external model (upstream URLs) or, without upstream, a scheduled CPU model.

    Not health-probed unless ``health`` says so; routed least-outstanding
    unless ``routing`` says otherwise: the tests of
    retries and ejection count which replica each request reaches, and
    prefix affinity would send their identical prompts to one replica whose
    place on the ring depends on the port it happened to get.
    """
    kw.setdefault("routing", {"policy": "least-outstanding"})
    if upstream is not None:
        # Without active probes unless a test asks for them: the tests of
        # retries and ejection count what failing requests do, and a probe
        # would take a dead replica out before any request reached it.
        kw.setdefault("health", {"path": None})
        return convert({"name": name, "upstream": upstream, **kw}, Model)
    return convert({
        "name": name, "source": "/models/x.gguf", "engine": "llama.cpp",
        "profiles": [{"name": "cpu", "cpu_cores": 1, "memory": "1GiB"}], **kw,
    }, Model)


@dataclass
class GatewayHandle:
    url: str
    gateway: Gateway
    backend: FakeBackend
    catalogs: CatalogHolder
    store: SqliteStore
    client: httpx.AsyncClient = field(repr=False)
    stack: contextlib.AsyncExitStack = field(repr=False)

    def openai(self, key: str = "unused") -> openai.AsyncOpenAI:
        """The official client for this gateway, closed when the test ends."""
        client = openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0)
        self.stack.push_async_callback(client.close)
        return client

    async def chat(self, model: str, *, key: str | None = None, stream: bool = False,
                   **extra: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}],
                "stream": stream, **extra}
        return await self.client.post("/v1/chat/completions", json=body, headers=headers)


GatewayFactory = Callable[..., Awaitable[GatewayHandle]]


@pytest.fixture
async def engines() -> AsyncIterator[Callable[..., Awaitable[FakeEngine]]]:
    started: list[FakeEngine] = []

    async def start(name: str = "engine") -> FakeEngine:
        engine = FakeEngine(name)
        await engine.start()
        started.append(engine)
        return engine

    yield start
    for engine in started:
        await engine.stop()


@pytest.fixture
async def make_gateway(tmp_path: Path) -> AsyncIterator[GatewayFactory]:
    stack = contextlib.AsyncExitStack()

    async def make(models: list[Model], *, backend: FakeBackend | None = None,
                   keys_file: Path | None = None, listen: str = "127.0.0.1:8080",
                   gpu_classes: Mapping[str, GpuClass] | None = None,
                   **gateway: Any) -> GatewayHandle:
        store = SqliteStore(f"sqlite:///{tmp_path / 'store.db'}")
        await store.open()
        stack.push_async_callback(store.close)
        gw_config = convert({"eject_for": "30s", **gateway}, GatewayConfig)
        config = ServerConfig(listen=listen, keys_file=str(keys_file) if keys_file else None,
                              gateway=gw_config)
        catalogs = CatalogHolder(models, gpu_classes)
        backend = backend or FakeBackend()
        gw = Gateway(config, catalogs, backend, store)
        await gw.start()
        stack.push_async_callback(gw.close)
        url = await stack.enter_async_context(serve(gw))
        client = await stack.enter_async_context(
            httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(60.0)))
        return GatewayHandle(url=url, gateway=gw, backend=backend, catalogs=catalogs,
                             store=store, client=client, stack=stack)

    yield make
    await stack.aclose()
