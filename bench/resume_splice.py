"""What watching a stream for resumption costs per event, against passing bytes on.

    .venv/bin/python bench/resume_splice.py [--events 200000]

A resumable stream (``llmgw.gateway.resume.Splice``) is cut into whole
events and each event's choice is decoded, to know the text delivered;
a stream that is not resumable is passed on as it arrives. This times both
over the same vLLM-shaped chat chunks (one token each, as vLLM sends them),
fed 4 events per read as a socket tends to deliver them, and prints the
median of 5 rounds in microseconds per event.
"""

from __future__ import annotations

import argparse
import statistics
import time

from llmgw.gateway.proxy import StreamUsage
from llmgw.gateway.resume import Splice


def chunks(events: int) -> list[bytes]:
    one = [b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,'
           b'"model":"m","choices":[{"index":0,"delta":{"content":"t%d "},'
           b'"logprobs":null,"finish_reason":null}]}\n\n' % (i % 97) for i in range(events)]
    return [b"".join(one[i:i + 4]) for i in range(0, events, 4)]


def round_of(data: list[bytes], splice: bool) -> float:
    start = time.perf_counter()
    usage = StreamUsage()
    s = Splice("chat", 2) if splice else None
    for chunk in data:
        out = s.feed(chunk) if s is not None else chunk
        usage.feed(out)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=200_000)
    args = parser.parse_args()
    data = chunks(args.events)
    round_of(data, True)   # warm up
    for label, splice in (("passed on as bytes", False), ("watched for resumption", True)):
        times = [round_of(data, splice) for _ in range(5)]
        per = statistics.median(times) / args.events * 1e6
        print(f"{label:>24}: {per:.2f} µs per event (median of 5 rounds, "
              f"{args.events:,} events)")


if __name__ == "__main__":
    main()
