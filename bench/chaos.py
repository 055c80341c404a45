"""Chaos under load: what clients see when replicas die, freeze, leave or are replaced.

    .venv/bin/python bench/chaos.py [--duration 30] [--fault-at 10] [--clients 20]
                                     [--scenarios baseline,kill,rollout,scale,freeze,
                                                  drain,restart,crash]

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
* ``freeze``: SIGSTOP of one replica's engine for 10 s, then SIGCONT;
* ``drain``: on Nomad instead — the real Nomad backend against the fake Nomad
  (``llmgw.testing.chaos_nomad``), four CPU nodes, three allocations each a
  simulated engine process, the model's ``timeouts.drain`` at 10 s (the engine
  task's ``shutdown_delay``); the node of a replica serving a stream is
  drained: its service is deregistered, its tasks killed 10 s later, and its
  replacement placed on another node;
* ``restart``: two gateway processes on one SQLite store in front of the
  three replicas (``llmgw.testing.chaos.GatewayProcess``), the clients spread
  over both and a refused connection sent to the other instance, as a load
  balancer does; one instance gets SIGTERM (it answers what it has in flight,
  then exits) and is started again on its port;
* ``crash``: the same with SIGKILL instead of SIGTERM.

For ``restart`` and ``crash`` the gateway's own counters live in the
processes, so broken/resumed/retries read ``-``; what is printed instead is
how many requests were in flight on the stopped instance (started before it
ended, finished after the signal) and how many of them, and of all the
others, failed.

Printed per scenario: requests, client-visible errors (streaming and not),
broken streams and how many were resumed, and the median, p95 and maximum
duration of streaming and JSON requests.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import signal
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from llmgw.catalog.decode import convert
from llmgw.catalog.model import Model
from llmgw.testing.chaos import GatewayProcess, Load, Outcome, SimFleet, drive, gateway
from llmgw.testing.chaos_nomad import MIRROR, NomadChaos
from llmgw.testing.simengine import SimSpec

SCENARIOS = ("baseline", "kill", "rollout", "scale", "freeze", "drain", "restart", "crash")
INSTANCE = {"restart": signal.SIGTERM, "crash": signal.SIGKILL}

ENTRY: dict[str, object] = {
    "name": "sim", "source": "/models/sim", "engine": "vllm",
    "profiles": [{"name": "sim", "cpu_cores": 1, "memory": "1GiB"}],
    "timeouts": {"idle": "2s", "drain": "60s"}}


def model() -> Model:
    return convert(ENTRY, Model)


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


async def two_instances(name: str, fleet: SimFleet, args: argparse.Namespace
                        ) -> tuple[Load, dict[str, Any]]:
    """Two gateway processes; instance 0 stopped with the scenario's signal at
    ``--fault-at`` and started again once it has ended."""
    loop = asyncio.get_running_loop()
    replicas = [r.address for r in fleet.runners if r.address]
    with tempfile.TemporaryDirectory() as tmp:
        first, second = (GatewayProcess(ENTRY, replicas, Path(tmp) / "store.db")
                         for _ in range(2))
        try:
            await first.start()
            await second.start()
            load = Load()
            driving = asyncio.create_task(drive([first.url, second.url], "sim", load,
                                                clients=args.clients))
            await asyncio.sleep(args.fault_at)
            signalled = loop.time()
            await first.stop(INSTANCE[name])
            ended = loop.time()
            await first.start()
            await asyncio.sleep(max(0.0, args.duration - (loop.time() - signalled)
                                    - args.fault_at))
            load.stop.set()
            await driving
        finally:
            await first.stop()
            await second.stop()

    def on_it(o: Outcome) -> bool:
        return o.via == 0 and o.started < ended and o.started + o.latency > signalled

    in_flight = [o for o in load.outcomes if on_it(o)]
    return load, {
        "in_flight": len(in_flight), "in_flight_failed": sum(1 for o in in_flight if o.error),
        "others_failed": sum(1 for o in load.outcomes if o.error and not on_it(o)),
        "away_s": ended - signalled}


async def one_instance(name: str, fleet: SimFleet, args: argparse.Namespace
                       ) -> tuple[Load, int, int, int]:
    """The gateway in this process; the scenario's fault at ``--fault-at``. The load and
    the gateway's counts of broken streams, resumptions and retries."""
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
    return load, int(broken), int(resumed), int(retries)


