"""The gateway's hot path against its floor and against vllm-router, and each feature's cost.

    .venv/bin/python bench/hotpath.py [--rounds 5] [--duration 5] [--parts table,features]

Everything runs on loopback: nginx answering a canned chat completion (the
upstream of ``gateway_bench.py``) and wrk as the load (both from Debian:
``apt-get install wrk nginx-light``). Two parts:

* **table**: four columns on the same upstream and load —
  the *floor*, a bare Python pass-through on the gateway's own server stack
  (uvicorn, httptools, the same event loop) and upstream client (aiohttp,
  pooled), with no feature at all (``gateway_minimal.py``); *llmgw* (``llmgw
  serve``) with every default feature on: a keys file and a runtime team key
  the load authenticates with, metrics, the usage ledger, prefix-affinity
  routing over two replica URLs, admission (``routing.max_concurrency`` set,
  so every request reads the replicas' headroom); the same with ``--workers
  2``; and *vllm-router* (PyPI ``vllm-router``, from the virtualenv
  ``bench/vllm_router_venv.sh`` makes). For each: requests/s at 32
  connections; latency p50 and p99 at one connection, less the upstream's own
  measured just before (the latency the hop adds); and CPU time per
  request of the whole process tree serving the hop (sampled from /proc
  around the 32-connection run), each with its ratio to the floor and to
  vllm-router. "Per core" compares requests per CPU-second: vllm-router's
  CPU per request over llmgw's.
* **features**: llmgw with every feature on, and with each turned off in
  turn — ``ledger`` (``gateway.ledger: false``), ``metrics`` (the metric
  objects' recording calls replaced by no-ops in the server process; there
  is no setting for it), ``admission`` (no ``max_concurrency``: a request is
  forwarded without reading headroom), ``routing`` (``least-outstanding``
  instead of ``prefix-affinity``: the prompt is not read and hashed) and
  ``keys`` (no keys file, no runtime key: open access on loopback). A
  feature's cost is its share of the all-on variant's CPU per request and
  of its throughput.

The machine is shared (2 cores here, other work running): the
configurations take turns within each round, in an order rotated from round
to round, and every figure is the median over rounds of a ratio measured
within one round. The absolute numbers say only what this machine did.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from gateway_bench import (  # noqa: E402
    BODY,
    PYTHON,
    cpu_seconds,
    free_port,
    nginx_upstream,
    running,
    wait_listening,
    wrk_runs,
)

VLLM_ROUTER = BENCH / ".venv-vllm-router" / "bin" / "vllm-router"
FEATURES = ("ledger", "metrics", "admission", "routing", "keys")
WITHOUT_METRICS = "--without-metrics"


@dataclass
class Figures:
    rps: list[float] = field(default_factory=list)
    cpu_us: list[float] = field(default_factory=list)        # per request
    added_p50: list[float] = field(default_factory=list)     # ms
    added_p99: list[float] = field(default_factory=list)
    failed: int = 0


# A server under test: a context that yields (base URL, pid of its process tree's root,
# headers the load sends).
Served = Callable[[], contextlib.AbstractContextManager[tuple[str, int, dict[str, str]]]]


# ---------------------------------------------------------------- what is measured


@contextlib.contextmanager
def floor(upstream: str) -> Iterator[tuple[str, int, dict[str, str]]]:
    port = free_port()
    args = [str(Path(PYTHON).parent / "uvicorn"), "--host", "127.0.0.1", "--port", str(port),
            "--http", "httptools", "--backlog", "4096", "--no-access-log", "--log-level",
            "warning", "--app-dir", str(BENCH), "gateway_minimal:app"]
    env = {"LLMGW_BENCH_UPSTREAM": upstream, "LLMGW_BENCH_CLIENT": "aiohttp"}
    with running(args, port, env=env) as proc:
        yield f"http://127.0.0.1:{port}", proc.pid, {}


def _config(tmp: Path, port: int, upstream: str, off: str) -> Path:
    """server.yaml with every feature on but ``off``."""
    name = f"llmgw-{port}"
    lines = [f"listen: 127.0.0.1:{port}", f"database: sqlite:///{tmp}/{name}.db"]
    if off != "keys":
        lines.append(f"keys_file: {tmp}/keys.json")
    lines += ["gateway:", f"  ledger: {'false' if off == 'ledger' else 'true'}",
              "models:", "  - name: bench",
              # Two replica URLs for the one nginx (``/v1`` is dropped when forwarding):
              # prefix-affinity has a choice to make, so it reads every prompt.
              f"    upstream: [{upstream}, {upstream}/v1]", "    routing:",
              f"      policy: {'least-outstanding' if off == 'routing' else 'prefix-affinity'}"]
    if off != "admission":
        lines.append("      max_concurrency: 4096")
    path = tmp / f"{name}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


async def _runtime_key(database: str) -> str:
    """A team and a key of it in the store (as `llmgw ctl key add` makes them)."""
    from llmgw.store import open_store
    from llmgw.store.base import StoredKey, StoredTeam
    from llmgw.tenancy import Limits, encode_limits, generate_key, hash_key

    store = open_store(database)
    await store.open()
    try:
        await store.put_team(StoredTeam(name="bench-team", settings=encode_limits(Limits()),
                                        created_by="bench", created_at=time.time()),
                             create=True)
        key = generate_key()
        await store.put_key(StoredKey(name="bench-key", team="bench-team",
                                      sha256=hash_key(key), settings=b"{}",
                                      created_by="bench", created_at=time.time()))
    finally:
        await store.close()
    return key


@contextlib.contextmanager
def llmgw(upstream: str, tmp: Path, workers: int = 1,
          off: str = "") -> Iterator[tuple[str, int, dict[str, str]]]:
    from llmgw.gateway.keys import add_key

    port = free_port()
    config = _config(tmp, port, upstream, off)
    headers: dict[str, str] = {}
    if off != "keys":
        add_key(tmp / "keys.json", f"file-{port}")
        key = asyncio.run(_runtime_key(f"sqlite:///{tmp}/llmgw-{port}.db"))
        headers["Authorization"] = f"Bearer {key}"
    command = ["serve", "-c", str(config), "--workers", str(workers), "--log-level", "warning"]
    if off == "metrics":
        args = [PYTHON, str(Path(__file__).resolve()), WITHOUT_METRICS, *command]
    else:
        args = [str(Path(PYTHON).parent / "llmgw"), *command]
    with running(args, port) as proc:
        url = f"http://127.0.0.1:{port}"
        _until_served(url, headers)
        yield url, proc.pid, headers


def _until_served(url: str, headers: dict[str, str], timeout: float = 180) -> None:
    """Wait until every worker knows the key: a few requests in a row answered 200
    (generous: on a busy machine a server can take a minute to start)."""
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    good = 0
    while good < 20:
        request = urllib.request.Request(f"{url}/v1/chat/completions", data=BODY,
                                         headers={"Content-Type": "application/json", **headers})
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                good = good + 1 if answer.status == 200 else 0
        except (urllib.error.URLError, OSError) as exc:
            good = 0
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not answer 200 within {timeout} s: "
                                   f"{exc}") from None
            time.sleep(0.2)


@contextlib.contextmanager
def vllm_router(upstream: str) -> Iterator[tuple[str, int, dict[str, str]]]:
    port = free_port()
    args = [str(VLLM_ROUTER), "--host", "127.0.0.1", "--port", str(port), "--worker-urls",
            upstream, "--policy", "round_robin", "--log-level", "warning",
            "--worker-startup-timeout-secs", "30", "--disable-retries"]
    with (BENCH / ".vllm-router.log").open("wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=log)
        try:
            wait_listening(port, proc, timeout=60)
            url = f"http://127.0.0.1:{port}"
            _until_served(url, {})
            yield url, proc.pid, {}
        finally:
            proc.terminate()
            proc.wait(10)


# ---------------------------------------------------------------- measuring


def throughput(served: Served, tmp: Path, duration: float, figures: Figures,
               upstream: str | None) -> None:
    """32 connections (CPU per request sampled around it); then, given the ``upstream``,
    1 connection to it and 1 through the hop, back to back."""
    with served() as (url, pid, headers):
        wrk_runs([url], 32, min(2.0, duration), tmp, headers)     # warm
        before = cpu_seconds(pid)
        busy = wrk_runs([url], 32, duration, tmp, headers)[0]
        used = cpu_seconds(pid) - before
        figures.rps.append(busy.rps)
        figures.cpu_us.append(used / max(1, busy.requests) * 1e6)
        figures.failed += busy.errors
        if upstream is not None:
            latency = wrk_runs([upstream], 1, duration, tmp)[0]
            one = wrk_runs([url], 1, duration, tmp, headers)[0]
            figures.added_p50.append(one.p50 - latency.p50)
            figures.added_p99.append(one.p99 - latency.p99)
            figures.failed += one.errors


def rounds(names: Sequence[str], makers: Sequence[Served], count: int, duration: float,
           tmp: Path, upstream: str | None) -> dict[str, Figures]:
    got = {name: Figures() for name in names}
    for round_ in range(count):
        shift = round_ % len(names)
        order = list(zip(names, makers, strict=True))
        for name, make in order[shift:] + order[:shift]:
            throughput(make, tmp, duration, got[name], upstream)
            f = got[name]
            print(f"  round {round_ + 1} {name:<22} {f.rps[-1]:9,.0f} req/s  "
                  f"{f.cpu_us[-1]:7.0f} µs CPU/req"
                  + (f"  added p50 {f.added_p50[-1]:.3f} ms, p99 {f.added_p99[-1]:.3f} ms"
                     if upstream else ""), flush=True)
    return got


def _ratio(a: list[float], b: list[float]) -> float:
    """The median over rounds of a[i] / b[i]."""
    return statistics.median(x / y for x, y in zip(a, b, strict=True))


def table(upstream: str, tmp: Path, count: int, duration: float) -> None:
    names = ["floor (pass-through)", "llmgw", "llmgw --workers 2"]
    makers: list[Served] = [lambda: floor(upstream), lambda: llmgw(upstream, tmp),
                            lambda: llmgw(upstream, tmp, workers=2)]
    if VLLM_ROUTER.exists():
        names.append("vllm-router")
        makers.append(lambda: vllm_router(upstream))
    else:
        print(f"(vllm-router left out: {VLLM_ROUTER} missing; run bench/vllm_router_venv.sh)")
    print(f"\ntable: {count} rounds; c=32 and c=1 runs of {duration:g} s each")
    got = rounds(names, makers, count, duration, tmp, upstream)
    base, peer = got[names[0]], got.get("vllm-router")
    print(f"\n{'':<22}{'req/s c=32':>11}{'/floor':>8}{'/vllm':>7}{'added p50':>11}"
          f"{'added p99':>11}{'CPU µs/req':>12}{'/floor':>8}{'/vllm':>7}{'per core/vllm':>15}")
    for name in names:
        f = got[name]
        to_peer = "" if peer is None else f"{_ratio(f.rps, peer.rps):>7.2f}"
        cpu_peer = "" if peer is None else f"{_ratio(f.cpu_us, peer.cpu_us):>7.2f}"
        per_core = "" if peer is None else f"{_ratio(peer.cpu_us, f.cpu_us):>15.2f}"
        print(f"{name:<22}{statistics.median(f.rps):>11,.0f}{_ratio(f.rps, base.rps):>8.2f}"
              f"{to_peer}{statistics.median(f.added_p50):>9.3f}ms"
              f"{statistics.median(f.added_p99):>9.3f}ms{statistics.median(f.cpu_us):>12.0f}"
              f"{_ratio(f.cpu_us, base.cpu_us):>8.2f}{cpu_peer}{per_core}"
              + (f"   ({f.failed} failed)" if f.failed else ""))
    print("targets: llmgw >= 0.80x the floor's req/s, <= 1.25x its CPU/req, >= 0.35x "
          "vllm-router per core, added p99 <= 1 ms")


def features(upstream: str, tmp: Path, count: int, duration: float) -> None:
    names = ["all on", *(f"{f} off" for f in FEATURES)]
    makers: list[Served] = [lambda: llmgw(upstream, tmp)]
    makers += [lambda f=f: llmgw(upstream, tmp, off=f) for f in FEATURES]  # type: ignore[misc]
    print(f"\nfeatures: {count} rounds; c=32 runs of {duration:g} s each")
    got = rounds(names, makers, count, duration, tmp, None)
    on = got["all on"]
    print(f"\n{'feature':<12}{'req/s off/on':>14}{'CPU/req on/off':>16}{'share of CPU/req':>18}")
    for feature in FEATURES:
        off = got[f"{feature} off"]
        share = statistics.median((a - b) / a for a, b in zip(on.cpu_us, off.cpu_us,
                                                                strict=True))
        print(f"{feature:<12}{_ratio(off.rps, on.rps):>14.3f}{_ratio(on.cpu_us, off.cpu_us):>16.3f}"
              f"{share:>17.1%}")
    print(f"all on: {statistics.median(on.rps):,.0f} req/s, "
          f"{statistics.median(on.cpu_us):.0f} µs CPU/req (target: each feature <= 5%)")


def _serve_without_metrics(argv: list[str]) -> None:
    """``llmgw`` with every metric's recording call a no-op (the ``metrics off`` variant)."""
    from prometheus_client import Counter, Gauge, Histogram

    def nothing(*_args: object, **_kwargs: object) -> None:
        return None

    Counter.inc = Gauge.inc = Gauge.dec = Histogram.observe = nothing  # type: ignore[method-assign,assignment]
    from llmgw.cli import main

    sys.argv = ["llmgw", *argv]
    main()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=int, default=5, help="whole seconds per wrk run")
    parser.add_argument("--parts", default="table,features")
    args = parser.parse_args()
    if not (shutil.which("nginx") and shutil.which("wrk")):
        sys.exit("this benchmark needs nginx and wrk (apt-get install nginx-light wrk)")
    tmp = Path(tempfile.mkdtemp(prefix="llmgw-hotpath-"))
    print(f"machine: {os.cpu_count()} cores; upstream nginx; load wrk -t1; medians of "
          f"per-round figures")
    with nginx_upstream(tmp) as upstream:
        parts = args.parts.split(",")
        if "table" in parts:
            table(upstream, tmp, args.rounds, args.duration)
        if "features" in parts:
            features(upstream, tmp, args.rounds, args.duration)
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    if sys.argv[1:2] == [WITHOUT_METRICS]:
        _serve_without_metrics(sys.argv[2:])
    else:
        main()
