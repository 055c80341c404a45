"""Routing policies on a replayed multi-turn trace against simulated engines.

    .venv/bin/python bench/routing_replay.py [--duration 60] [--rate 3] [--replicas 4]
                                             [--no-vllm-router] [--policies a,b,…]

A fleet of ``--replicas`` simulated engines (``llmgw.testing.simengine``, one
process) is put behind each router in turn, restarted fresh for each so that
no router inherits another's warm caches, and the same trace is replayed
through it:

* **shared**: chat sessions arrive as a Poisson process (``--rate`` per
  second); each has its own ~1,500-token system prompt and 3–5 turns, the
  user thinking 0.5–4 s (exponential, mean ``--think``) between an answer
  and the next question; every turn resends the whole conversation, as chat
  clients do;
* **unique**: the same arrivals, but every request is a one-turn session: no
  prompt prefix is ever seen twice, so a cache can save nothing and only the
  balancing counts.

Routers: llmgw with each ``routing.policy`` (one gateway worker, engine
metrics on), and vllm-router (PyPI ``vllm-router``, run from its own
virtualenv ``bench/.venv-vllm-router``, created by ``bench/vllm_router_venv.sh``)
with its ``cache_aware`` and ``round_robin`` policies. Requests stream, with
usage; TTFT is the time to the first content chunk, measured by the client.

Reported per router: TTFT p50/p95, end-to-end p50/p95, errors, output tokens
per second, and the fleet's prefix-cache hit ratio (cached prompt tokens over
prompt tokens, from the engines' usage).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from gateway_bench import free_port, running, wait_listening  # noqa: E402

PYTHON = sys.executable
VLLM_ROUTER = BENCH / ".venv-vllm-router" / "bin" / "vllm-router"
# The fleet: prefix cache of 1,536 blocks of 16 tokens (24k tokens) per replica,
# a fraction of the trace's working set, as a busy GPU's would be.
SIM_SPEC = {"max_seqs": 16, "token_budget": 2048, "step_time": 0.015,
            "decode_per_seq": 0.0004, "prefill_per_token": 0.00012, "block_tokens": 16,
            "cache_blocks": 1536, "chunk_tokens": 8}
WORDS = (
    "account", "order", "refund", "shipping", "policy", "warranty", "invoice", "customer",
    "agent", "escalate", "priority", "ticket", "product", "manual", "battery", "screen",
    "network", "password", "update", "device", "billing", "region", "language", "tone",
    "concise", "polite", "verify", "identity", "history", "schedule", "delivery", "return",
    "exchange", "discount", "coupon", "loyalty", "points", "premium", "standard",
)


# ---------------------------------------------------------------- the trace


@dataclass
class Session:
    start: float
    system: str
    questions: list[str]
    think: list[float]
    max_tokens: list[int]


def make_trace(seed: int, rate: float, duration: float, think: float, *,
               unique: bool) -> list[Session]:
    """Sessions arriving as a Poisson process of ``rate`` per second for ``duration`` s."""
    rng = random.Random(seed)
    sessions = []
    t = rng.expovariate(rate)
    n = 0
    while t < duration:
        n += 1
        turns = 1 if unique else rng.randint(3, 5)
        # ~1,500 tokens at 4 bytes a token: about 6,000 characters.
        system = f"You are assistant #{n}-{rng.random():.12f}. " + " ".join(
            rng.choice(WORDS) for _ in range(860))
        sessions.append(Session(
            start=t, system=system,
            questions=[" ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 80)))
                       for _ in range(turns)],
            think=[min(4.0, max(0.5, rng.expovariate(1 / think))) for _ in range(turns)],
            max_tokens=[rng.randint(32, 96) for _ in range(turns)]))
        t += rng.expovariate(rate)
    return sessions


@dataclass
class Outcome:
    ttft: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    first: float = math.inf
    last: float = 0.0

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1


async def _turn(http: aiohttp.ClientSession, url: str, model: str, messages: list[dict[str, str]],
                max_tokens: int, out: Outcome) -> str | None:
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}}
    sent = time.monotonic()
    out.first = min(out.first, sent)
    text: list[str] = []
    first: float | None = None
    try:
        async with http.post(f"{url}/v1/chat/completions", json=body) as r:
            if r.status != 200:
                await r.read()
                out.error(str(r.status))
                return None
            buf = b""
            async for chunk in r.content.iter_any():
                buf += chunk
                while b"\n\n" in buf:
                    event, buf = buf.split(b"\n\n", 1)
                    if not event.startswith(b"data: ") or event == b"data: [DONE]":
                        continue
                    data = json.loads(event[6:])
                    if "error" in data:
                        out.error("stream_error")
                        return None
                    for choice in data.get("choices") or []:
                        piece = (choice.get("delta") or {}).get("content")
                        if piece:
                            if first is None:
                                first = time.monotonic()
                            text.append(piece)
                    usage = data.get("usage")
                    if usage:
                        out.tokens += usage.get("completion_tokens", 0)
                        out.prompt_tokens += usage.get("prompt_tokens", 0)
                        details = usage.get("prompt_tokens_details") or {}
                        out.cached_tokens += details.get("cached_tokens") or 0
    except (aiohttp.ClientError, TimeoutError) as exc:
        out.error(type(exc).__name__)
        return None
    done = time.monotonic()
    if first is None:
        out.error("no_content")
        return None
    out.ttft.append(first - sent)
    out.e2e.append(done - sent)
    out.last = max(out.last, done)
    return "".join(text)


async def _session(http: aiohttp.ClientSession, url: str, model: str, s: Session, t0: float,
                   out: Outcome) -> None:
    await asyncio.sleep(max(0.0, t0 + s.start - time.monotonic()))
    messages = [{"role": "system", "content": s.system}]
    for i, question in enumerate(s.questions):
        if i:
            await asyncio.sleep(s.think[i])
        messages.append({"role": "user", "content": question})
        answer = await _turn(http, url, model, messages, s.max_tokens[i], out)
        if answer is None:
            return
        messages.append({"role": "assistant", "content": answer})


async def replay(url: str, model: str, trace: list[Session]) -> Outcome:
    out = Outcome()
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=600)) as http:
        t0 = time.monotonic()
        await asyncio.gather(*(_session(http, url, model, s, t0, out) for s in trace))
    return out


# ---------------------------------------------------------------- the fleet and routers


@contextlib.contextmanager
def sim_fleet(replicas: int, spec: dict[str, object]) -> Iterator[list[str]]:
    proc = subprocess.Popen([PYTHON, "-m", "llmgw.testing.simengine", "--replicas",
                             str(replicas), "--name", "sim", "--spec", json.dumps(spec)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    try:
        urls = [proc.stdout.readline().decode().strip() for _ in range(replicas)]
        yield urls
    finally:
        proc.terminate()
        proc.wait(10)


@contextlib.contextmanager
def llmgw_router(urls: list[str], policy: str) -> Iterator[str]:
    port = free_port()
    name, _, factor = policy.partition("@")
    routing: dict[str, object] = {"policy": name, "engine_metrics": True}
    if factor:
        routing["load_factor"] = float(factor)
    args = [str(Path(PYTHON).parent / "uvicorn"), "--host", "127.0.0.1", "--port", str(port),
            "--workers", "1", "--backlog", "4096", "--no-access-log", "--log-level", "warning",
            "--app-dir", str(BENCH), "gateway_serve:app"]
    env = {"LLMGW_BENCH_MODELS": "sim=" + "|".join(urls),
           "LLMGW_BENCH_ROUTING": json.dumps(routing)}
    with running(args, port, env=env):
        time.sleep(1.5)    # a first round of engine scrapes
        yield f"http://127.0.0.1:{port}"


@contextlib.contextmanager
def vllm_router(urls: list[str], policy: str) -> Iterator[str]:
    port = free_port()
    args = [str(VLLM_ROUTER), "--host", "127.0.0.1", "--port", str(port), "--worker-urls",
            *urls, "--policy", policy, "--log-level", "warning",
            "--worker-startup-timeout-secs", "30", "--disable-retries"]
    log = open(BENCH / ".vllm-router.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_listening(port, proc, timeout=60)
        time.sleep(1.0)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def pct(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report(name: str, out: Outcome) -> dict[str, object]:
    span = max(out.last - out.first, 1e-9)
    row = {
        "router": name, "requests": len(out.ttft),
        "ttft_p50_ms": pct(out.ttft, 0.5) * 1000, "ttft_p95_ms": pct(out.ttft, 0.95) * 1000,
        "e2e_p50_ms": pct(out.e2e, 0.5) * 1000, "e2e_p95_ms": pct(out.e2e, 0.95) * 1000,
        "errors": sum(out.errors.values()), "error_kinds": out.errors,
        "tokens_per_s": out.tokens / span,
        "cache_hit": out.cached_tokens / out.prompt_tokens if out.prompt_tokens else 0.0,
    }
    print(f"  {name:<30} n={row['requests']:<5} TTFT p50 {row['ttft_p50_ms']:7.1f} ms  "
          f"p95 {row['ttft_p95_ms']:7.1f} ms   e2e p50 {row['e2e_p50_ms']:7.1f} ms  "
          f"p95 {row['e2e_p95_ms']:7.1f} ms   errors {row['errors']}   "
          f"{row['tokens_per_s']:6.0f} tok/s   cache hit {row['cache_hit']:.2f}", flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals")
    parser.add_argument("--rate", type=float, default=3.0, help="sessions per second")
    parser.add_argument("--think", type=float, default=2.0, help="mean think time, seconds")
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument("--policies", default="prefix-affinity,least-outstanding,round-robin",
                        help="llmgw policies; POLICY@F sets routing.load_factor F")
    parser.add_argument("--workloads", default="shared,unique")
    parser.add_argument("--no-vllm-router", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    routers: list[tuple[str, object]] = [
        (f"llmgw {p}", (llmgw_router, p)) for p in args.policies.split(",") if p]
    if not args.no_vllm_router:
        if VLLM_ROUTER.exists():
            routers += [("vllm-router cache_aware", (vllm_router, "cache_aware")),
                        ("vllm-router round_robin", (vllm_router, "round_robin"))]
        else:
            print(f"(vllm-router skipped: {VLLM_ROUTER} missing; run "
                  "bench/vllm_router_venv.sh)")
    print(f"machine: {os.cpu_count()} cores; {args.replicas} simulated replicas {SIM_SPEC}; "
          f"sessions {args.rate}/s for {args.duration:g}s, think mean {args.think}s, "
          f"seed {args.seed}")
    rows = []
    for workload in args.workloads.split(","):
        trace = make_trace(args.seed, args.rate, args.duration, args.think,
                           unique=workload == "unique")
        turns = sum(len(s.questions) for s in trace)
        print(f"\nworkload {workload}: {len(trace)} sessions, {turns} requests")
        for name, (factory, policy) in routers:  # type: ignore[misc]
            with sim_fleet(args.replicas, SIM_SPEC) as urls, factory(urls, policy) as url:
                out = asyncio.run(replay(url, "sim", trace))
            row = report(name, out)
            row["workload"] = workload
            rows.append(row)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2, default=str))


if __name__ == "__main__":
    main()
