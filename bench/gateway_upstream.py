"""A fast OpenAI-shaped upstream for the gateway benchmark (raw asyncio, HTTP/1.1 keep-alive).

``POST /v1/chat/completions`` answers a canned completion, or, when the body
has ``"stream": true``, an SSE stream of ``--chunks`` events ``--interval``
seconds apart. Each event carries the CLOCK_MONOTONIC nanoseconds at which it
was written (``"t":...``), so a client on the same machine can measure each
chunk's delivery delay; going through the gateway or not, the difference is
what the gateway adds. Each stream's timer starts when its request arrives,
so streams that start spread out stay spread out.

Run: ``python bench/gateway_upstream.py --port 0`` prints ``http://127.0.0.1:PORT``.
"""

from __future__ import annotations

import argparse
import asyncio
import time

CANNED = (b'{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"bench",'
          b'"choices":[{"index":0,"message":{"role":"assistant","content":"hi"},'
          b'"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":1,'
          b'"total_tokens":6}}')
PLAIN = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
         + str(len(CANNED)).encode() + b"\r\n\r\n" + CANNED)
STREAM_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
               b"Transfer-Encoding: chunked\r\n\r\n")


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


class Upstream(asyncio.Protocol):
    chunks = 100
    interval = 0.05

    def __init__(self) -> None:
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].lower()
            length = 0
            pos = head.find(b"content-length:")
            if pos >= 0:
                length = int(head[pos + 15:head.find(b"\r\n", pos) if head.find(b"\r\n", pos) > 0
                                  else len(head)].strip())
            if len(self.buf) < end + 4 + length:
                return
            body = self.buf[end + 4:end + 4 + length]
            self.buf = self.buf[end + 4 + length:]
            assert self.transport is not None
            if b'"stream":true' in body.replace(b" ", b""):
                self.transport.write(STREAM_HEAD)
                loop = asyncio.get_running_loop()
                self.timer = loop.call_later(self.interval, self._send, 0)
            else:
                self.transport.write(PLAIN)

    def _send(self, i: int) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if i == self.chunks:
            transport.write(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
            self.timer = None
            return
        event = (b'data: {"object":"chat.completion.chunk","t":%d,"i":%d,'
                 b'"choices":[{"index":0,"delta":{"content":"tok"}}]}\n\n'
                 % (time.monotonic_ns(), i))
        transport.write(_chunk(event))
        self.timer = asyncio.get_running_loop().call_later(self.interval, self._send, i + 1)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--chunks", type=int, default=100)
    parser.add_argument("--interval", type=float, default=0.05)
    args = parser.parse_args()
    Upstream.chunks, Upstream.interval = args.chunks, args.interval
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Upstream, "127.0.0.1", args.port, backlog=4096)
    port = server.sockets[0].getsockname()[1]
    print(f"http://127.0.0.1:{port}", flush=True)
    async with server:
        await asyncio.sleep(3600)  # the benchmark kills it; a leaked one ends by itself


if __name__ == "__main__":
    asyncio.run(main())
