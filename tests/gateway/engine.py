"""A small OpenAI-shaped engine on loopback, for the gateway's tests.

It answers chat completions, completions and embeddings like vLLM or
llama.cpp's server would (same JSON and SSE shapes), and can be told to
misbehave: answer with an error status, hold its answer, stream slowly or
only when a gate opens, cut a stream after some chunks, or die. It records
every request's body and headers, and every request that was cancelled
under it (the client went away), which is how tests see that a client
disconnect reached the engine.

Run in the test's event loop (``FakeEngine``), or as a separate process
(``python -m tests.gateway.engine``) when a test must kill it with SIGKILL.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from aiohttp import web


class FakeEngine:
    def __init__(self, name: str = "engine") -> None:
        self.name = name
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []   # per request, names lower-cased
        self.paths: list[str] = []
        self.fail_status: int | None = None     # answer every request with this status
        self.fail_times = 0                     # ... only this many times (0: always)
        self.response_delay = 0.0               # before answering (headers included)
        self.hang = False                       # never answer
        self.headers_then_die = False           # send 200 headers, then close before a chunk
        self.chunks = 3
        self.chunk_padding = 0                  # extra bytes of content in each stream chunk
        self.chunk_delay = 0.0
        self.first_chunk_delay = 0.0            # after the headers, before the first chunk
        self.gate: asyncio.Event | None = None  # stream: wait for this after the first chunk
        self.die_after_chunks: int | None = None
        self.in_flight = 0
        self.finished = 0
        self.cancelled = 0
        self.cancel_seen = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.url = ""

    # ------------------------------------------------------------ lifecycle

    async def start(self, port: int = 0) -> str:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._handle)
        app.router.add_post("/v1/completions", self._handle)
        app.router.add_post("/v1/embeddings", self._handle)
        app.router.add_get("/health", self._health)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None,
                                     shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        sock = site._server.sockets[0]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # ------------------------------------------------------------ handlers

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        self.headers.append({k.lower(): v for k, v in request.headers.items()})
        self.paths.append(request.path)
        self.in_flight += 1
        try:
            response = await self._answer(request, body)
            self.finished += 1
            return response
        except (asyncio.CancelledError, ConnectionResetError):
            self.cancelled += 1
            self.cancel_seen.set()
            raise
        finally:
            self.in_flight -= 1

    async def _answer(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        if self.hang:
            await asyncio.Event().wait()
        if self.response_delay:
            await asyncio.sleep(self.response_delay)
        if self.fail_status is not None:
            status = self.fail_status
            if self.fail_times > 0:
                self.fail_times -= 1
                if self.fail_times == 0:
                    self.fail_status = None
            return web.json_response(
                {"error": {"message": f"{self.name} failed on cue", "type": "server_error",
                           "code": None, "param": None}}, status=status)
        model = body.get("model", "")
        if request.path == "/v1/embeddings":
            inputs = body.get("input", "")
            items = inputs if isinstance(inputs, list) else [inputs]
            return web.json_response({
                "object": "list", "model": model,
                "data": [{"object": "embedding", "index": i, "embedding": [0.25, -0.5, 1.0]}
                         for i, _ in enumerate(items)],
                "usage": {"prompt_tokens": 2 * len(items), "total_tokens": 2 * len(items)},
            })
        if body.get("stream"):
            return await self._stream(request, body, model)
        usage = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
        text = f"hello from {self.name}"
        if request.path == "/v1/completions":
            return web.json_response({
                "id": "cmpl-1", "object": "text_completion", "created": 1, "model": model,
                "choices": [{"index": 0, "text": text, "finish_reason": "stop",
                             "logprobs": None}], "usage": usage})
        return web.json_response({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": "stop"}], "usage": usage})

    def _chunk(self, path: str, model: str, i: int) -> dict[str, Any]:
        if path == "/v1/completions":
            return {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": model,
                    "choices": [{"index": 0, "text": f"tok{i} ", "finish_reason": None,
                                 "logprobs": None}]}
        return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
                "model": model, "choices": [{"index": 0, "delta": {"content": f"tok{i} "},
                                             "finish_reason": None}]}

    async def _stream(self, request: web.Request, body: dict[str, Any],
                      model: str) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if self.headers_then_die:
            assert request.transport is not None
            request.transport.close()
            return response
        if self.first_chunk_delay:
            await asyncio.sleep(self.first_chunk_delay)
        for i in range(self.chunks):
            if self.die_after_chunks is not None and i == self.die_after_chunks:
                assert request.transport is not None
                request.transport.close()
                return response
            if i == 1 and self.gate is not None:
                await self.gate.wait()
            if self.chunk_delay:
                await asyncio.sleep(self.chunk_delay)
            chunk = self._chunk(request.path, model, i)
            if self.chunk_padding:
                chunk["padding"] = "x" * self.chunk_padding
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        options = body.get("stream_options") or {}
        if options.get("include_usage"):
            final = self._chunk(request.path, model, self.chunks)
            final["choices"] = []
            final["usage"] = {"prompt_tokens": 7, "completion_tokens": self.chunks,
                              "total_tokens": 7 + self.chunks}
            await response.write(f"data: {json.dumps(final)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


async def _main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", default="engine")
    parser.add_argument("--delay", type=float, default=0.0)
    args = parser.parse_args()
    engine = FakeEngine(args.name)
    engine.response_delay = args.delay
    url = await engine.start()
    print(url, flush=True)
    started = time.monotonic()
    while time.monotonic() - started < 600:  # a leaked process ends by itself
        await asyncio.sleep(1)


if __name__ == "__main__":
    asyncio.run(_main())
    sys.exit(0)
