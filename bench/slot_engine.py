"""A simulated engine with a fixed number of sequence slots, for the batch benchmark.

    python bench/slot_engine.py --port 0 --slots 8 --prefill-ms 5 --token-ms 2 \\
        --seq-cost 0.01          # prints http://127.0.0.1:PORT

``POST /v1/chat/completions`` (and ``/v1/completions``) is served the way a
continuous-batching engine serves it, in the two respects that decide how one
client's load delays another's:

* **slots**: at most ``--slots`` sequences run at once (vLLM's
  ``max_num_seqs``); the rest wait in FIFO order, so a client that fills every
  slot makes everyone else queue;
* **batching cost**: each decode step takes ``--token-ms`` times
  ``1 + seq-cost × (running sequences − 1)``, so sharing the engine slows every
  sequence a little even when slots are free (on a memory-bound GPU the
  step time grows slowly with batch size; ``--seq-cost`` says how slowly).

A request costs ``--prefill-ms`` plus ``max_tokens`` decode steps (16 when
absent). The answer is a small chat completion with usage.
"""

from __future__ import annotations

import argparse
import asyncio

from aiohttp import web


class SlotEngine:
    def __init__(self, slots: int, prefill_ms: float, token_ms: float, seq_cost: float) -> None:
        self.slots = asyncio.Semaphore(slots)
        self.prefill = prefill_ms / 1000
        self.token = token_ms / 1000
        self.seq_cost = seq_cost
        self.running = 0
        self.served = 0

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        tokens = int(body.get("max_tokens") or 16)
        async with self.slots:      # asyncio.Semaphore wakes waiters in FIFO order
            self.running += 1
            try:
                await asyncio.sleep(self.prefill)
                for _ in range(tokens):
                    await asyncio.sleep(self.token * (1 + self.seq_cost * (self.running - 1)))
            finally:
                self.running -= 1
        self.served += 1
        usage = {"prompt_tokens": 8, "completion_tokens": tokens, "total_tokens": 8 + tokens}
        return web.json_response({
            "id": "chatcmpl-sim", "object": "chat.completion", "created": 1,
            "model": body.get("model"), "usage": usage,
            "choices": [{"index": 0, "finish_reason": "length",
                         "message": {"role": "assistant", "content": "ok " * tokens}}]})

    async def stats(self, request: web.Request) -> web.Response:
        return web.json_response({"running": self.running, "served": self.served})


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--prefill-ms", type=float, default=5.0)
    parser.add_argument("--token-ms", type=float, default=2.0)
    parser.add_argument("--seq-cost", type=float, default=0.01)
    args = parser.parse_args()
    engine = SlotEngine(args.slots, args.prefill_ms, args.token_ms, args.seq_cost)
    app = web.Application()
    app.router.add_post("/v1/chat/completions", engine.handle)
    app.router.add_post("/v1/completions", engine.handle)
    app.router.add_get("/stats", engine.stats)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", args.port, backlog=4096)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    print(f"http://127.0.0.1:{port}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
