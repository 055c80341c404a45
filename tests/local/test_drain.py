"""A replica the embedded scheduler stops on purpose drains first (stand-in engines).

The engines are Python's ``http.server`` (as in ``test_supervisor``): what is
tested is the scheduler's order — out of the endpoints, then the requests in
flight, then the process — not an engine.
"""

from __future__ import annotations

import sys
from pathlib import Path

import msgspec

from llmgw.catalog.build import build_catalog
from llmgw.catalog.model import Model, Profile, Scaling
from llmgw.scheduler.local.backend import LocalBackend
from llmgw.scheduler.local.engines import EngineLaunch
from llmgw.scheduler.local.resources import Grant

from .conftest import alive, cpu_model, until


def stand_in_engines(backend: LocalBackend, directory: Path) -> None:
    async def prepare(m: Model, profile: Profile, grant: Grant, port: int) -> EngineLaunch:
        return EngineLaunch(argv=[sys.executable, "-m", "http.server", str(port),
                                  "--bind", "127.0.0.1", "--directory", str(directory)],
                            env={}, health_path="/", port=port)

    backend._prepare = prepare  # type: ignore[method-assign]


async def test_a_scale_down_withdraws_the_replica_then_waits_for_its_requests(
        backend: LocalBackend, tmp_path: Path) -> None:
    """2 → 1: the leaving replica leaves the endpoints at once, its engine keeps running
    while the gateway has a request on it, and stops when that request is done."""
    stand_in_engines(backend, tmp_path)
    counts: dict[str, int] = {}
    asked: list[str] = []

    def in_flight(address: str) -> int:
        asked.append(address)
        return counts.get(address, 0)

    backend.in_flight = in_flight
    two = cpu_model("pair", str(tmp_path / "x.gguf"), min_=2)
    await backend.apply(build_catalog([two]))
    await until(lambda: len(backend.endpoints("pair")) == 2, "two replicas to be healthy")
    before = set(backend.endpoints("pair"))
    pids = {r.address: r.pid for r in backend._runners.values()}
    for address in before:
        counts[address] = 1            # a request in flight on each
    await backend.apply(build_catalog([msgspec.structs.replace(two, scaling=Scaling(min=1))]))
    await until(lambda: len(backend.endpoints("pair")) == 1, "one replica to be withdrawn")
    (leaving,) = before - set(backend.endpoints("pair"))
    leaving_pid = pids[leaving]
    assert leaving_pid is not None
    await until(lambda: asked.count(leaving) >= 3, "the drain to count its requests")
    assert alive(leaving_pid)
    assert len(await backend.replicas("pair")) == 2   # still there, stopping
    counts[leaving] = 0
    await until(lambda: not alive(leaving_pid), "the drained engine to stop")

    async def one_left() -> bool:
        return len(await backend.replicas("pair")) == 1
    await until(one_left, "the stopped replica to be gone")
