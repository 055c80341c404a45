"""The simulated engine serves LoRA adapters as vLLM does, and the Zipf trace is skewed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from llmgw.testing.adaptertrace import adapter_names, make_trace, popularity, zipf_weights
from llmgw.testing.simengine import SimEngine, SimSpec

FAST = {"step_time": 0.002, "prefill_per_token": 0.00001}


@pytest.fixture
async def sim() -> AsyncIterator[SimEngine]:
    engine = SimEngine(SimSpec(**FAST, lora_slots=2, lora_cpu_slots=2,  # type: ignore[arg-type]
                               lora_load_time=0.05, lora_check_paths=False), name="base")
    await engine.start()
    yield engine
    await engine.stop()


async def post(http: aiohttp.ClientSession, url: str, path: str,
               body: dict[str, object]) -> tuple[int, str]:
    async with http.post(f"{url}{path}", json=body) as r:
        return r.status, await r.text()


async def ask(http: aiohttp.ClientSession, url: str, model: str) -> int:
    status, _ = await post(http, url, "/v1/chat/completions", {
        "model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    return status


async def test_load_and_unload_answer_as_vllm_does(sim: SimEngine) -> None:
    """200 with a success line; 400 for a second load; 404 unloading an unknown name."""
    async with aiohttp.ClientSession() as http:
        status, text = await post(http, sim.url, "/v1/load_lora_adapter",
                                  {"lora_name": "sql", "lora_path": "/a/sql"})
        assert status == 200
        assert "added successfully" in text
        status, text = await post(http, sim.url, "/v1/load_lora_adapter",
                                  {"lora_name": "sql", "lora_path": "/a/sql"})
        assert status == 400
        assert "has already been loaded" in text
        async with http.get(f"{sim.url}/v1/models") as r:
            cards = (await r.json())["data"]
        assert {"id": "sql", "object": "model", "created": 0, "owned_by": "vllm",
                "root": "/a/sql", "parent": "base"} in cards
        status, _ = await post(http, sim.url, "/v1/unload_lora_adapter", {"lora_name": "sql"})
        assert status == 200
        status, text = await post(http, sim.url, "/v1/unload_lora_adapter",
                                  {"lora_name": "sql"})
        assert status == 404
        assert "cannot be found" in text


async def test_a_request_for_an_adapter_not_loaded_is_refused(sim: SimEngine) -> None:
    """404 naming the model, never an answer from the base."""
    async with aiohttp.ClientSession() as http:
        assert await ask(http, sim.url, "sql") == 404
        assert await ask(http, sim.url, "base") == 200
        await post(http, sim.url, "/v1/load_lora_adapter",
                   {"lora_name": "sql", "lora_path": "/a/sql"})
        assert await ask(http, sim.url, "sql") == 200


async def test_a_path_without_adapter_config_is_not_found(tmp_path: Path) -> None:
    """With paths checked, a directory lacking adapter_config.json is refused with 404."""
    engine = SimEngine(SimSpec(lora_slots=1), name="base")
    await engine.start()
    try:
        (tmp_path / "good").mkdir()
        (tmp_path / "good" / "adapter_config.json").write_text('{"r": 8}')
        async with aiohttp.ClientSession() as http:
            bad, _ = await post(http, engine.url, "/v1/load_lora_adapter",
                                {"lora_name": "x", "lora_path": str(tmp_path)})
            good, _ = await post(http, engine.url, "/v1/load_lora_adapter",
                                 {"lora_name": "y", "lora_path": str(tmp_path / "good")})
        assert (bad, good) == (404, 200)
    finally:
        await engine.stop()


async def test_the_host_cache_evicts_the_least_recently_used_and_reloads_from_disk(
        sim: SimEngine) -> None:
    """Three adapters in two places: the oldest is read from disk again when asked for."""
    async with aiohttp.ClientSession() as http:
        for name in ("a", "b", "c"):
            await post(http, sim.url, "/v1/load_lora_adapter",
                       {"lora_name": name, "lora_path": f"/x/{name}"})
        assert sim.lora.in_memory() == ["b", "c"]
        assert sim.lora.disk_loads == 3
        assert await ask(http, sim.url, "a") == 200
        assert sim.lora.disk_loads == 4
        assert sim.lora.in_memory() == ["c", "a"]


async def test_the_metric_names_running_and_waiting_adapters(sim: SimEngine) -> None:
    """With two slots busy, a third adapter's request waits and the gauge says so."""
    sim.freeze()
    async with aiohttp.ClientSession() as http:
        for name in ("a", "b", "c"):
            await post(http, sim.url, "/v1/load_lora_adapter",
                       {"lora_name": name, "lora_path": f"/x/{name}"})
        tasks = [asyncio.create_task(ask(http, sim.url, n)) for n in ("a", "b", "c")]
        async with asyncio.timeout(10):
            while sum(sim.lora.waiting.values()) < 1 or sum(sim.lora.running.values()) < 2:
                await asyncio.sleep(0.01)
        async with http.get(f"{sim.url}/metrics") as r:
            page = await r.text()
        assert 'running_lora_adapters="a,b",waiting_lora_adapters="c"' in page
        assert 'max_lora="2"' in page
        sim.thaw()
        assert await asyncio.gather(*tasks) == [200, 200, 200]


def test_the_trace_is_zipf_skewed_and_deterministic() -> None:
    """The most popular of 40 adapters gets many times the median's requests."""
    names = adapter_names(40)
    weights = zipf_weights(40, 1.1)
    assert weights[0] / weights[9] == pytest.approx(10 ** 1.1)
    trace = make_trace(7, adapters=names, rate=20, duration=60)
    assert trace == make_trace(7, adapters=names, rate=20, duration=60)
    counts = list(popularity(trace).values())
    assert counts[0] > 5 * counts[len(counts) // 2]
    assert all(s.start < 60 for s in trace)
