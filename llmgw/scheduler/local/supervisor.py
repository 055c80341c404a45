"""Engine child processes: started, probed, restarted with back-off, and stopped for good.

One ``ReplicaRunner`` owns one replica for its whole life and is the only code
that touches its process, so starting, probing, restarting and stopping can
never race each other. Each attempt takes a free port, asks the backend for
the launch (resolving the model file happens there, off the event loop),
starts the engine in a process group of its own through ``guard.py``, probes
its health path until it answers, then keeps probing.

Why each behaviour:

* Own process group (``start_new_session``): a stop signals the whole group,
  so nothing the engine started survives it; and Ctrl-C on llmgw's terminal
  reaches llmgw alone, which then stops the engines in order rather than
  watching them die and restarting them mid-shutdown.
* Graceful stop: SIGTERM, then SIGKILL after the grace period, then SIGKILL
  to the group again for stragglers.
* Exponential back-off (1 s, 2 s, 4 s … one minute): a model that cannot load
  must not spin two cores at 100% re-reading a corrupt file. The count resets
  once a replica has served for a minute, so a crash a week is not a "loop".
* A crash loop (three failures in a row) is shown on the replica and the model,
  with the engine's last output lines, because "exited with status 1" alone
  sends the operator to hunt for a log that no longer exists.
* A port taken by another program while the engine loaded is not the engine's
  fault: it is retried at once on another port and not counted as a crash.
  Another llmgw on this host (a second server, a test beside this one) takes
  none of ours in that window: each held port is claimed (``PortPool``).
* The output pipe is always drained: an engine whose pipe fills up blocks on
  its next log line and looks hung.
* An unexpected exception while preparing or watching an attempt (a defect,
  or a model package that misbehaves) is a failed attempt like any other,
  backed off and shown on the replica. Ending the runner instead would have
  the backend start a new one at once, thousands of times a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import signal
import socket
import sys
import tempfile
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmgw.scheduler.base import Replica, ReplicaState
from llmgw.scheduler.local.engines import (
    EngineLaunch,
    explain_exit,
    output_summary,
    port_conflict,
)

log = logging.getLogger("llmgw.scheduler.local")


class LaunchError(Exception):
    """A replica could not be launched; the message says why and what to do."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class Timing:
    """The supervisor's clocks, in seconds; tests shorten them."""

    stop_grace: float = 10.0
    start_timeout: float = 1800.0
    probe_starting: float = 0.5
    probe_running: float = 5.0
    probe_timeout: float = 5.0
    unhealthy_after: int = 3          # consecutive failed probes
    unhealthy_restart: float = 120.0  # unhealthy this long while running → restart
    backoff_base: float = 1.0
    backoff_max: float = 60.0
    stable_after: float = 60.0
    crash_loop_after: int = 3
    output_lines: int = 200
    message_lines: int = 20


def backoff(failures: int, timing: Timing) -> float:
    """Seconds to wait before the next attempt after ``failures`` failures in a row."""
    if failures <= 0:
        return 0.0
    return float(min(timing.backoff_max, timing.backoff_base * 2 ** (failures - 1)))


