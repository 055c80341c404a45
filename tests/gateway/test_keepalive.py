"""Streaming requests held for a replica get SSE comments so nothing times them out."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from tests.gateway.conftest import GatewayFactory, GatewayHandle, chat_model, wait_for
from tests.gateway.doubles import FakeBackend
from tests.gateway.engine import FakeEngine
from tests.gateway.test_ondemand import scheduler_for

COMMENT = ": waiting for a replica of m"


class Reader:
    """Reads one streaming response line by line in the background."""

    def __init__(self, gw: GatewayHandle, **body: Any) -> None:
        self.lines: list[str] = []
        self.status: int | None = None
        self.content_type = ""
        self.task = asyncio.create_task(self._read(gw, body))

    async def _read(self, gw: GatewayHandle, body: dict[str, Any]) -> None:
        payload = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **body}
        async with gw.client.stream("POST", "/v1/chat/completions", json=payload) as r:
            self.status = r.status_code
            self.content_type = r.headers.get("content-type", "")
            async for line in r.aiter_lines():
                self.lines.append(line)

    def comments(self) -> int:
        return self.lines.count(COMMENT)


async def test_a_stream_held_for_a_cold_start_gets_comments_then_its_answer(
        make_gateway: GatewayFactory) -> None:
    """While an on-demand model loads, a streaming request receives `: waiting for a replica
    of m` lines, then the stream of the replica that came up."""
    backend = FakeBackend()
    started: list[FakeEngine] = []
    loaded = asyncio.Event()
    backend.on_demand = scheduler_for(backend, started, loaded)  # type: ignore[assignment]
    gw = await make_gateway([chat_model("m", scaling={"min": 0, "wait": "30s"})],
                            backend=backend, keepalive_interval="50ms")
    try:
        reader = Reader(gw, stream=True)
        await wait_for(lambda: reader.comments() >= 3 or reader.task.done(),
                       what="three comments")
        assert reader.status == 200
        assert reader.content_type.startswith("text/event-stream")
        loaded.set()
        await reader.task
        data = [line for line in reader.lines if line.startswith("data: ")]
        assert "tok0" in data[0]
        assert data[-1] == "data: [DONE]"
    finally:
        for engine in started:
            await engine.stop()


async def test_the_openai_client_reads_a_held_stream_as_if_nothing_happened(
        make_gateway: GatewayFactory) -> None:
    """Clients ignore SSE comments: the official client gets the chunks and nothing else."""
    backend = FakeBackend()
    started: list[FakeEngine] = []
    loaded = asyncio.Event()
    backend.on_demand = scheduler_for(backend, started, loaded)  # type: ignore[assignment]
    gw = await make_gateway([chat_model("m", scaling={"min": 0, "wait": "30s"})],
                            backend=backend, keepalive_interval="50ms")
    try:
        async def read() -> list[str]:
            stream = await gw.openai().chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], stream=True)
            return [chunk.choices[0].delta.content or "" async for chunk in stream
                    if chunk.choices]

        task = asyncio.create_task(read())
        await wait_for(lambda: gw.gateway.ondemand.in_flight.get("m") == 1, what="the hold")
        # A raw reader held beside it shows when comments have been flowing to both.
        raw = Reader(gw, stream=True)
        await wait_for(lambda: raw.comments() >= 2, what="comments to flow")
        loaded.set()
        assert "".join(await task).startswith("tok0")
        await raw.task
    finally:
        for engine in started:
            await engine.stop()


async def test_a_held_stream_that_waits_too_long_ends_with_an_error_event(
        make_gateway: GatewayFactory, engines) -> None:
    """The queue's limit, reached after the head went out, is the stream's error event and
    is counted as a 429."""
    busy = await engines("busy")
    busy.gate = asyncio.Event()   # holds its stream after the first chunk
    gw = await make_gateway([chat_model("m", upstream=[busy.url], routing={
        "policy": "least-outstanding", "max_concurrency": 1, "queue_wait": "600ms"})],
        keepalive_interval="50ms")
    first = Reader(gw, stream=True)
    await wait_for(lambda: bool(first.lines), what="the first stream to start")
    held = Reader(gw, stream=True)
    await held.task
    busy.gate.set()
    await first.task
    assert held.status == 200
    assert held.comments() >= 1
    error = json.loads(next(line for line in held.lines if line.startswith("data: "))[6:])
    assert error["error"]["code"] == "model_overloaded"
    metrics = (await gw.client.get("/metrics")).text
    assert 'llmgw_gateway_requests_total{model="m",status="429"} 1.0' in metrics


async def test_requests_that_are_not_streams_or_not_held_get_no_comment(
        make_gateway: GatewayFactory, engines) -> None:
    """A JSON answer is never turned into a stream, and a stream forwarded at once has no
    comment: only holding is announced."""
    engine = await engines("e")
    gw = await make_gateway([chat_model("m", upstream=[engine.url])],
                            keepalive_interval="50ms")
    streamed = await gw.chat("m", stream=True)
    assert ": waiting" not in streamed.text
    plain = await gw.chat("m")
    assert plain.headers["content-type"].startswith("application/json")
    assert isinstance(plain.json(), dict)


async def test_a_held_responses_stream_keeps_its_responses_events(
        make_gateway: GatewayFactory) -> None:
    """A Responses API stream held for a cold start is translated as ever (no comment is
    put in front of it, which would hide the replica's head from the translation)."""
    backend = FakeBackend()
    started: list[FakeEngine] = []
    loaded = asyncio.Event()
    backend.on_demand = scheduler_for(backend, started, loaded)  # type: ignore[assignment]
    gw = await make_gateway([chat_model("m", scaling={"min": 0, "wait": "30s"})],
                            backend=backend, keepalive_interval="50ms")
    try:
        async def ask() -> str:
            r = await gw.client.post("/v1/responses", json={
                "model": "m", "input": "hi", "stream": True})
            assert r.status_code == 200
            return r.text

        task = asyncio.create_task(ask())
        raw = Reader(gw, stream=True)      # held beside it: comments flow meanwhile
        await wait_for(lambda: raw.comments() >= 2, what="comments to flow")
        loaded.set()
        text = await task
        await raw.task
        assert "response.created" in text
        assert COMMENT not in text
    finally:
        for engine in started:
            await engine.stop()
