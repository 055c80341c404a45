"""A simulated inference engine: vLLM's HTTP face over a model of its scheduler, with no GPU.

Routing and scaling are about time — how long a prompt's prefill takes, how a
batch shares the engine, what a prefix cache saves — and no real engine runs
on a laptop or in CI at a useful speed. ``SimEngine`` models exactly those
times and nothing else, so a routing policy can be judged on a replayed
trace (``bench/routing_replay.py``) and tested for behaviour (``tests/``):

* **Continuous batching.** At most ``max_seqs`` sequences run; the rest wait
  in a FIFO queue. Each engine step decodes one token of every running
  sequence and spends what is left of a ``token_budget`` on prefill, so a
  long prompt is prefilled in chunks beside the decodes (vLLM's chunked
  prefill). A step takes ``step_time`` plus ``decode_per_seq`` per decoding
  sequence plus ``prefill_per_token`` per prefilled token.
* **A prefix cache per replica.** Prompts are cut into ``block_tokens``-token
  blocks, each named by a hash chained over the blocks before it (vLLM's
  scheme), held in an LRU of ``cache_blocks`` blocks. A new sequence skips
  the prefill of its longest cached prefix; its full blocks are cached when
  its prefill ends.
* **Tokens** are ``bytes_per_token`` bytes of the prompt as the engine's chat
  template renders it: deterministic and cheap, and close enough in count
  to a real tokenizer for the times to mean something.

* **Text** is a function of the context: token ``i`` of an answer is
  ``t{i % 97} ``, and a prompt that already ends with the first ``k`` tokens
  of that sequence (a chat whose final assistant message holds them, sent
  with vLLM's ``continue_final_message: true``, or a completion prompt with
  them appended) is answered from token ``k`` on. So a continuation of a
  broken stream produces exactly the rest of the uninterrupted answer, and
  one token goes in each streamed event, as vLLM sends one per decoding
  step.

It can be made to fail the way replicas do: ``break_streams`` cuts the
connection of the next streams after some events, ``freeze`` stops every
sequence where it is (an engine under SIGSTOP) until ``thaw``, and ``stop``
ends it with its streams open (a killed process).

It answers like vLLM: ``/v1/chat/completions`` and ``/v1/completions``
(JSON, or SSE with a final usage chunk when ``stream_options.include_usage``
is set), usage with ``prompt_tokens_details.cached_tokens``; ``/metrics``
under vLLM's metric names; ``/v1/chat/completions/render`` and
``/v1/completions/render`` (a prompt's token ids, what a cache-aware router
asks a worker for); ``/tokenize`` (a text's token count); ``/health`` and ``/v1/models``.
With ``lora_slots`` it serves LoRA adapters as vLLM does (``llmgw.testing.simlora``):
``/v1/load_lora_adapter``, ``/v1/unload_lora_adapter``, adapters in ``/v1/models``, a
request naming an adapter not loaded refused with 404, ``vllm:lora_requests_info``.

This lives in ``llmgw.testing`` beside the fake Nomad, not in ``bench/``:
the tests and the benchmarks drive the same engine (a benchmark on one model
and tests on another would prove nothing about each other), and users can
replay their own traffic against their own ``routing:`` settings with it.
``python -m llmgw.testing.simengine --replicas 4`` serves a fleet on
loopback and prints one URL per line.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import hashlib
import itertools
import json
import math
import re
import time
from dataclasses import dataclass, field
from typing import Any

import msgspec
from aiohttp import web

from llmgw.testing.simlora import LoraEngine


class SimSpec(msgspec.Struct, frozen=True, kw_only=True):
    """The engine's timing and capacity (defaults: roughly an 8B model on one mid-range GPU)."""

    max_seqs: int = 16
    token_budget: int = 2048
    step_time: float = 0.015
    decode_per_seq: float = 0.0004
    prefill_per_token: float = 0.00012
    block_tokens: int = 16
    cache_blocks: int = 4096
    bytes_per_token: int = 4
    chunk_tokens: int = 1          # tokens per SSE chunk after the first
    default_max_tokens: int = 16
    # LoRA (``llmgw.testing.simlora``): batch slots (--max-loras; 0: LoRA off), the host
    # cache (--max-cpu-loras), the time one adapter takes to read from disk, and whether
    # a loaded path must hold adapter_config.json.
    lora_slots: int = 0
    lora_cpu_slots: int = 0
    lora_load_time: float = 0.3
    lora_check_paths: bool = True
    # Bind mounts, as a container sees the host: a path under a key is read under its
    # value (a Nomad task's cache volume, ``nomad_vllm.JobWorkloads``).
    mounts: dict[str, str] = {}


