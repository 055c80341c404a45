"""The gateway's hot path with routing: policies, before/after, and `--workers N`.

    .venv/bin/python bench/routing_hotpath.py [--duration 10] [--rounds 3]
                                              [--baseline CHECKOUT]

The gateway benchmark's set-up (``gateway_bench.py``): nginx returning a
canned chat completion, wrk with 32 connections, everything on loopback. Each
figure is the median of ``--rounds`` runs, the runs of the compared
configurations interleaved so that a noisy neighbour on this shared machine
hits them alike:

1. one gateway worker (``gateway_serve.py``) with ``routing.policy``
   ``least-outstanding`` against ``prefix-affinity`` (which parses the prompt
   and hashes its prefix on every request), the model's two replica URLs
   both leading to the one nginx;
2. the same gateway as built from ``--baseline`` (a checkout of the code
   before this change, run with that checkout's own virtualenv, with the one
   URL per model it understands), when given;
3. ``llmgw serve --workers 1`` against ``--workers 2`` (the whole server, an
   external model in front of nginx).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from gateway_bench import free_port, load, nginx_upstream, running  # noqa: E402

PYTHON = sys.executable


@contextlib.contextmanager
def gateway(upstream: str, policy: str, root: Path = BENCH.parent,
            python: str = PYTHON, replicas: int = 2) -> Iterator[str]:
    port = free_port()
    args = [str(Path(python).parent / "uvicorn"), "--host", "127.0.0.1", "--port", str(port),
            "--workers", "1", "--backlog", "4096", "--no-access-log", "--log-level",
            "warning", "--app-dir", str(root / "bench"), "gateway_serve:app"]
    # Two replica URLs for the one nginx (``/v1`` is stripped when forwarding),
    # so that prefix-affinity has a choice to make and reads every prompt.
    urls = "|".join([upstream, f"{upstream}/v1"][:replicas])
    env = {"LLMGW_BENCH_MODELS": f"bench={urls}",
           "LLMGW_BENCH_ROUTING": json.dumps({"policy": policy}) if policy else "{}"}
    with running(args, port, env=env, cwd=root):
        yield f"http://127.0.0.1:{port}"


@contextlib.contextmanager
def served(upstream: str, workers: int, tmp: Path) -> Iterator[str]:
    port = free_port()
    config = tmp / f"server-{workers}.yaml"
    config.write_text(f"listen: 127.0.0.1:{port}\ndatabase: sqlite:///{tmp}/llmgw-{workers}.db\n"
                      f"models:\n  - name: bench\n    upstream: [{upstream}]\n")
    args = [str(Path(PYTHON).parent / "llmgw"), "serve", "-c", str(config), "--workers",
            str(workers), "--log-level", "warning"]
    with running(args, port):
        time.sleep(2.0)     # every worker listening
        yield f"http://127.0.0.1:{port}"


def compare(names: list[str], makers: list[Callable[[], contextlib.AbstractContextManager[str]]],
            rounds: int, duration: float, tmp: Path) -> dict[str, list[float]]:
    got: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(rounds):
        for name, make in zip(names, makers, strict=True):
            with make() as url:
                rps, _median, bad = load(url, 32, duration, tmp)
                if bad:
                    print(f"    ({name}: {bad} failed responses)")
                got[name].append(rps)
    for name in names:
        print(f"  {name:<44} {statistics.median(got[name]):9,.0f} req/s   "
              f"(runs: {', '.join(f'{x:,.0f}' for x in got[name])})", flush=True)
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", type=Path, help="a checkout of the code before")
    parser.add_argument("--skip-workers", action="store_true")
    args = parser.parse_args()
    if not (shutil.which("nginx") and shutil.which("wrk")):
        sys.exit("this benchmark needs nginx and wrk (apt-get install nginx-light wrk)")
    tmp = Path(tempfile.mkdtemp(prefix="llmgw-hotpath-"))
    print(f"machine: {os.cpu_count()} cores; upstream nginx; load wrk -c32; "
          f"{args.rounds} rounds of {args.duration:g}s, medians")
    with nginx_upstream(tmp) as upstream:
        print("\n1. one gateway worker, small chat completion, concurrency 32")
        names = ["least-outstanding", "prefix-affinity"]
        makers = [lambda: gateway(upstream, "least-outstanding"),
                  lambda: gateway(upstream, "prefix-affinity")]
        if args.baseline:
            base_py = args.baseline / ".venv" / "bin" / "python"
            names.append(f"before ({args.baseline})")
            # The code before knows one URL per model only (and one policy).
            makers.append(lambda: gateway(upstream, "", args.baseline, str(base_py), 1))
        got = compare(names, makers, args.rounds, args.duration, tmp)
        lo, pa = statistics.median(got[names[0]]), statistics.median(got[names[1]])
        print(f"  prefix-affinity / least-outstanding: {pa / lo:.3f}   (target >= 0.90)")
        if args.baseline:
            before = statistics.median(got[names[2]])
            print(f"  after / before: least-outstanding {lo / before:.3f}, "
                  f"prefix-affinity {pa / before:.3f}")
        if not args.skip_workers:
            print("\n2. llmgw serve, external model in front of nginx, concurrency 32")
            got = compare(["--workers 1", "--workers 2"],
                          [lambda: served(upstream, 1, tmp), lambda: served(upstream, 2, tmp)],
                          args.rounds, args.duration, tmp)
            one, two = (statistics.median(got[k]) for k in ("--workers 1", "--workers 2"))
            print(f"  --workers 2 / --workers 1: {two / one:.2f}   (target >= 1.7)")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