async def on_nomad(args: argparse.Namespace) -> tuple[Load, int, int, int, str]:
    """The gateway before the Nomad backend and the fake Nomad; at ``--fault-at`` the node
    of a replica serving a stream is drained."""
    entry = {**ENTRY, "source": f"{MIRROR}/sim/q8_0/sim.gguf", "engine": "llama.cpp",
             "profiles": [{"name": "cpu", "cpu_cores": 8, "memory": "4GiB"}],
             "scaling": {"min": 3}, "timeouts": {"idle": "2s", "drain": "10s"}}
    sim = convert(entry, Model)
    chaos = NomadChaos(sim, SimSpec())
    async with chaos.running(3) as backend, gateway(sim, backend) as (url, gw):
        load = Load()
        driving = asyncio.create_task(drive(url, "sim", load, clients=args.clients))
        await asyncio.sleep(args.fault_at)
        while not any(gw.balancer.answering(u) for u in backend.endpoints("sim")):
            await asyncio.sleep(0.01)
        victim = next(u for u in backend.endpoints("sim") if gw.balancer.answering(u))
        node = chaos.node_of(victim)
        chaos.nomad.set_node(node, drain=True)
        await asyncio.sleep(args.duration - args.fault_at)
        load.stop.set()
        await driving
        m = gw.metrics
        broken = sum(m.upstream_errors.labels("sim", reason)._value.get()
                     for reason in ("stream_broken", "idle_timeout"))
        resumed = m.resumed.labels("sim")._value.get()
        retries = m.retries.labels("sim")._value.get()
        nodes = {n.id: n.name for n in chaos.nomad.nodes}
        now_on = sorted(nodes[a.node_id] for a in chaos.nomad.allocations(chaos.job))
        moved = (f"drained {node}: {len(chaos.workloads.stopped)} engine(s) stopped, "
                 f"replicas now on {', '.join(now_on)}")
    return load, int(broken), int(resumed), int(retries), moved


async def scenario(name: str, args: argparse.Namespace) -> dict[str, object]:
    extra: dict[str, Any] = {}
    broken = resumed = retries = None
    if name == "drain":
        load, broken, resumed, retries, extra["moved"] = await on_nomad(args)
    else:
        low = random.randrange(40000, 48000, 50)
        fleet = SimFleet("sim", SimSpec(), (low, low + 49))
        try:
            await fleet.scale(3, drain=0)
            if name in INSTANCE:
                load, extra = await two_instances(name, fleet, args)
            else:
                load, broken, resumed, retries = await one_instance(name, fleet, args)
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
        "broken": broken, "resumed": resumed, "retries": retries,
        "stream_p50": pct(streams, 0.5), "stream_p95": pct(streams, 0.95),
        "stream_max": max(streams, default=float("nan")),
        "json_p50": pct(plain, 0.5), "json_p95": pct(plain, 0.95),
        "json_max": max(plain, default=float("nan")), **extra,
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
              f"| {dash(r['broken'])} | {dash(r['resumed'])} | {dash(r['retries'])} "
              f"| {r['stream_p50']:.2f}/{r['stream_p95']:.2f}/{r['stream_max']:.2f} "
              f"| {r['json_p50']:.2f}/{r['json_p95']:.2f}/{r['json_max']:.2f} |")
    for r in rows:
        if "moved" in r:
            print(f"{r['scenario']}: {r['moved']}")
        if "in_flight" in r:
            print(f"{r['scenario']}: instance stopped for {r['away_s']:.2f} s; "
                  f"{r['in_flight']} requests in flight on it, {r['in_flight_failed']} of "
                  f"them failed; {r['others_failed']} other requests failed")


def dash(value: object) -> str:
    return "-" if value is None else str(value)


if __name__ == "__main__":
    asyncio.run(main())
