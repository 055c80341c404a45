"""Chaos under load: what clients see when replicas die, freeze, leave or are replaced.

    .venv/bin/python bench/chaos.py [--duration 30] [--fault-at 10] [--clients 20]
                                     [--scenarios baseline,kill,rollout,scale,freeze]

Each scenario starts a fresh model of three replicas — simulated engines
(``llmgw.testing.simengine``, default timing: about 65 tokens/s per stream)
run as real child processes by the embedded scheduler's supervisor
(``llmgw.testing.chaos.SimFleet``) — and the gateway in this process in
front of them, with the model's ``timeouts.idle`` at 2 s and ``timeouts.drain``
at 60 s. ``--clients`` clients on loopback send requests back to back for
``--duration`` seconds: half stream 300-token answers, half ask for 40-token
JSON ones. Every answer is checked against the deterministic engine's text
(an uninterrupted answer). At ``--fault-at`` seconds:

* ``baseline``: nothing (the latency reference);
* ``kill``: SIGKILL of one replica's engine (the supervisor restarts it);
* ``rollout``: every replica replaced in turn, the new one healthy before the
  old one drains;
* ``scale``: 3 → 1, the two leaving drained;
* ``freeze``: SIGSTOP of one replica's engine for 10 s, then SIGCONT.

Printed per scenario: requests, client-visible errors (streaming and not),
broken streams and how many were resumed, and the median, p95 and maximum
duration of streaming and JSON requests.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
from collections.abc import Awaitable, Callable

from llmgw.catalog.decode import convert
from llmgw.catalog.model import Model
from llmgw.testing.chaos import Load, SimFleet, drive, gateway
from llmgw.testing.simengine import SimSpec

SCENARIOS = ("baseline", "kill", "rollout", "scale", "freeze")


def model() -> Model:
    return convert({"name": "sim", "source": "/models/sim", "engine": "vllm",
                    "profiles": [{"name": "sim", "cpu_cores": 1, "memory": "1GiB"}],
                    "timeouts": {"idle": "2s", "drain": "60s"}}, Model)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def fault_of(name: str, fleet: SimFleet) -> Callable[[], Awaitable[None]]:
    async def nothing() -> None:
        return None

    async def kill() -> None:
        fleet.kill(0)

    async def rollout() -> None:
        await fleet.rollout(drain=60)

    async def scale() -> None:
        await fleet.scale(1, drain=60)

    async def freeze() -> None:
        await fleet.freeze(10.0, 0)

    return {"baseline": nothing, "kill": kill, "rollout": rollout, "scale": scale,
            "freeze": freeze}[name]


async def scenario(name: str, args: argparse.Namespace) -> dict[str, object]:
    low = random.randrange(40000, 48000, 50)
    fleet = SimFleet("sim", SimSpec(), (low, low + 49))
    try:
        await fleet.scale(3, drain=0)
        async with gateway(model(), fleet) as (url, gw):
            load = Load()
            driving = asyncio.create_task(drive(url, "sim", load, clients=args.clients))
            await asyncio.sleep(args.fault_at)
            fault = asyncio.create_task(fault_of(name, fleet)())
            await asyncio.sleep(args.duration - args.fault_at)
            load.stop.set()
            await driving
            await fault
            m = gw.metrics
            broken = sum(m.upstream_errors.labels("sim", reason)._value.get()
                         for reason in ("stream_broken", "idle_timeout"))
            resumed = m.resumed.labels("sim")._value.get()
            retries = m.retries.labels("sim")._value.get()
    finally:
        await fleet.close()
    streams = [o.latency for o in load.outcomes if o.stream]
    plain = [o.latency for o in load.outcomes if not o.stream]
    for outcome in load.errors()[:3]:
        print(f"  {name}: {'stream' if outcome.stream else 'json'} error: {outcome.error}",
              file=sys.stderr)
    return {
        "scenario": name, "requests": len(load.outcomes),
        "errors_stream": len(load.errors(stream=True)),
        "errors_json": len(load.errors(stream=False)),
        "broken": int(broken), "resumed": int(resumed), "retries": int(retries),
        "stream_p50": pct(streams, 0.5), "stream_p95": pct(streams, 0.95),
        "stream_max": max(streams, default=float("nan")),
        "json_p50": pct(plain, 0.5), "json_p95": pct(plain, 0.95),
        "json_max": max(plain, default=float("nan")),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--fault-at", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    args = parser.parse_args()
    names = [s for s in args.scenarios.split(",") if s]
    unknown = set(names) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios {sorted(unknown)}; choose from {', '.join(SCENARIOS)}")
    if not 0 < args.fault_at < args.duration <= 120 or not 0 < args.clients <= 64:
        parser.error("need 0 < --fault-at < --duration <= 120 and 1..64 clients")
    print(f"{args.clients} clients (half streaming 300 tokens, half 40-token JSON), "
          f"{args.duration:g} s, fault at {args.fault_at:g} s; 3 simulated replicas")
    rows = [await scenario(name, args) for name in names]
    head = ("scenario", "requests", "errors stream/json", "broken streams", "resumed",
            "retries", "stream p50/p95/max s", "json p50/p95/max s")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        print(f"| {r['scenario']} | {r['requests']} | {r['errors_stream']}/{r['errors_json']} "
              f"| {r['broken']} | {r['resumed']} | {r['retries']} "
              f"| {r['stream_p50']:.2f}/{r['stream_p95']:.2f}/{r['stream_max']:.2f} "
              f"| {r['json_p50']:.2f}/{r['json_p95']:.2f}/{r['json_max']:.2f} |")


if __name__ == "__main__":
    asyncio.run(main())
