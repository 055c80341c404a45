"""Engine processes with real child processes (small stand-in engines, no model needed).

The stand-in engine is Python's own ``http.server``: a real process that binds
a port and answers GET, which is all the supervisor relies on.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import socket
import subprocess
import sys
import textwrap
from collections import deque
from pathlib import Path

import pytest

from llmgw.scheduler.local.engines import EngineLaunch
from llmgw.scheduler.local.supervisor import (
    EngineProcess,
    LaunchError,
    PortPool,
    ReplicaRunner,
    Timing,
    backoff,
    probe,
)

from .conftest import alive, group_members, port_range, until

TIMING = Timing(stop_grace=3.0, backoff_base=0.2, backoff_max=1.0, probe_running=0.3,
                crash_loop_after=3)


def http_engine(directory: Path):  # type: ignore[no-untyped-def]
    async def prepare(port: int) -> EngineLaunch:
        return EngineLaunch(argv=[sys.executable, "-m", "http.server", str(port),
                                  "--bind", "127.0.0.1", "--directory", str(directory)],
                            env={}, health_path="/", port=port)
    return prepare


def crashing_engine(code: int = 3):  # type: ignore[no-untyped-def]
    script = ("import sys\nprint('loading weights from /models/broken.gguf')\n"
              f"print('fatal: tensor blk.0.attn_q.weight is missing')\nsys.exit({code})")

    async def prepare(port: int) -> EngineLaunch:
        return EngineLaunch(argv=[sys.executable, "-c", script], env={}, health_path="/",
                            port=port)
    return prepare


def runner(prepare, events: list[tuple[str, str]] | None = None,  # type: ignore[no-untyped-def]
           timing: Timing = TIMING) -> ReplicaRunner:
    low, high = port_range()
    return ReplicaRunner(
        id="m-1", model="m", profile="cpu", fingerprint="sha256:0", seq=1, node="box",
        cpus=(), reserved_memory=None, prepare=prepare, ports=PortPool(low, high),
        timing=timing,
        on_change=lambda r, kind, msg: events.append((kind, msg)) if events is not None else None,
    )


def test_backoff_doubles_up_to_its_ceiling() -> None:
    """1 s, 2 s, 4 s … capped, and nothing before the first failure."""
    t = Timing(backoff_base=1.0, backoff_max=60.0)
    assert [backoff(n, t) for n in (0, 1, 2, 3, 7, 20)] == [0.0, 1.0, 2.0, 4.0, 60.0, 60.0]


def listener() -> socket.socket:
    """A socket another program might hold: listening on a port the kernel chose."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


def test_a_port_with_a_listener_is_skipped() -> None:
    """A port another program listens on is never handed to an engine."""
    with listener() as other:
        taken = other.getsockname()[1]
        pool = PortPool(taken, min(taken + 20, 65535))
        assert pool.acquire() != taken


def test_released_ports_are_not_reused_at_once() -> None:
    """The search moves on, so a gateway's stale address does not reach another replica."""
    low, high = port_range()
    pool = PortPool(low, high)
    first = pool.acquire()
    pool.release(first)
    assert pool.acquire() == first + 1


