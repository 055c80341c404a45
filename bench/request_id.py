"""What ``x-request-id`` costs a request: making the id, reading the client's, the answer's head.

    .venv/bin/python bench/request_id.py [--rounds 7] [--number 200000]

Times, per call and as the median of several rounds (a shared machine's
load moves single runs), ``llmgw.gateway.requestid.new_id`` against the id
the obvious way (``"req_" + uuid4().hex``); ``of`` on a typical client's
request headers without and with an ``x-request-id`` of its own; and one
JSON answer (a head and a body) sent through ``answering`` against the bare
``send``. The gateway pays the last three on every request.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import timeit
import uuid
from collections.abc import Callable
from typing import Any

from llmgw.gateway import requestid

HEADERS = [(b"host", b"127.0.0.1:8080"), (b"user-agent", b"OpenAI/Python 1.99.0"),
           (b"accept", b"application/json"), (b"content-type", b"application/json"),
           (b"authorization", b"Bearer sk-llmgw-0123456789abcdef"),
           (b"x-stainless-lang", b"python"), (b"content-length", b"96")]
START = {"type": "http.response.start", "status": 200,
         "headers": [(b"content-type", b"application/json"), (b"content-length", b"2")]}
BODY = {"type": "http.response.body", "body": b"{}"}


def _uuid_id() -> bytes:
    return ("req_" + uuid.uuid4().hex).encode()


def per_call(fn: Callable[[], Any], number: int, rounds: int) -> float:
    """Median nanoseconds per call over ``rounds`` runs of ``number`` calls."""
    return statistics.median(t / number * 1e9 for t in timeit.repeat(fn, number=number,
                                                                     repeat=rounds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--number", type=int, default=200_000)
    args = parser.parse_args()
    n, r = args.number, args.rounds
    ours = per_call(requestid.new_id, n, r)
    theirs = per_call(_uuid_id, n, r)
    print(f"new id: {ours:.0f} ns; req_ + uuid4().hex: {theirs:.0f} ns ({theirs / ours:.1f}x)")
    own = [*HEADERS, (b"x-request-id", b"trace-0af7651916cd43dd8448eb211c80319c")]
    print(f"of(headers): {per_call(lambda: requestid.of(HEADERS), n, r):.0f} ns without an "
          f"x-request-id, {per_call(lambda: requestid.of(own), n, r):.0f} ns with the client's")

    async def sink(message: Any) -> None:
        pass

    wrapped = requestid.answering(sink, b"req_0123456789abcdef01234567")

    async def answer(send: Callable[[Any], Any], count: int) -> None:
        for _ in range(count):
            await send(START)
            await send(BODY)

    loop = asyncio.new_event_loop()
    try:
        bare = per_call(lambda: loop.run_until_complete(answer(sink, 1000)), n // 1000, r)
        tagged = per_call(lambda: loop.run_until_complete(answer(wrapped, 1000)), n // 1000, r)
    finally:
        loop.close()
    print(f"one JSON answer sent: {bare / 1000:.0f} ns bare, {tagged / 1000:.0f} ns with the "
          f"id added (+{(tagged - bare) / 1000:.0f} ns)")


if __name__ == "__main__":
    main()
