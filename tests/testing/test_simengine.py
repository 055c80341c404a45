"""The simulated engine answers like vLLM and models what routing depends on."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest

from llmgw.gateway.signals import parse_metrics
from llmgw.testing.simengine import SimEngine, SimSpec, render_chat

SYSTEM = {"role": "system", "content": "You answer questions about invoices. " * 60}


@pytest.fixture
async def sim() -> AsyncIterator[SimEngine]:
    engine = SimEngine(SimSpec(step_time=0.005, prefill_per_token=0.0002, max_seqs=2))
    await engine.start()
    yield engine
    await engine.stop()


async def chat(http: aiohttp.ClientSession, url: str, messages: list[dict[str, str]],
               **extra: object) -> dict[str, object]:
    async with http.post(f"{url}/v1/chat/completions",
                         json={"model": "sim", "messages": messages, **extra}) as r:
        assert r.status == 200
        result: dict[str, object] = await r.json()
        return result


async def test_a_repeated_prefix_is_served_from_the_cache_and_reported_in_usage(
        sim: SimEngine) -> None:
    """The second request sharing a prompt prefix reports it as cached and prefills faster."""
    # In the engine's modelled time: the wall time of a request is that plus however
    # long a busy machine takes to run the test's own event loop.
    async with aiohttp.ClientSession() as http:
        first = await chat(http, sim.url, [SYSTEM, {"role": "user", "content": "a"}],
                           max_tokens=1)
        cold = sim.busy_seconds
        second = await chat(http, sim.url, [SYSTEM, {"role": "user", "content": "b"}],
                            max_tokens=1)
        warm = sim.busy_seconds - cold
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # type: ignore[index]
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]  # type: ignore[index]
    assert cached >= 0.9 * second["usage"]["prompt_tokens"]  # type: ignore[index]
    assert warm < cold / 5


async def test_beyond_max_seqs_requests_wait_and_metrics_say_so(sim: SimEngine) -> None:
    """With two batch slots, a third request waits; /metrics reports it under vLLM's names."""
    async with aiohttp.ClientSession() as http:
        calls = [asyncio.create_task(chat(http, sim.url, [{"role": "user", "content": str(i)}],
                                          max_tokens=40)) for i in range(3)]
        deadline = time.monotonic() + 10
        while sim.waiting < 1:
            assert time.monotonic() < deadline, "no request waited"
            await asyncio.sleep(0.005)
        async with http.get(f"{sim.url}/metrics") as r:
            page = await r.read()
        await asyncio.gather(*calls)
    sample = parse_metrics(page)
    assert sample is not None
    assert (sample.running, sample.waiting) == (2, 1)
    assert b"vllm:prefix_cache_queries_total" in page


async def test_a_stream_ends_with_usage_when_asked_and_done(sim: SimEngine) -> None:
    """SSE chunks in OpenAI's shape, a usage chunk with include_usage, then [DONE]."""
    async with aiohttp.ClientSession() as http, http.post(
            f"{sim.url}/v1/chat/completions",
            json={"model": "sim", "messages": [{"role": "user", "content": "hi"}],
                  "max_tokens": 5, "stream": True,
                  "stream_options": {"include_usage": True}}) as r:
        body = (await r.read()).decode()
    events = [e for e in body.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    assert '"usage"' in events[-2]
    assert '"completion_tokens": 5' in events[-2]


async def test_render_endpoints_give_token_ids_like_vllm(sim: SimEngine) -> None:
    """Chat render answers an object with token_ids; completion render a list of them."""
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{sim.url}/v1/chat/completions/render",
                             json={"model": "sim", "messages": [SYSTEM]}) as r:
            chat_ids = (await r.json())["token_ids"]
        async with http.post(f"{sim.url}/v1/completions/render",
                             json={"model": "sim", "prompt": "once upon a time"}) as r:
            rendered = await r.json()
    assert len(chat_ids) == sim.tokens_of(render_chat([SYSTEM]))
    assert isinstance(rendered, list)
    assert rendered[0]["token_ids"] == sim._token_ids(b"once upon a time")