def test_a_port_another_llmgw_holds_is_skipped_before_its_engine_listens(
        tmp_path: Path) -> None:
    """Two servers on one host (two pools, as two processes would have): a port one
    holds, whose engine has not bound it yet, is never handed out by the other; its
    claim ends with its release, or with the process that held it.

    Which port a pool picks depends on what else listens on the machine, so the
    positive checks ask the claim itself rather than expecting a number."""
    low, high = port_range()
    first = PortPool(low, high, claims=tmp_path)
    second = PortPool(low, high, claims=tmp_path)
    mine = first.acquire()
    with pytest.raises(LaunchError, match="no free port"):
        PortPool(mine, mine, claims=tmp_path).acquire()     # nothing listens on it yet
    theirs = second.acquire()
    assert theirs != mine
    first.release(mine)
    assert second._claim(mine)                               # free again for another
    second.release(mine)
    with subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
            import pathlib, time
            from llmgw.scheduler.local.supervisor import PortPool
            pool = PortPool({low}, {high}, claims=pathlib.Path({str(tmp_path)!r}))
            print(pool.acquire(), flush=True)
            time.sleep(600)
            """)], stdout=subprocess.PIPE, text=True) as holder:
        try:
            assert holder.stdout is not None
            held = int(holder.stdout.readline())
            with pytest.raises(LaunchError, match="no free port"):
                PortPool(held, held, claims=tmp_path).acquire()
        finally:
            holder.kill()
    assert first._claim(held)                                # its claims ended with it
    first.release(held)


def test_no_free_port_is_an_error_naming_the_range() -> None:
    """A full range says which setting to widen."""
    with listener() as other:
        taken = other.getsockname()[1]
        with pytest.raises(LaunchError, match=rf"no free port .* in {taken}-{taken} .*port_range"):
            PortPool(taken, taken).acquire()


async def test_probe_is_true_only_for_a_2xx_answer(tmp_path: Path) -> None:
    """A listening server answering 200 passes; 404 and a closed port fail."""
    low, high = port_range()
    pool = PortPool(low, high)
    port = pool.acquire()
    launch = await http_engine(tmp_path)(port)
    proc = EngineProcess("probe", launch, (), deque(maxlen=50))
    await proc.start()
    try:
        await until(lambda: probe("127.0.0.1", port, "/", 2.0), "the http server to answer", 30)
        assert not await probe("127.0.0.1", port, "/missing", 2.0)
        assert not await probe("127.0.0.1", pool.acquire(), "/", 2.0)
    finally:
        await proc.stop(3.0)


async def test_stop_kills_an_engine_that_ignores_sigterm_and_its_children() -> None:
    """SIGTERM, then SIGKILL after the grace period; nothing of the group survives."""
    script = textwrap.dedent("""\
        import signal, subprocess, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        print("ready", flush=True)
        time.sleep(300)
    """)
    launch = EngineLaunch(argv=[sys.executable, "-c", script], env={}, health_path="/", port=0)
    lines: deque[str] = deque(maxlen=10)
    proc = EngineProcess("stubborn", launch, (), lines)
    await proc.start()
    pid = proc.pid
    assert pid is not None
    await until(lambda: "ready" in lines, "the engine to start its child", 30)
    assert len(group_members(pid)) == 2
    loop = asyncio.get_running_loop()
    began = loop.time()
    await proc.stop(1.0)
    assert loop.time() - began >= 1.0
    assert proc.returncode == -signal.SIGKILL
    await until(lambda: not group_members(pid), "the engine's group to be gone", 10)


async def test_the_guard_pins_the_engine_to_its_cores() -> None:
    """The engine runs only on the CPU ids it reserved."""
    cpu = sorted(os.sched_getaffinity(0))[0]
    launch = EngineLaunch(argv=[sys.executable, "-c",
                                "import os; print(sorted(os.sched_getaffinity(0)))"],
                          env={}, health_path="/", port=0)
    lines: deque[str] = deque(maxlen=10)
    proc = EngineProcess("pinned", launch, (cpu,), lines)
    await proc.start()
    await asyncio.wait_for(proc.exited.wait(), 30)
    assert list(lines) == [str([cpu])]


def test_an_engine_dies_with_a_sigkilled_llmgw(tmp_path: Path) -> None:
    """PR_SET_PDEATHSIG: killing llmgw with SIGKILL takes its engines with it."""
    script = textwrap.dedent("""\
        import asyncio, collections, sys
        from llmgw.scheduler.local.engines import EngineLaunch
        from llmgw.scheduler.local.supervisor import EngineProcess

        async def main():
            launch = EngineLaunch(argv=[sys.executable, "-c", "import time; time.sleep(300)"],
                                  env={}, health_path="/", port=0)
            proc = EngineProcess("orphan", launch, (), collections.deque())
            await proc.start()
            print(proc.pid, flush=True)
            await asyncio.sleep(300)

        asyncio.run(main())
    """)
    with subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                          cwd=Path(__file__).parents[2]) as parent:
        try:
            assert parent.stdout is not None
            engine = int(parent.stdout.readline())
            assert alive(engine)
            parent.kill()
            parent.wait(30)
            asyncio.run(until(lambda: not alive(engine), "the orphaned engine to die", 30))
        finally:
            parent.kill()
            parent.wait(30)


async def test_a_replica_becomes_healthy_and_is_restarted_after_a_kill(tmp_path: Path) -> None:
    """A killed engine is restarted with back-off and serves again on a port of its own."""
    events: list[tuple[str, str]] = []
    r = runner(http_engine(tmp_path), events)
    r.start()
    try:
        await until(lambda: r.healthy, "the replica to become healthy", 60)
        assert r.state == "running"
        first = r.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        await until(lambda: r.restarts == 1 and r.healthy, "a restart to become healthy", 60)
        assert r.pid != first
        assert not alive(first)
        assert "killed by SIGKILL" in r.message
        kinds = [k for k, _ in events]
        assert kinds[:4] == ["loading", "ready", "failed", "loading"]
    finally:
        await r.stop()
    assert r.state == "stopped"
    assert r.pid is None


async def test_a_crash_loop_shows_the_engines_last_lines() -> None:
    """An engine that exits at once is retried with back-off; the loop carries its output."""
    r = runner(crashing_engine(3))
    r.start()
    try:
        await until(lambda: r.crash_loop, "a crash loop", 60)
        assert r.state == "failed"
        assert not r.healthy
        assert r.message.startswith("crash loop: ")
        assert "the engine exited with status 3" in r.message
        assert "fatal: tensor blk.0.attn_q.weight is missing" in r.message
    finally:
        await r.stop()


async def test_a_launch_that_cannot_be_prepared_is_a_failure_with_its_reason() -> None:
    """A missing model file fails the replica with the sentence, and is retried."""
    async def missing(port: int) -> EngineLaunch:
        raise LaunchError("model file '/models/gone.gguf' does not exist")

    r = runner(missing)
    r.start()
    try:
        await until(lambda: r.restarts >= 1, "a retry", 30)
        assert "model file '/models/gone.gguf' does not exist" in r.message
        assert r.port is None
    finally:
        await r.stop()


async def test_stopping_a_replica_leaves_no_process(tmp_path: Path) -> None:
    """stop() returns only once the engine and its group are gone."""
    r = runner(http_engine(tmp_path))
    r.start()
    await until(lambda: r.healthy, "the replica to become healthy", 60)
    pid = r.pid
    assert pid is not None
    await r.stop()
    assert not alive(pid)
    assert not group_members(pid)


async def test_a_port_taken_while_the_engine_loads_is_retried_elsewhere(tmp_path: Path) -> None:
    """The engine's bind error moves the replica to another port without counting a crash."""
    squatters: list[socket.socket] = []
    taken_ports: list[int] = []
    serve = http_engine(tmp_path)

    async def prepare(port: int) -> EngineLaunch:
        if not taken_ports:   # another program grabs the port between the check and the bind
            taken_ports.append(port)
            sock = socket.socket()
            # As the engine does: a port in TIME_WAIT from an earlier test's
            # probes must not keep the squatter out while the engine gets in.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("127.0.0.1", port))
                sock.listen()
                squatters.append(sock)
            except OSError:
                sock.close()   # something on this machine already holds it: just as taken
        return await serve(port)

    r = runner(prepare)
    r.start()
    try:
        await until(lambda: r.healthy, "the replica to become healthy on another port", 60)
        taken = taken_ports[0]
        assert r.port != taken
        assert r.restarts == 1
        assert r.failures == 0
        assert f"could not listen on port {taken}" in r.message
    finally:
        await r.stop()
        for sock in squatters:
            sock.close()