class PortPool:
    """Ports of ``scheduler.local.port_range`` for engines, skipping ones in use.

    The next port is searched from where the last search stopped, so a port
    just given up is not handed to the next replica at once: a gateway that
    still remembers the old address would send one model's request to another.

    A port is free when nothing listens on it and no other llmgw process of
    this user holds it: an engine takes seconds to load before it listens, and
    in that window a bind test alone would hand the same port to a second
    server on the host, whose probes would then reach the first's engine. So
    each held port is claimed with an ``flock`` on a file of its own in
    ``claims`` (by default ``<tmp>/llmgw-ports-<uid>``), released with the
    port, or by the kernel when the process ends however it ends.
    """

    def __init__(self, low: int, high: int, host: str = "127.0.0.1",
                 claims: Path | None = None) -> None:
        self.low, self.high, self.host = low, high, host
        self._held: set[int] = set()
        self._claims: dict[int, int] = {}       # port -> the fd that holds its lock
        self._next = low
        self._dir = _claims_dir(claims or Path(tempfile.gettempdir())
                                / f"llmgw-ports-{os.getuid()}")

    @property
    def held(self) -> frozenset[int]:
        return frozenset(self._held)

    def _bindable(self, port: int) -> bool:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            # The engine's server sets SO_REUSEADDR too: a port in TIME_WAIT is
            # free for it, a port with a listener is not.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((self.host, port))
            except OSError:
                return False
        return True

    def _claim(self, port: int) -> bool:
        """Whether this process now holds ``port`` against every other llmgw."""
        if self._dir is None:
            return True
        try:
            # CLOEXEC: an engine must not inherit the claims of its siblings' ports.
            fd = os.open(self._dir / f"{port}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                         0o600)
        except OSError:
            return True         # the directory went away: the bind test decides alone
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._claims[port] = fd
        return True

    def _unclaim(self, port: int) -> None:
        fd = self._claims.pop(port, None)
        if fd is not None:
            os.close(fd)

    def acquire(self) -> int:
        size = self.high - self.low + 1
        for i in range(size):
            port = self.low + (self._next - self.low + i) % size
            if port in self._held or not self._claim(port):
                continue
            if not self._bindable(port):
                self._unclaim(port)
                continue
            self._held.add(port)
            self._next = port + 1 if port < self.high else self.low
            return port
        raise LaunchError(
            f"no free port for an engine in {self.low}-{self.high} (scheduler.local.port_range): "
            f"llmgw holds {len(self._held)}, other programs the rest; widen the range"
        )

    def release(self, port: int | None) -> None:
        if port is not None:
            self._held.discard(port)
            self._unclaim(port)


def _claims_dir(path: Path) -> Path | None:
    """``path``, made private to this user; None (bind tests only) if it cannot be."""
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        st = path.stat()
    except OSError as exc:
        log.warning("engine ports cannot be claimed in %s (%s); another llmgw on this host "
                    "may pick a port this one's engine is loading on", path, exc.strerror)
        return None
    if st.st_uid != os.getuid():
        log.warning("engine ports are not claimed: %s belongs to another user", path)
        return None
    return path


async def probe(host: str, port: int, path: str, within: float) -> bool:
    """True if ``GET path`` answers 2xx within ``within`` seconds; no HTTP library needed."""
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(within):
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
                         "Connection: close\r\n\r\n".encode())
            await writer.drain()
            status = await reader.readline()
            parts = status.split()
            ok = len(parts) >= 2 and parts[1][:1] == b"2"
            # Read the answer out so the engine does not log a broken pipe.
            while await reader.read(65536):
                pass
            return ok
    except (OSError, TimeoutError, asyncio.IncompleteReadError):
        return False
    finally:
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


