"""Keeping a held streaming request alive: SSE comments while it waits for a replica.

A streaming request can wait minutes before its first token: in the admission
queue while every replica is saturated, or while an on-demand model loads.
Proxies and clients with an idle timeout of a minute or so (common defaults)
would cut it. So after ``gateway.keepalive_interval`` of waiting, the gateway
answers ``200`` with ``text/event-stream`` and sends a comment line
(``: waiting for a replica of M``) every interval until the request is
forwarded; SSE clients ignore comments (the ``openai`` client does).

That commits the status early, which shapes the rest:

* a retry before the answer's first byte stays possible: comments are not
  part of any answer;
* the replica's own response head is dropped (``x-llmgw-model`` is lost with
  it; only a fallback would have made it differ);
* an error after the head was sent — the queue's limit, a model that did not
  come up, a replica's ``4xx`` — reaches the client as the ``data:
  {"error": …}`` event a broken stream ends with, the error's status still
  being counted in the metrics.

A request that is forwarded before the first interval is untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from llmgw.errors import LlmgwError
from llmgw.gateway.errors import Message, Send, UpstreamError, sse_error_event

_HEAD = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


class HeldStream:
    """The client's ``send`` while a streaming request is held, and after it."""

    def __init__(self, send: Send, model: str, interval: float) -> None:
        self._send = send
        self._comment = f": waiting for a replica of {model}\n\n".encode()
        self.interval = interval
        self.started = False          # the 200 head went out: the answer is an event stream
        self.comments = 0
        self._error: list[bytes] | None = None   # the body of an error answer being turned
        self._gone = False

    @contextlib.asynccontextmanager
    async def waiting(self) -> AsyncIterator[None]:
        """Comments every ``interval`` for as long as the block runs."""
        ticker = asyncio.create_task(self._tick())
        try:
            yield
        finally:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker

    async def _tick(self) -> None:
        while not self._gone:
            await asyncio.sleep(self.interval)
            try:
                if not self.started:
                    await self._send({"type": "http.response.start", "status": 200,
                                      "headers": _HEAD})
                    self.started = True
                await self._send({"type": "http.response.body", "body": self._comment,
                                  "more_body": True})
                self.comments += 1
            except Exception:   # the client went away: its watcher cancels the request
                self._gone = True

    async def send(self, message: Message) -> None:
        """What the forwarder sends, once the head is out: a second head is dropped, and an
        error answer becomes an error event."""
        if message["type"] == "http.response.start":
            ctype = next((v for n, v in message.get("headers", ()) if n == b"content-type"),
                         b"")
            if message["status"] >= 400 or not ctype.startswith(b"text/event-stream"):
                self._error = []
            return
        if self._error is None:
            await self._send(message)
            return
        self._error.append(message.get("body", b""))
        if not message.get("more_body", False):
            body = b"".join(self._error).strip()
            event = b"data: " + body + b"\n\n" if body.startswith(b'{"error"') else \
                sse_error_event(UpstreamError(body.decode("utf-8", "replace")[:300]))
            await self._send({"type": "http.response.body", "body": event, "more_body": True})
            await self._send({"type": "http.response.body", "body": b""})

    async def fail(self, err: LlmgwError) -> None:
        """End the held stream with ``err`` as its error event."""
        await self._send({"type": "http.response.body", "body": sse_error_event(err),
                          "more_body": True})
        await self._send({"type": "http.response.body", "body": b""})