@dataclass(eq=False)
class _Seq:
    prompt: bytes
    prompt_tokens: int
    blocks: list[int]
    max_tokens: int
    offset: int = 0                # tokens of the answer already in the prompt
    cached: int = 0
    left: int = 0                  # prompt tokens still to prefill
    generated: int = 0
    done: bool = False
    cancelled: bool = False
    wake: asyncio.Event = field(default_factory=asyncio.Event)


def render_chat(messages: Any, *, continue_final: bool = False) -> bytes:
    """The prompt a chat template makes of ``messages`` (any JSON; odd shapes render as text).

    ``continue_final``: the last message is an assistant turn left open, as
    vLLM's ``continue_final_message`` renders it (no end of turn, no new
    generation prompt).
    """
    parts: list[str] = []
    items = messages if isinstance(messages, list) else [messages]
    for index, m in enumerate(items):
        if isinstance(m, dict):
            role, content = m.get("role", ""), m.get("content")
        else:
            role, content = "", m
        if isinstance(content, list):
            content = "".join(p.get("text", "<media>") if isinstance(p, dict) else str(p)
                              for p in content)
        elif content is None:
            content = ""
        elif not isinstance(content, str):
            content = json.dumps(content)
        if continue_final and index == len(items) - 1 and role == "assistant":
            parts.append(f"<|{role}|>\n{content}")
            return "".join(parts).encode()
        parts.append(f"<|{role}|>\n{content}\n")
    parts.append("<|assistant|>\n")
    return "".join(parts).encode()


_TOKEN = re.compile(rb"t(\d+) $")
_PIECE = re.compile(rb"t\d+ ")


def answered_in(prompt: bytes) -> int:
    """How many tokens of the answer ``prompt`` already ends with (0: a fresh answer).

    The answer is ``t0 t1 … t96 t0 …``: the longest run of consecutive
    tokens at the prompt's end that starts at ``t0`` is the part given.
    """
    values: list[int] = []
    end = len(prompt)
    while True:
        found = _TOKEN.search(prompt, max(0, end - 8), end)
        if found is None or found.end() != end:
            break
        value = int(found.group(1))
        if value >= 97 or (values and (value + 1) % 97 != values[-1]):
            break
        values.append(value)
        end = found.start()
    if not values:
        return 0
    # values runs backwards from the last token; the answer's token k-1 is values[0].
    k = values[0] + 1
    while k + 97 <= len(values):
        k += 97
    return k if k <= len(values) else 0


def render_prompt(prompt: Any) -> bytes:
    if isinstance(prompt, list):
        prompt = prompt[0] if prompt else ""
    return (prompt if isinstance(prompt, str) else json.dumps(prompt)).encode()