def _reraise_if_cancelled() -> None:
    """Re-raise a CancelledError that was meant for the current task.

    Call it in ``except CancelledError`` around an await of another task: the
    error is that task's end when it was cancelled, and must not be swallowed
    when the current task itself is being cancelled.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def _killpg(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


class EngineProcess:
    """One engine process in its own process group, its output kept in ``lines``."""

    def __init__(self, name: str, launch: EngineLaunch, cpus: Iterable[int],
                 lines: deque[str]) -> None:
        self.name = name
        self.launch = launch
        self.cpus = tuple(cpus)
        self.lines = lines
        self.exited = asyncio.Event()
        self._proc: asyncio.subprocess.Process | None = None
        self._drainer: asyncio.Task[None] | None = None
        self._reaper: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode if self._proc else None

    async def start(self) -> None:
        guard = [sys.executable, "-m", "llmgw.scheduler.local.guard", "--parent", str(os.getpid())]
        if self.cpus:
            guard += ["--cpus", ",".join(map(str, self.cpus))]
        self._proc = await asyncio.create_subprocess_exec(
            *guard, "--", *self.launch.argv,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, env={**os.environ, **self.launch.env},
            start_new_session=True, limit=1 << 20,
        )
        _live_groups.add(self._proc.pid)
        self._drainer = asyncio.create_task(self._drain(), name=f"{self.name}-output")
        self._reaper = asyncio.create_task(self._reap(), name=f"{self.name}-wait")

    async def _drain(self) -> None:
        assert self._proc is not None
        assert self._proc.stdout is not None
        stream = self._proc.stdout
        debug = log.isEnabledFor(logging.DEBUG)
        while True:
            try:
                raw = await stream.readline()
            except ValueError:   # a line longer than the limit: keep its start
                raw = await stream.read(1 << 16)
            if not raw:
                return
            line = raw.decode("utf-8", "replace").rstrip()[:500]
            self.lines.append(line)
            if debug:
                log.debug("%s| %s", self.name, line)

    async def _reap(self) -> None:
        assert self._proc is not None
        await self._proc.wait()
        # Whatever the engine left in its group goes with it.
        _killpg(self._proc.pid, signal.SIGKILL)
        _live_groups.discard(self._proc.pid)
        # The last lines (the reason it died) are read before anyone is told.
        if self._drainer is not None:
            # asyncio.timeout rather than wait_for: on 3.11 wait_for can lose
            # a cancellation that arrives as the drainer finishes.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2.0):
                    await asyncio.shield(self._drainer)
        self.exited.set()

    async def stop(self, grace: float) -> None:
        """SIGTERM the group, SIGKILL it after ``grace`` seconds; returns once it is gone."""
        if self._proc is None or self.exited.is_set():
            return
        _killpg(self._proc.pid, signal.SIGTERM)
        try:
            async with asyncio.timeout(grace):
                await self.exited.wait()
        except TimeoutError:
            _killpg(self._proc.pid, signal.SIGKILL)
            await self.exited.wait()

    def kill_now(self) -> None:
        """SIGKILL the group without waiting (a cancelled runner cannot wait)."""
        if self._proc is not None and self._proc.returncode is None:
            _killpg(self._proc.pid, signal.SIGKILL)


# Process groups still running, so an interpreter exiting without close()
# (an exception in the server's start-up) still kills them: kill_all_groups
# is registered with atexit by the backend.
_live_groups: set[int] = set()


def kill_all_groups() -> None:
    """SIGKILL every engine group this process started that is still alive."""
    for pgid in list(_live_groups):
        _killpg(pgid, signal.SIGKILL)
    _live_groups.clear()


async def _wait_any(events: Iterable[asyncio.Event], within: float | None) -> None:
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, timeout=within, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()


async def _wait_any_future(future: asyncio.Future[bool], events: Iterable[asyncio.Event]) -> None:
    waiters: list[asyncio.Future[Any]] = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait([future, *waiters], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()


Prepare = Callable[[int], Awaitable[EngineLaunch]]
OnChange = Callable[["ReplicaRunner", str, str], None]


# How many requests are in flight on a replica's address (None: nobody knows).
InFlight = Callable[[str], int | None]


def _unknown(address: str) -> int | None:
    return None


_DRAIN_POLL = 0.05   # how often a draining replica's requests are counted


class ReplicaRunner:
    """Keeps one replica's engine running until ``stop()``.

    A stop with a ``drain`` withdraws the replica from routing at once (it is
    no longer healthy, so it leaves the endpoints), then leaves the engine
    running until ``in_flight`` says its requests are done, or ``drain``
    seconds have passed, or another stop asks for no drain (llmgw itself
    shutting down); only then is it signalled. Without a count of its requests
    it serves out the whole drain.
    """

    def __init__(
        self, *, id: str, model: str, profile: str, fingerprint: str, seq: int,
        node: str, cpus: tuple[int, ...], reserved_memory: int | None,
        prepare: Prepare, ports: PortPool, timing: Timing, on_change: OnChange,
        in_flight: InFlight = _unknown,
    ) -> None:
        self.id, self.model, self.profile, self.fingerprint = id, model, profile, fingerprint
        self.seq, self.node, self.cpus, self.reserved_memory = seq, node, cpus, reserved_memory
        self._prepare, self._ports = prepare, ports
        self._timing, self._on_change = timing, on_change
        self.state: ReplicaState = "pending"
        self.healthy = False
        self.retiring = False
        self.restarts = 0
        self.failures = 0
        self.message = ""
        self.port: int | None = None
        self.launched_at: float | None = None
        self.ready_at: float | None = None
        self.lines: deque[str] = deque(maxlen=timing.output_lines)
        self._proc: EngineProcess | None = None
        self._stop = asyncio.Event()
        self._hurry = asyncio.Event()   # end a drain now
        self._drain = 0.0
        self._in_flight = in_flight
        self._task: asyncio.Task[None] | None = None

    # -- what others read -------------------------------------------------

    @property
    def address(self) -> str | None:
        return f"http://127.0.0.1:{self.port}" if self.port is not None else None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc and not self._proc.exited.is_set() else None

    @property
    def crash_loop(self) -> bool:
        return self.failures >= self._timing.crash_loop_after and not self.healthy

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def replica(self, measured_memory: int | None = None) -> Replica:
        live = self.state in ("starting", "running")
        return Replica(
            id=self.id, model=self.model, profile=self.profile, fingerprint=self.fingerprint,
            node=self.node, state=self.state, healthy=self.healthy,
            address=self.address if live else None, reserved_memory=self.reserved_memory,
            measured_memory=measured_memory, restarts=self.restarts, message=self.message,
            phase=("healthy" if self.healthy else "loading" if self.state == "starting"
                   else self.state),
        )

    # -- life --------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"replica-{self.id}")

    def request_stop(self, drain: float = 0.0) -> None:
        """Mark the replica stopping now (it takes no traffic); ``stop()`` waits for the exit.

        ``drain``: seconds its requests in flight may still take (a second
        request without one ends a drain under way).
        """
        if drain <= 0:
            self._hurry.set()
        if not self._stop.is_set():
            self._drain = drain if self.healthy else 0.0
            self._stop.set()
            if self.state != "stopped":
                self._set("stopping", healthy=False)

    async def stop(self, drain: float = 0.0) -> None:
        """Stop the engine gracefully and return when it has exited."""
        self.request_stop(drain)
        if self._task is not None:
            try:
                await asyncio.shield(self._task)
            except asyncio.CancelledError:
                _reraise_if_cancelled()     # else the runner's task itself was cancelled

    def _set(self, state: ReplicaState, *, healthy: bool | None = None) -> None:
        self.state = state
        if healthy is not None:
            self.healthy = healthy

    def _emit(self, kind: str, message: str = "") -> None:
        try:
            self._on_change(self, kind, message)
        except Exception:
            log.exception("replica %s: reporting %s failed", self.id, kind)

    async def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    await self._attempt()
                except Exception as exc:
                    await self._attempt_crashed(exc)
        except Exception as exc:
            # Only a defect in the failure path itself gets here. It must not
            # leave an engine nobody watches: the finally below kills it.
            log.exception("replica %s: supervisor failed", self.id)
            self.message = f"the supervisor of this replica failed: {exc!r}"
        finally:
            if self._proc is not None:
                self._proc.kill_now()
            self._ports.release(self.port)
            self.port = None
            self._set("stopped", healthy=False)
            self._emit("stopped")

    async def _attempt_crashed(self, exc: Exception) -> None:
        """An attempt raised what it should not: end its engine, then fail with back-off."""
        log.error("replica %s: supervising an attempt failed", self.id,
                  exc_info=(type(exc), exc, exc.__traceback__))
        if self._proc is not None and not self._proc.exited.is_set():
            await self._proc.stop(self._timing.stop_grace)
        self._ports.release(self.port)
        self.port = None
        await self._failed(f"supervising the engine failed unexpectedly "
                           f"({type(exc).__name__}: {exc}); this is a defect in llmgw, "
                           "see its log for the traceback", with_output=False)

    async def _attempt(self) -> None:
        loop = asyncio.get_running_loop()
        self._set("pending")
        why: str | None = None
        try:
            self.port = self._ports.acquire()
            launch = await self._prepare(self.port)
        except LaunchError as exc:
            why = exc.message
        except Exception as exc:
            # prepare() should raise LaunchError only; anything else still
            # fails this attempt with back-off rather than ending the runner.
            log.exception("replica %s: preparing the launch failed", self.id)
            why = f"preparing the engine's launch failed: {type(exc).__name__}: {exc}"
        if why is not None:
            self._ports.release(self.port)
            self.port = None
            await self._failed(why, with_output=False)
            return
        if self._stop.is_set():         # stopped while the model file was being prepared
            return
        self.lines.clear()
        proc = EngineProcess(self.id, launch, self.cpus, self.lines)
        try:
            await proc.start()
        except (OSError, ValueError) as exc:
            self._ports.release(self.port)
            self.port = None
            await self._failed(f"the engine could not be started: {exc}", with_output=False)
            return
        self._proc = proc
        self.launched_at, self.ready_at = loop.time(), None
        self._set("starting", healthy=False)
        self._emit("loading", f"pid {proc.pid}, port {launch.port}")
        why = await self._until_healthy(proc, launch)
        if why is None:
            why = await self._watch(proc, launch)
        if self._stop.is_set():
            await self._drain_out(proc, launch.port)
            await proc.stop(self._timing.stop_grace)
            return
        if not proc.exited.is_set():     # hung or never became healthy: end it first
            await proc.stop(self._timing.stop_grace)
        returncode = proc.returncode if proc.returncode is not None else -signal.SIGKILL
        lines = list(self.lines)
        conflict = port_conflict(lines)
        self._ports.release(self.port)
        self.port = None
        await self._failed(why or explain_exit(returncode, lines, launch.port),
                           counts=not conflict)

    async def _probe(self, proc: EngineProcess, launch: EngineLaunch) -> bool:
        """One health probe, abandoned as soon as the engine exits or a stop is asked.

        Whatever answers on the port might not be the engine (another program
        that took it first), so an exit must not wait out the probe's timeout.
        """
        check = asyncio.ensure_future(
            probe("127.0.0.1", launch.port, launch.health_path, self._timing.probe_timeout))
        try:
            await _wait_any_future(check, [self._stop, proc.exited])
        except BaseException:
            check.cancel()          # the runner is cancelled: leave no probe behind
            raise
        if not check.done():
            check.cancel()
            try:
                await check
            except asyncio.CancelledError:
                _reraise_if_cancelled()
            return False
        return check.result() and not proc.exited.is_set()

    async def _until_healthy(self, proc: EngineProcess, launch: EngineLaunch) -> str | None:
        """None once healthy; otherwise why it is not (or "" if it exited or is stopping)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timing.start_timeout
        while not self._stop.is_set() and not proc.exited.is_set():
            if await self._probe(proc, launch):
                self.ready_at = loop.time()
                self._set("running", healthy=True)
                self._emit("ready", f"{self.address} after "
                           f"{self.ready_at - (self.launched_at or self.ready_at):.1f}s")
                return None
            if loop.time() > deadline:
                return (f"the engine did not answer its health check ({launch.health_path}) "
                        f"within {self._timing.start_timeout:.0f}s of starting; it was stopped")
            await _wait_any([self._stop, proc.exited], self._timing.probe_starting)
        return ""

    async def _drain_out(self, proc: EngineProcess, port: int) -> None:
        """Leave the engine to finish its requests: until none is in flight, or the drain's end."""
        if self._drain <= 0:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._drain
        address = f"http://127.0.0.1:{port}"
        while not self._hurry.is_set() and not proc.exited.is_set():
            left = deadline - loop.time()
            if left <= 0 or self._in_flight(address) == 0:
                return
            await _wait_any([self._hurry, proc.exited], min(left, _DRAIN_POLL))

    async def _watch(self, proc: EngineProcess, launch: EngineLaunch) -> str:
        """Probe a running engine until it exits, hangs or is stopped; why it ended."""
        loop = asyncio.get_running_loop()
        misses, unhealthy_since = 0, 0.0
        while True:
            await _wait_any([self._stop, proc.exited], self._timing.probe_running)
            if self._stop.is_set() or proc.exited.is_set():
                return ""
            if await self._probe(proc, launch):
                if not self.healthy:
                    self._set("running", healthy=True)
                    self._emit("ready", f"{self.address} answers its health check again")
                misses = 0
                continue
            misses += 1
            if misses == self._timing.unhealthy_after:
                unhealthy_since = loop.time()
                self._set("running", healthy=False)
                self._emit("unhealthy", f"{misses} health checks in a row failed")
            if misses >= self._timing.unhealthy_after and (
                    loop.time() - unhealthy_since >= self._timing.unhealthy_restart):
                return (f"the engine stopped answering its health check ({launch.health_path}) "
                        f"for {self._timing.unhealthy_restart:.0f}s; it was restarted")

    async def _failed(self, why: str, *, with_output: bool = True, counts: bool = True) -> None:
        if self._stop.is_set():         # a failure while stopping is the stop
            return
        loop = asyncio.get_running_loop()
        if counts:
            served = self.ready_at is not None and (
                loop.time() - self.ready_at >= self._timing.stable_after)
            self.failures = 1 if served else self.failures + 1
        self.ready_at = None
        delay = backoff(self.failures, self._timing) if counts else 0.5
        text = why
        if with_output and self.lines:
            shown = output_summary(list(self.lines), self._timing.message_lines)
            text += "\n--- last lines of the engine's output ---\n" + "\n".join(shown)
        if self.crash_loop:
            text = (f"crash loop: {self.failures} failed starts in a row, next attempt in "
                    f"{delay:.0f}s; {text}")
        self.message = text
        self._set("failed", healthy=False)
        self._emit("failed", text)
        await _wait_any([self._stop], delay)
        if not self._stop.is_set():
            self.restarts += 1


def rss_of(pid: int | None) -> int | None:
    """Resident memory of ``pid`` in bytes (Linux /proc), or None."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as f:
            resident = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return resident * os.sysconf("SC_PAGE_SIZE")