def gaps_hold_backoff(times: list[float], timing: Timing) -> bool:
    """Whether each attempt after a failure came no sooner than its back-off allows."""
    return all(later - earlier >= 0.9 * backoff(n, timing)
               for n, (earlier, later) in enumerate(itertools.pairwise(times), 1))


async def test_an_unexpected_error_while_preparing_is_retried_with_backoff() -> None:
    """A prepare raising TypeError fails the attempt with back-off, and the message names it."""
    loop = asyncio.get_running_loop()
    attempts: list[float] = []
    events: list[tuple[str, str]] = []

    async def broken(port: int) -> EngineLaunch:
        attempts.append(loop.time())
        raise TypeError("expected str, bytes or os.PathLike object, not NoneType")

    r = runner(broken, events)
    r.start()
    try:
        await until(lambda: r.crash_loop, "a crash loop", 30)
        assert r.state in ("failed", "pending")
        assert "TypeError: expected str, bytes or os.PathLike object" in r.message
        assert r.message.startswith("crash loop: ")
        assert r.port is None
        assert "stopped" not in [k for k, _ in events]
        assert gaps_hold_backoff(attempts, TIMING)
    finally:
        await r.stop()
    assert r.state == "stopped"


async def test_an_unexpected_error_while_watching_ends_the_engine_and_retries(
        tmp_path: Path) -> None:
    """A defect in the health watch stops that engine and starts another after back-off."""
    events: list[tuple[str, str]] = []
    r = runner(http_engine(tmp_path), events)
    pids: list[int] = []

    async def broken_watch(proc: EngineProcess, launch: EngineLaunch) -> str:
        assert proc.pid is not None
        pids.append(proc.pid)
        raise RuntimeError("the watch tripped over itself")

    r._watch = broken_watch  # type: ignore[method-assign]
    r.start()
    try:
        await until(lambda: len(pids) >= 2, "a second attempt", 60)
        assert pids[0] != pids[1]
        assert not alive(pids[0])
        assert not group_members(pids[0])
        assert "RuntimeError: the watch tripped over itself" in r.message
        assert "stopped" not in [k for k, _ in events]
    finally:
        await r.stop()
    assert all(not alive(pid) for pid in pids)