class SimEngine:
    """One simulated replica on loopback."""

    def __init__(self, spec: SimSpec | None = None, name: str = "sim") -> None:
        self.spec = spec or SimSpec()
        self.name = name
        self.url = ""
        self.metrics_broken = False      # /metrics answers 500 (a scrape that fails)
        self.requests = 0                # inference requests received
        self.paths: list[str] = []       # every path requested, in order
        self.asked: list[str] = []       # the ``model`` of each inference request, in order
        self._waiting: collections.deque[_Seq] = collections.deque()
        self._running: list[_Seq] = []
        self._cache: collections.OrderedDict[int, None] = collections.OrderedDict()
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._runner: web.AppRunner | None = None
        self._ids = itertools.count(1)
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.prompt_total = 0
        self.generated_total = 0
        # The time its steps are modelled to take, summed: what a test compares where
        # wall time would also count how busy the machine running the test is.
        self.busy_seconds = 0.0
        self.finished = 0
        self._breaks = 0                 # streams still to cut
        self._break_after = 0            # ... after this many events
        self._stall = False              # ... by going silent rather than cutting
        self._thawed = asyncio.Event()
        self._thawed.set()
        s = self.spec
        self.lora = LoraEngine(s.lora_slots, s.lora_cpu_slots, s.lora_load_time,
                               check_paths=s.lora_check_paths, mounts=s.mounts)

    # ------------------------------------------------------------ lifecycle

    async def start(self, port: int = 0, host: str = "127.0.0.1") -> str:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completion)
        app.router.add_post("/v1/chat/completions/render", self._render_chat)
        app.router.add_post("/v1/completions/render", self._render_completion)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        if self.lora.enabled:
            app.router.add_post("/v1/load_lora_adapter", self.lora.load)
            app.router.add_post("/v1/unload_lora_adapter", self.lora.unload)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None,
                                     shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, backlog=1024)
        await site.start()
        sock = site._server.sockets[0]  # type: ignore[union-attr]
        self.url = f"http://{host}:{sock.getsockname()[1]}"
        self._loop_task = asyncio.create_task(self._schedule(), name=f"sim-{self.url}")
        return self.url

    async def stop(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
            self._loop_task = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # ------------------------------------------------------------ failures on cue

    def break_streams(self, after_events: int, streams: int = 1, *, stall: bool = False
                      ) -> None:
        """Cut the connection of the next ``streams`` streams after ``after_events`` events,
        or with ``stall``, send nothing more on them (a hung engine) until they are closed."""
        self._break_after, self._breaks, self._stall = after_events, streams, stall

    def freeze(self) -> None:
        """Stop generating (every sequence stays where it is), as SIGSTOP would."""
        self._thawed.clear()

    def thaw(self) -> None:
        self._thawed.set()

    # ------------------------------------------------------------ the model

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def kv_usage(self) -> float:
        bt = self.spec.block_tokens
        held = sum(math.ceil((s.prompt_tokens + s.generated) / bt) for s in self._running)
        return min(1.0, held / self.spec.cache_blocks)

    def tokens_of(self, prompt: bytes) -> int:
        return max(1, math.ceil(len(prompt) / self.spec.bytes_per_token))

    def block_hashes(self, prompt: bytes) -> list[int]:
        size = self.spec.block_tokens * self.spec.bytes_per_token
        out: list[int] = []
        parent = b""
        for start in range(0, len(prompt) - size + 1, size):
            digest = hashlib.blake2b(parent + prompt[start:start + size], digest_size=8).digest()
            out.append(int.from_bytes(digest, "big"))
            parent = digest
        return out

    def _submit(self, prompt: bytes, max_tokens: int) -> _Seq:
        seq = _Seq(prompt=prompt, prompt_tokens=self.tokens_of(prompt),
                   blocks=self.block_hashes(prompt), max_tokens=max(1, max_tokens),
                   offset=answered_in(prompt))
        self._waiting.append(seq)
        self._wake.set()
        return seq

    def _admit(self, seq: _Seq) -> None:
        hits = 0
        for block in seq.blocks:
            if block not in self._cache:
                break
            self._cache.move_to_end(block)
            hits += 1
        # At least one token is always computed, as an engine must produce logits.
        seq.cached = min(hits * self.spec.block_tokens, seq.prompt_tokens - 1)
        seq.left = seq.prompt_tokens - seq.cached
        self.prefix_queries += seq.prompt_tokens
        self.prefix_hits += seq.cached
        self.prompt_total += seq.prompt_tokens
        self._running.append(seq)

    def _cache_blocks(self, seq: _Seq) -> None:
        cache = self._cache
        for block in seq.blocks:
            if block in cache:
                cache.move_to_end(block)
            else:
                cache[block] = None
        while len(cache) > self.spec.cache_blocks:
            cache.popitem(last=False)

    async def _schedule(self) -> None:
        spec = self.spec
        while True:
            if not self._thawed.is_set():
                await self._thawed.wait()
            if not self._running and not self._waiting:
                self._wake.clear()
                await self._wake.wait()
                continue
            while self._waiting and len(self._running) < spec.max_seqs:
                seq = self._waiting.popleft()
                if not seq.cancelled:
                    self._admit(seq)
            budget = spec.token_budget
            decoding = [s for s in self._running if s.left == 0]
            budget -= len(decoding)
            prefilled: list[_Seq] = []
            work = 0
            for s in self._running:
                if s.left > 0 and budget > 0:
                    take = min(s.left, budget)
                    s.left -= take
                    budget -= take
                    work += take
                    if s.left == 0:
                        prefilled.append(s)
            step = (spec.step_time + spec.decode_per_seq * len(decoding)
                    + spec.prefill_per_token * work)
            await asyncio.sleep(step)
            self.busy_seconds += step
            for s in [*decoding, *prefilled]:
                if s in prefilled:
                    self._cache_blocks(s)
                s.generated += 1
                self.generated_total += 1
                if s.generated >= s.max_tokens:
                    s.done = True
                s.wake.set()
            self._running = [s for s in self._running if not s.done and not s.cancelled]

    # ------------------------------------------------------------ HTTP

    async def _json(self, request: web.Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise web.HTTPBadRequest(text='{"error":{"message":"invalid JSON"}}',
                                     content_type="application/json") from None
        if not isinstance(body, dict):
            raise web.HTTPBadRequest(text='{"error":{"message":"body must be an object"}}',
                                     content_type="application/json")
        return body

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self.paths.append(request.path)
        body = await self._json(request)
        continued = bool(body.get("continue_final_message")) and \
            body.get("add_generation_prompt") is False
        prompt = render_chat(body.get("messages"), continue_final=continued)
        return await self._generate(request, body, prompt, chat=True)

    async def _completion(self, request: web.Request) -> web.StreamResponse:
        self.paths.append(request.path)
        body = await self._json(request)
        return await self._generate(request, body, render_prompt(body.get("prompt", "")),
                                    chat=False)

    async def _generate(self, request: web.Request, body: dict[str, Any], prompt: bytes, *,
                        chat: bool) -> web.StreamResponse:
        self.requests += 1
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        max_tokens = limit if isinstance(limit, int) and limit > 0 else \
            self.spec.default_max_tokens
        model = body.get("model", self.name)
        self.asked.append(str(model))
        adapter = model if model in self.lora.registered else None
        if self.lora.enabled and adapter is None and model != self.name:
            return web.json_response({"object": "error", "type": "NotFoundError",
                                      "message": f"The model `{model}` does not exist.",
                                      "param": None, "code": 404}, status=404)
        if adapter is not None:
            await self.lora.acquire(adapter)
        try:
            return await self._answer(request, body, prompt, max_tokens, model, chat=chat)
        finally:
            if adapter is not None:
                await self.lora.release(adapter)

    async def _answer(self, request: web.Request, body: dict[str, Any], prompt: bytes,
                      max_tokens: int, model: str, *, chat: bool) -> web.StreamResponse:
        seq = self._submit(prompt, max_tokens)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{next(self._ids)}"
        try:
            if body.get("stream"):
                options = body.get("stream_options")
                usage = isinstance(options, dict) and bool(options.get("include_usage"))
                return await self._stream(request, seq, rid, model, chat=chat, usage=usage)
            while not seq.done:
                seq.wake.clear()
                await seq.wake.wait()
            text = _text(seq.offset, seq.offset + seq.generated)
            choice: dict[str, Any] = (
                {"index": 0, "message": {"role": "assistant", "content": text},
                 "finish_reason": "length"} if chat else
                {"index": 0, "text": text, "finish_reason": "length", "logprobs": None})
            return web.json_response({
                "id": rid, "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()), "model": model, "choices": [choice],
                "usage": _usage(seq)})
        finally:
            if not seq.done:
                seq.cancelled = True
                with contextlib.suppress(ValueError):
                    self._waiting.remove(seq)
            self.finished += 1

    async def _stream(self, request: web.Request, seq: _Seq, rid: str, model: str, *,
                      chat: bool, usage: bool) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream",
                                           "cache-control": "no-cache"})
        await resp.prepare(request)
        sent = 0
        events = 0
        created = int(time.time())
        kind = "chat.completion.chunk" if chat else "text_completion"
        cut = self._breaks > 0
        if cut:
            self._breaks -= 1
        while True:
            if seq.generated == sent and not seq.done:
                seq.wake.clear()
                await seq.wake.wait()
                continue
            have = min(seq.generated, sent + self.spec.chunk_tokens)
            if sent > 0 and not seq.done and have - sent < self.spec.chunk_tokens:
                seq.wake.clear()
                await seq.wake.wait()
                continue
            if cut and events >= self._break_after:
                if self._stall:
                    await asyncio.Event().wait()      # until the client goes away
                assert request.transport is not None
                request.transport.abort()     # as a killed engine's socket: no end of stream
                return resp
            text = _text(seq.offset + sent, seq.offset + have)
            delta: dict[str, Any] = {"content": text}
            if chat and sent == 0:
                delta["role"] = "assistant"
            finish = "length" if seq.done and have >= seq.max_tokens else None
            choice = ({"index": 0, "delta": delta, "finish_reason": finish} if chat else
                      {"index": 0, "text": text, "finish_reason": finish, "logprobs": None})
            chunk = {"id": rid, "object": kind, "created": created, "model": model,
                     "choices": [choice]}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            events += 1
            sent = have
            if seq.done and sent >= seq.generated:
                break
        if usage:
            tail = {"id": rid, "object": kind, "created": created, "model": model,
                    "choices": [], "usage": _usage(seq)}
            await resp.write(b"data: " + json.dumps(tail).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    def _token_ids(self, prompt: bytes) -> list[int]:
        n = self.spec.bytes_per_token
        return [int.from_bytes(prompt[i:i + n], "little") for i in range(0, len(prompt), n)]

    async def _render_chat(self, request: web.Request) -> web.Response:
        self.paths.append(request.path)
        body = await self._json(request)
        return web.json_response({"request_id": f"chatcmpl-{next(self._ids)}",
                                  "model": body.get("model", self.name),
                                  "token_ids": self._token_ids(render_chat(body.get("messages")))})

    async def _tokenize(self, request: web.Request) -> web.Response:
        """vLLM's ``/tokenize`` (``count`` and ``tokens``): text of the answer counts one
        token per ``tK `` piece, as the engine generated it; other text by its bytes."""
        self.paths.append(request.path)
        body = await self._json(request)
        text = str(body.get("prompt", "")).encode()
        pieces = _PIECE.findall(text)
        count = len(pieces) if b"".join(pieces) == text else self.tokens_of(text)
        return web.json_response({"count": count, "tokens": list(range(count)),
                                  "max_model_len": 1 << 20})

    async def _render_completion(self, request: web.Request) -> web.Response:
        self.paths.append(request.path)
        body = await self._json(request)
        prompts = body.get("prompt", "")
        items = prompts if isinstance(prompts, list) and prompts and \
            not isinstance(prompts[0], int) else [prompts]
        return web.json_response([
            {"request_id": f"cmpl-{next(self._ids)}", "model": body.get("model", self.name),
             "token_ids": self._token_ids(render_prompt(p))} for p in items])

    async def _metrics(self, request: web.Request) -> web.Response:
        self.paths.append(request.path)
        if self.metrics_broken:
            return web.Response(status=500, text="metrics are broken on cue")
        labels = f'{{engine="0",model_name="{self.name}"}}'
        rows = [
            ("vllm:num_requests_running", "gauge", self.running),
            ("vllm:num_requests_waiting", "gauge", self.waiting),
            ("vllm:kv_cache_usage_perc", "gauge", self.kv_usage()),
            ("vllm:prefix_cache_queries_total", "counter", self.prefix_queries),
            ("vllm:prefix_cache_hits_total", "counter", self.prefix_hits),
            ("vllm:prompt_tokens_total", "counter", self.prompt_total),
            ("vllm:generation_tokens_total", "counter", self.generated_total),
        ]
        lines = []
        for name, kind, value in rows:
            family = name.removesuffix("_total") if kind == "counter" else name
            lines += [f"# HELP {family} {name} of the simulated engine.",
                      f"# TYPE {family} {kind}", f"{name}{labels} {float(value)}"]
        lines += self.lora.metric_lines()
        return web.Response(text="\n".join(lines) + "\n",
                            content_type="text/plain", charset="utf-8")

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": self.name, "object": "model", "created": 0, "owned_by": "sim"},
            *self.lora.cards(self.name)]})


