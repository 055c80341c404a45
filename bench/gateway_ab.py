"""Does this tree's gateway serve chat completions as fast as another revision's? Alternating A/B.

    .venv/bin/python bench/gateway_ab.py [--ref main] [--b-ref REV] [--rounds 6] [--duration 8]

The gateway of git revision ``--ref`` (A, exported to a temporary directory)
and of this working tree (B) are started in turn, one worker each, in front
of the same upstream (nginx, or the Python upstream), and loaded the way
``gateway_bench.py`` loads them: throughput at concurrency 32 (with wrk, also
the CPU time the gateway's process spent per request), median latency at
concurrency 1. Alternating A and B for several rounds spreads a
shared machine's changing load over both, so the medians compare the code,
not the moment.

The editable install would import this tree's ``llmgw`` in both; A's
processes get a ``sitecustomize`` that removes the editable finder, so its
own copy on PYTHONPATH is imported (checked before measuring).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import statistics
import subprocess
import tarfile
import tempfile
from pathlib import Path

import gateway_bench as gb

ROOT = Path(__file__).resolve().parent.parent
SITECUSTOMIZE = '''import sys

# Import llmgw from this directory (PYTHONPATH), not from the editable install.
sys.meta_path[:] = [f for f in sys.meta_path
                    if not getattr(f, "__module__", "").startswith("__editable__")]
'''


# B is served the way `llmgw serve` serves it: uvicorn with llmgw's connection
# limits (llmgw.connection) at their defaults.
B_SERVER = ("--http", "llmgw.connection:GuardedProtocol", "--limit-concurrency", "4096")


def export(ref: str, into: Path) -> None:
    data = subprocess.run(["git", "-C", str(ROOT), "archive", ref], capture_output=True,
                          check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    (into / "sitecustomize.py").write_text(SITECUSTOMIZE)


def use(tree: Path | None) -> None:
    """Make the next gateway process import llmgw from ``tree`` (None: this working tree)."""
    if tree is None:
        os.environ.pop("PYTHONPATH", None)
        gb.BENCH = ROOT / "bench"
    else:
        os.environ["PYTHONPATH"] = str(tree)
        gb.BENCH = tree / "bench"


def check_imports(tree: Path) -> None:
    """Fail unless a process started as A's are imports llmgw from ``tree``."""
    out = subprocess.run([gb.PYTHON, "-c", "import llmgw; print(llmgw.__file__)"],
                         env={**os.environ, "PYTHONPATH": str(tree)}, cwd=tempfile.gettempdir(),
                         capture_output=True, text=True, check=True).stdout.strip()
    if not out.startswith(str(tree)):
        raise SystemExit(f"A would import llmgw from {out}, not from {tree}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ref", default="main")
    parser.add_argument("--b-ref", help="B is this revision rather than the working tree")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--duration", type=int, default=8, help="whole seconds (wrk)")
    parser.add_argument("--guard-both", action="store_true",
                        help="serve A as B is served (a revision that has llmgw.connection)")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="llmgw-ab-"))
    export(args.ref, base)
    check_imports(base)
    b_tree: Path | None = None
    if args.b_ref:
        b_tree = Path(tempfile.mkdtemp(prefix="llmgw-ab-b-"))
        export(args.b_ref, b_tree)
        check_imports(b_tree)
    tmp = Path(tempfile.mkdtemp(prefix="llmgw-ab-run-"))
    rps: dict[str, list[float]] = {"A": [], "B": []}
    latency: dict[str, list[float]] = {"A": [], "B": []}
    cpu: dict[str, list[float]] = {"A": [], "B": []}
    use_wrk = shutil.which("wrk") is not None
    use_nginx = shutil.which("nginx") is not None and use_wrk
    print(f"A: {args.ref}; B: {args.b_ref or 'the working tree'}; upstream: "
          f"{'nginx' if use_nginx else 'python'}"
          f"; {os.cpu_count()} cores")
    with contextlib.ExitStack() as stack:
        static = stack.enter_context(gb.nginx_upstream(tmp) if use_nginx
                                     else gb.python_upstream(100, 0.1))
        for round_ in range(args.rounds):
            for name, tree in (("A", base), ("B", b_tree)):
                use(tree)
                extra = B_SERVER if name == "B" or args.guard_both else ()
                with gb.gateway("uvicorn", {"bench": static}, extra) as (url, pid):
                    gb.load(url, 32, 2.0, tmp)
                    before = gb.cpu_seconds(pid)
                    busy = gb.wrk_runs([url], 32, args.duration, tmp)[0] if use_wrk else None
                    used = gb.cpu_seconds(pid) - before
                    r, _, bad = (busy.rps, busy.p50, busy.errors) if busy is not None else \
                        gb.load(url, 32, args.duration, tmp, warm=False)
                    _, median, _ = gb.load(url, 1, float(max(2, round(args.duration / 2))),
                                           tmp)
                rps[name].append(r)
                latency[name].append(median)
                if busy is not None:
                    cpu[name].append(used / max(1, busy.requests) * 1e6)
                print(f"round {round_ + 1} {name}: {r:,.0f} req/s at concurrency 32"
                      + (f" ({cpu[name][-1]:.0f} us CPU a request)" if busy is not None else "")
                      + f", median {median:.3f} ms at 1, failed {bad}", flush=True)
    use(None)
    a, b = statistics.median(rps["A"]), statistics.median(rps["B"])
    print(f"\nmedian throughput: A {a:,.0f} req/s, B {b:,.0f} req/s, B/A {b / a:.3f}")
    print(f"median latency at concurrency 1: A {statistics.median(latency['A']):.3f} ms, "
          f"B {statistics.median(latency['B']):.3f} ms")
    if cpu["A"]:
        ratios = [b / a for a, b in zip(cpu["A"], cpu["B"], strict=True)]
        print(f"CPU per request (the gateway's process tree, at concurrency 32): A "
              f"{statistics.median(cpu['A']):.0f} us, B {statistics.median(cpu['B']):.0f} us, "
              f"B/A median of the rounds' ratios {statistics.median(ratios):.3f}")
    shutil.rmtree(base, ignore_errors=True)
    if b_tree is not None:
        shutil.rmtree(b_tree, ignore_errors=True)
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
