"""A small OpenAI-shaped engine on loopback, for the gateway's tests.

It answers chat completions, completions and embeddings like vLLM or
llama.cpp's server would (same JSON and SSE shapes), and, like vLLM with the
matching model loaded, the Responses API, rerank, score, transcription and
translation (multipart uploads, whose fields and file it records) and
speech (a binary body sent in pieces). A test may set ``reply`` to answer a
request its own way, or ``chat_chunks`` to choose a chat stream's events.
It can be told to misbehave: answer with an error status, hold its answer, stream slowly or
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
import hashlib
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web


class FakeEngine:
    def __init__(self, name: str = "engine") -> None:
        self.name = name
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []   # per request, names lower-cased
        self.paths: list[str] = []
        self.fail_status: int | None = None     # answer every request with this status
        self.health_status = 200                # what GET /health answers
        self.health_checks = 0
        self.fail_times = 0                     # ... only this many times (0: always)
        # With fail_status: the body and content type to answer with, as an engine of
        # its own dialect would (vLLM's integer code, FastAPI's detail, plain text).
        self.fail_body: tuple[bytes, str] | None = None
        self.response_delay = 0.0               # before answering (headers included)
        self.hold: asyncio.Event | None = None  # before answering: wait for this
        self.hang = False                       # never answer
        self.headers_then_die = False           # send 200 headers, then close before a chunk
        self.chunks = 3
        self.chunk_padding = 0                  # extra bytes of content in each stream chunk
        self.chunk_delay = 0.0
        self.first_chunk_delay = 0.0            # after the headers, before the first chunk
        self.gate: asyncio.Event | None = None  # stream: wait for this after the first chunk
        self.die_after_chunks: int | None = None
        self.uploads: list[dict[str, Any]] = []   # per multipart request: fields, file digest
        self.reply: Callable[[str, dict[str, Any]], dict[str, Any] | None] | None = None
        self.chat_chunks: list[dict[str, Any]] | None = None
        self.speech = b"ID3" + bytes(range(256)) * 64    # what /v1/audio/speech returns
        self.in_flight = 0
        self.peak_in_flight = 0                 # the most requests it has held at once
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
        for path in ("/v1/responses", "/v1/rerank", "/v1/score", "/v1/audio/speech"):
            app.router.add_post(path, self._handle)
        app.router.add_post("/v1/audio/transcriptions", self._upload)
        app.router.add_post("/v1/audio/translations", self._upload)
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
        self.health_checks += 1
        return web.json_response({"status": "ok" if self.health_status == 200 else "down"},
                                 status=self.health_status)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        self.headers.append({k.lower(): v for k, v in request.headers.items()})
        self.paths.append(request.path)
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            try:
                response = await self._answer(request, body)
            except (AttributeError, KeyError, TypeError, ValueError) as exc:
                # A body of the wrong shape: refused as an engine validating it would.
                response = web.json_response(
                    {"error": {"message": f"invalid request: {exc!r}", "type": "BadRequestError",
                               "param": None, "code": 400}}, status=400)
            self.finished += 1
            return response
        except (asyncio.CancelledError, ConnectionResetError):
            self.cancelled += 1
            self.cancel_seen.set()
            raise
        finally:
            self.in_flight -= 1

    async def _upload(self, request: web.Request) -> web.StreamResponse:
        """A multipart transcription/translation: records each field and the file's digest."""
        self.paths.append(request.path)
        self.headers.append({k.lower(): v for k, v in request.headers.items()})
        fields: dict[str, Any] = {}
        reader = await request.multipart()
        async for part in reader:
            if part.filename is not None:
                data = await part.read()
                fields[part.name or ""] = {"filename": part.filename, "bytes": len(data),
                                           "sha256": hashlib.sha256(data).hexdigest(),
                                           "content_type": part.headers.get("Content-Type")}
            else:
                fields[part.name or ""] = (await part.read()).decode()
        self.uploads.append(fields)
        if self.fail_status is not None:
            return await self._answer(request, fields)
        text = f"{request.path.rsplit('/', 1)[-1]} by {self.name}"
        if fields.get("response_format") == "text":
            return web.Response(text=text, content_type="text/plain")
        return web.json_response({"text": text})

    async def _answer(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        if self.hang:
            await asyncio.Event().wait()
        if self.hold is not None:
            await self.hold.wait()
        if self.response_delay:
            await asyncio.sleep(self.response_delay)
        if self.fail_status is not None:
            status = self.fail_status
            if self.fail_times > 0:
                self.fail_times -= 1
                if self.fail_times == 0:
                    self.fail_status = None
            if self.fail_body is not None:
                data, ctype = self.fail_body
                return web.Response(body=data, status=status, content_type=ctype)
            return web.json_response(
                {"error": {"message": f"{self.name} failed on cue", "type": "server_error",
                           "code": None, "param": None}}, status=status)
        model = body.get("model", "")
        if self.reply is not None:
            custom = self.reply(request.path, body)
            if custom is not None:
                return web.json_response(custom)
        if request.path == "/v1/responses":
            return await self._responses(request, body, model)
        if request.path == "/v1/rerank":
            docs = body.get("documents", [])
            results = [{"index": i, "document": {"text": d}, "relevance_score": 1.0 / (i + 1)}
                       for i, d in enumerate(docs)][:body.get("top_n") or len(docs)]
            return web.json_response({"id": "rerank-1", "model": model, "results": results,
                                      "usage": {"total_tokens": 10}})
        if request.path == "/v1/score":
            return web.json_response({"id": "score-1", "object": "list", "model": model,
                                      "data": [{"index": 0, "object": "score", "score": 0.5}],
                                      "usage": {"prompt_tokens": 4, "total_tokens": 4}})
        if request.path == "/v1/audio/speech":
            response = web.StreamResponse(headers={"Content-Type": "audio/mpeg"})
            await response.prepare(request)
            for i in range(0, len(self.speech), 4096):
                await response.write(self.speech[i:i + 4096])
                if self.chunk_delay:
                    await asyncio.sleep(self.chunk_delay)
            await response.write_eof()
            return response
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
        n = body.get("n") or 1
        if request.path == "/v1/completions":
            return web.json_response({
                "id": "cmpl-1", "object": "text_completion", "created": 1, "model": model,
                "choices": [{"index": i, "text": text, "finish_reason": "stop",
                             "logprobs": None} for i in range(n)], "usage": usage})
        logprobs = None
        if body.get("logprobs"):
            top = body.get("top_logprobs") or 0
            # OpenAI's shape: vLLM leaves out "refusal", which OpenAI's schema requires.
            logprobs = {"content": [{"token": w, "logprob": -0.5, "bytes": list(w.encode()),
                                     "top_logprobs": [{"token": w, "logprob": -0.5,
                                                       "bytes": list(w.encode())}] * top}
                                    for w in text.split()],
                        "refusal": None}
        return web.json_response({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": model,
            "system_fingerprint": f"seed-{body.get('seed')}",
            "choices": [{"index": i, "message": {"role": "assistant", "content": text,
                                                 "refusal": None},
                         "logprobs": logprobs, "finish_reason": "stop"} for i in range(n)],
            "usage": usage})

    async def _responses(self, request: web.Request, body: dict[str, Any],
                         model: str) -> web.StreamResponse:
        """The Responses API as vLLM serves it: one object, or its event stream."""
        text = f"responded by {self.name}"
        response: dict[str, Any] = {
            "id": f"resp_{self.name}_{len(self.requests)}", "object": "response",
            "created_at": 1, "model": model, "status": "completed", "error": None,
            "incomplete_details": None, "instructions": body.get("instructions"),
            "metadata": body.get("metadata"), "temperature": body.get("temperature"),
            "top_p": body.get("top_p"),
            "store": body.get("store", True), "previous_response_id":
            body.get("previous_response_id"), "parallel_tool_calls": True,
            "tool_choice": "auto", "tools": body.get("tools", []),
            "output": [{"type": "message", "id": "msg_1", "status": "completed",
                        "role": "assistant", "content": [
                            {"type": "output_text", "text": text, "annotations": [],
                             "logprobs": []}]}],
            # vLLM's usage counts no cache writes; the gateway completes it.
            "usage": {"input_tokens": 4, "output_tokens": 3, "total_tokens": 7,
                      "input_tokens_details": {"cached_tokens": 0}}}
        if not body.get("stream"):
            return web.json_response(response)
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await stream.prepare(request)
        started = {**response, "status": "in_progress", "output": []}
        events = [{"type": "response.created", "response": started}]
        events += [{"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0,
                    "content_index": 0, "delta": word, "logprobs": []}
                   for word in ("responded ", "by ", self.name)]
        events.append({"type": "response.completed", "response": response})
        for seq, event in enumerate(events):
            event["sequence_number"] = seq
            await stream.write(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
        await stream.write_eof()
        return stream

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
        if self.chat_chunks is not None:
            for chunk in self.chat_chunks:
                await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response
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
