"""Tokens served against a token budget shared by several ``llmgw serve`` instances.

    .venv/bin/python bench/budget_overshoot.py [--instances 2,4] [--runs 5]
        [--clients 64] [--max-tokens 64] [--budget 20000]
        [--postgres postgresql://postgres@127.0.0.1:5432/test]

For each instance count, that many ``llmgw serve`` processes share one Postgres
schema (created here, dropped afterwards) and one simulated engine
(``llmgw.testing.simengine``, a process of its own, which generates exactly
``max_tokens`` tokens). Each run creates a new team with a daily budget of
``--budget`` tokens and a key of it; ``--clients`` connections, spread over
the instances, half streaming and half not, send requests with ``max_tokens``
one after another until the budget refuses them (429 ``insufficient_quota``).
The tokens served are what the engine counted (its ``vllm:prompt_tokens_total``
and ``vllm:generation_tokens_total``) over the run, so nothing the gateways
say about themselves is trusted. Printed per run and summarised: served
against the budget, the overshoot (negative: stopped short) in tokens and as
a multiple of the in-flight bound ``clients x max_tokens``, and the worst and
median over the runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway_bench import free_port
from ledger_bench import schema

from llmgw.store.base import StoredKey, StoredTeam
from llmgw.store.postgres import PostgresStore
from llmgw.tenancy import Limits, encode_limits, generate_key, hash_key

DEFAULT_PG = os.environ.get("LLMGW_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
_COUNTER = re.compile(rb"^(vllm:(?:prompt|generation)_tokens_total)(?:\{[^}]*\})? (\S+)$", re.M)


@contextlib.contextmanager
def engine() -> Iterator[str]:
    """The simulated engine in a process of its own; its URL."""
    spec = '{"max_seqs": 256, "step_time": 0.01, "default_max_tokens": 64}'
    proc = subprocess.Popen([sys.executable, "-m", "llmgw.testing.simengine", "--name", "m",
                             "--spec", spec], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        yield proc.stdout.readline().decode().strip()
    finally:
        proc.terminate()
        proc.wait(30)


@contextlib.contextmanager
def servers(n: int, database: str, upstream: str, workdir: Path) -> Iterator[list[str]]:
    """``n`` ``llmgw serve`` processes on ``database``, ready; their base URLs."""
    config = workdir / "server.yaml"
    config.write_text(
        "scheduler: {kind: local}\n"
        "models:\n  - name: m\n    upstream: [" + upstream + "]\n"
        "    health: {path: null}\n    routing: {policy: least-outstanding}\n")
    procs, urls = [], []
    try:
        for i in range(n):
            port = free_port()
            env = {**os.environ, "LLMGW_DATABASE_URL": database}
            with open(workdir / f"serve{i}.log", "w") as log:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "llmgw.cli", "serve", "--config", str(config),
                     "--listen", f"127.0.0.1:{port}", "--log-level", "warning"],
                    env=env, stdout=log, stderr=subprocess.STDOUT, cwd=workdir))
            urls.append(f"http://127.0.0.1:{port}")
        for i, (url, proc) in enumerate(zip(urls, procs, strict=True)):
            deadline = time.monotonic() + 120
            while True:
                if proc.poll() is not None:
                    raise RuntimeError((workdir / f"serve{i}.log").read_text())
                with contextlib.suppress(httpx.TransportError):
                    if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"llmgw serve at {url} was not ready in 120 s")
                time.sleep(0.1)
        yield urls
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(60)


async def served_so_far(http: httpx.AsyncClient, upstream: str) -> int:
    text = (await http.get(f"{upstream}/metrics")).content
    return int(sum(float(v) for _, v in _COUNTER.findall(text)))


async def client(url: str, key: str, stream: bool, max_tokens: int) -> tuple[int, int]:
    """Requests one after another until the budget refuses one; how many were answered,
    and how many were told to retry while a slice was refilled (``budget_refilling``)."""
    body = {"model": "m", "max_tokens": max_tokens, "stream": stream,
            "messages": [{"role": "user", "content": "write a short story about a budget"}]}
    answered = refilling = 0
    async with httpx.AsyncClient(base_url=url, timeout=120,
                                 headers={"Authorization": f"Bearer {key}"}) as http:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            r = await http.post("/v1/chat/completions", json=body)
            if r.status_code == 200:
                if stream:
                    assert b"data: [DONE]" in r.content
                answered += 1
                continue
            code = r.json()["error"]["code"]
            if code == "insufficient_quota":
                return answered, refilling
            if code not in {"invalid_api_key", "budget_refilling"}:
                raise RuntimeError(f"{url}: {r.status_code} {r.text}")
            refilling += code == "budget_refilling"
            await asyncio.sleep(0.05)
    raise RuntimeError("the budget never refused this client")


async def one_run(store: PostgresStore, urls: list[str], upstream: str, run: int,
                  args: argparse.Namespace) -> tuple[int, int, int, float]:
    """(tokens served, requests answered, told to retry, seconds) of one run on a new
    team's budget."""
    team = f"run-{run}-{uuid.uuid4().hex[:6]}"
    await store.put_team(StoredTeam(
        name=team, settings=encode_limits(Limits(tokens_per_day=args.budget)),
        created_by="bench", created_at=time.time()), create=True)
    key = generate_key()
    await store.put_key(StoredKey(name=f"{team}-key", team=team, sha256=hash_key(key),
                                  settings=b"{}", created_by="bench", created_at=time.time()))
    async with httpx.AsyncClient(timeout=30) as http:
        before = await served_so_far(http, upstream)
        started = time.monotonic()
        outcomes = await asyncio.gather(*(
            client(urls[i % len(urls)], key, i % 2 == 0, args.max_tokens)
            for i in range(args.clients)))
        took = time.monotonic() - started
        after = await served_so_far(http, upstream)
    return (after - before, sum(a for a, _ in outcomes), sum(r for _, r in outcomes), took)


async def bench(args: argparse.Namespace) -> None:
    bound = args.clients * args.max_tokens
    with engine() as upstream, tempfile.TemporaryDirectory() as tmp:
        for n in [int(x) for x in args.instances.split(",")]:
            async with schema(args.postgres) as url:
                store = PostgresStore(url)
                await store.open()
                try:
                    with servers(n, url, upstream, Path(tmp)) as urls:
                        over = []
                        for run in range(args.runs):
                            served, answered, refilling, took = await one_run(
                                store, urls, upstream, run, args)
                            over.append(served - args.budget)
                            print(f"{n} instances, run {run + 1} ({took:.1f} s, "
                                  f"{refilling} told to retry while a slice refilled): served "
                                  f"{served:,} tokens in {answered:,} requests on a budget of "
                                  f"{args.budget:,}: "
                                  f"overshoot {served - args.budget:+,} "
                                  f"({(served - args.budget) / bound:+.3f} x the in-flight "
                                  f"bound {bound:,})", flush=True)
                finally:
                    await store.close()
            worst, median = max(over), statistics.median(over)
            print(f"{n} instances, {args.runs} runs, {args.clients} clients, max_tokens "
                  f"{args.max_tokens}: worst overshoot {worst:+,} tokens "
                  f"({worst / bound:+.3f} x {bound:,}), median {median:+,.0f} "
                  f"({median / bound:+.3f} x); served at most "
                  f"{args.budget + worst:,} of {args.budget:,}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instances", default="2,4")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--budget", type=int, default=20_000)
    parser.add_argument("--postgres", default=DEFAULT_PG)
    asyncio.run(bench(parser.parse_args()))


if __name__ == "__main__":
    main()