def stubborn_http_engine(directory: Path):  # type: ignore[no-untyped-def]
    """An http.server that ignores SIGTERM, so stopping it takes the whole grace period."""
    async def prepare(port: int) -> EngineLaunch:
        script = textwrap.dedent(f"""\
            import runpy, signal, sys
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            sys.argv = ["http.server", "{port}", "--bind", "127.0.0.1",
                        "--directory", {str(directory)!r}]
            runpy.run_module("http.server", run_name="__main__")
        """)
        return EngineLaunch(argv=[sys.executable, "-c", script], env={}, health_path="/",
                            port=port)
    return prepare


async def test_stop_passes_on_a_cancellation_of_its_caller(tmp_path: Path) -> None:
    """A task cancelled while waiting in stop() ends cancelled; the replica still stops."""
    r = runner(stubborn_http_engine(tmp_path))
    r.start()
    try:
        await until(lambda: r.healthy, "the replica to become healthy", 60)
        pid = r.pid
        assert pid is not None
        waiting = asyncio.create_task(r.stop())
        await until(lambda: r.stopping, "the stop to begin", 30)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert waiting.cancelled()
    finally:
        await r.stop()
    assert not alive(pid)


def drained_runner(tmp_path: Path, counts: dict[str, int],
                   asked: list[str]) -> ReplicaRunner:
    """A runner whose requests in flight are ``counts[address]`` (1 until told otherwise)."""
    def in_flight(address: str) -> int:
        asked.append(address)
        return counts.get(address, 1)

    low, high = port_range()
    return ReplicaRunner(
        id="m-1", model="m", profile="cpu", fingerprint="sha256:0", seq=1, node="box",
        cpus=(), reserved_memory=None, prepare=http_engine(tmp_path),
        ports=PortPool(low, high), timing=TIMING, on_change=lambda r, kind, msg: None,
        in_flight=in_flight)


async def test_a_draining_replica_leaves_routing_at_once_and_stops_after_its_requests(
        tmp_path: Path) -> None:
    """A stop with a drain takes the replica out of the endpoints (not healthy) at once,
    keeps its engine serving while requests are in flight on it, and stops it when none is."""
    counts: dict[str, int] = {}
    asked: list[str] = []
    r = drained_runner(tmp_path, counts, asked)
    r.start()
    await until(lambda: r.healthy, "the replica to become healthy", 60)
    pid, address = r.pid, r.address
    assert pid is not None
    assert address is not None
    stopping = asyncio.create_task(r.stop(drain=600))
    await until(lambda: len(asked) >= 3, "the drain to count requests a few times", 30)
    assert not r.healthy
    assert r.state == "stopping"
    assert alive(pid)
    assert set(asked) == {address}
    counts[address] = 0
    await stopping
    assert not alive(pid)
    assert r.state == "stopped"


async def test_a_drain_ends_at_its_timeout(tmp_path: Path) -> None:
    """Requests that never finish hold the engine only for the drain timeout."""
    asked: list[str] = []
    r = drained_runner(tmp_path, {}, asked)
    r.start()
    await until(lambda: r.healthy, "the replica to become healthy", 60)
    pid = r.pid
    await r.stop(drain=0.3)
    assert asked, "the drain should have counted the requests in flight"
    assert pid is not None
    assert not alive(pid)


async def test_a_stop_without_drain_cuts_a_drain_short(tmp_path: Path) -> None:
    """llmgw shutting down (a stop with no drain) does not wait for a drain under way."""
    asked: list[str] = []
    r = drained_runner(tmp_path, {}, asked)
    r.start()
    await until(lambda: r.healthy, "the replica to become healthy", 60)
    draining = asyncio.create_task(r.stop(drain=600))
    await until(lambda: bool(asked), "the drain to begin", 30)
    r.request_stop()
    await draining
    assert r.state == "stopped"