def _text(start: int, end: int) -> str:
    return "".join(f"t{i % 97} " for i in range(start, end))


def answer_text(tokens: int) -> str:
    """The whole answer of ``tokens`` tokens to any fresh prompt."""
    return _text(0, tokens)


def _usage(seq: _Seq) -> dict[str, Any]:
    return {"prompt_tokens": seq.prompt_tokens, "completion_tokens": seq.generated,
            "total_tokens": seq.prompt_tokens + seq.generated,
            "prompt_tokens_details": {"cached_tokens": seq.cached}}


async def serve_fleet(replicas: int, spec: SimSpec, name: str, port: int = 0
                      ) -> list[SimEngine]:
    """``replicas`` engines, on consecutive ports from ``port`` (0: any free ports)."""
    engines = [SimEngine(spec, name) for _ in range(replicas)]
    for i, engine in enumerate(engines):
        await engine.start(port + i if port else 0)
    return engines


async def _main() -> None:
    parser = argparse.ArgumentParser(description="Serve simulated engines on loopback.")
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--port", type=int, default=0, help="first port (default: any free)")
    parser.add_argument("--name", default="sim", help="the served model name")
    parser.add_argument("--spec", default="{}", help="SimSpec fields as JSON")
    args = parser.parse_args()
    spec = msgspec.convert(json.loads(args.spec), SimSpec)
    engines = await serve_fleet(args.replicas, spec, args.name, args.port)
    for engine in engines:
        print(engine.url, flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main())
