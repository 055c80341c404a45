"""``llmgw serve --workers N``: one control process, N gateway workers on one port.

The scheduler's routing view reaches the workers through the relay; counters
stay whole across workers; the control API answers through any worker; a
worker that dies is replaced.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import httpx
import pytest
import uvicorn

from llmgw.catalog.adapter import Adapter
from llmgw.catalog.source import Source
from llmgw.errors import NotFoundError, UnavailableError
from llmgw.scheduler.base import BackendHealth
from llmgw.scheduler.relay import POLL, RelayRouting, RoutingRelay
from tests.gateway.doubles import FakeBackend

TOKEN = "workers-t0ken"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _until(condition: object, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


# ------------------------------------------------------------------ the relay


@contextlib.asynccontextmanager
async def relayed(backend: FakeBackend, models: list[str], tmp_path: Path,
                  adapters: dict[str, Adapter] | None = None) -> AsyncIterator[RelayRouting]:
    relay = RoutingRelay(backend, lambda: models, lambda: adapters or {})
    relay.start()
    path = str(tmp_path / "control.sock")
    server = uvicorn.Server(uvicorn.Config(relay, uds=path, lifespan="off", log_level="error"))
    task = asyncio.create_task(server.serve())
    await _until(lambda: server.started, "the relay to listen")
    routing = RelayRouting(path)
    routing.start()
    try:
        yield routing
    finally:
        await routing.close()
        server.should_exit = True
        await task
        await relay.close()


async def test_a_worker_sees_the_schedulers_endpoints_and_their_changes(tmp_path: Path) -> None:
    """Endpoints and status reach the worker at once, and a change reaches it within a second."""
    backend = FakeBackend()
    backend.set_endpoints("m", ["http://10.0.0.1:8000"])
    backend.profiles["http://10.0.0.1:8000"] = "big"
    backend.desired["m"] = 1
    async with relayed(backend, ["m"], tmp_path) as routing:
        await asyncio.wait_for(routing.synced.wait(), 10)
        assert routing.endpoints("m") == ["http://10.0.0.1:8000"]
        assert routing.status("m").desired == 1
        assert routing.profile_of("http://10.0.0.1:8000") == "big"
        backend.profiles["http://10.0.0.2:8000"] = "small"
        backend.set_endpoints("m", ["http://10.0.0.1:8000", "http://10.0.0.2:8000"])
        await routing.wait_changed(5.0)
        await _until(lambda: len(routing.endpoints("m")) == 2, "the new endpoint", 5.0)
        assert routing.profile_of("http://10.0.0.2:8000") == "small"


async def test_a_worker_sees_whether_the_scheduler_is_reachable(tmp_path: Path) -> None:
    """The scheduler's health crosses the relay, so a worker's /metrics reports an outage of
    Nomad the control process sees (llmgw_scheduler_up), and its end."""
    backend = FakeBackend()
    backend.scheduler_health = BackendHealth(ok=False, message="cannot reach Nomad", since=1.0)
    async with relayed(backend, ["m"], tmp_path) as routing:
        await asyncio.wait_for(routing.synced.wait(), 10)
        assert routing.health() == backend.scheduler_health
        backend.scheduler_health = BackendHealth(ok=True, message="Nomad at http://n:4646")
        await _until(lambda: routing.health().ok, "the end of the outage", 10.0)


async def test_set_demand_from_a_worker_reaches_the_scheduler_and_errors_come_back(
        tmp_path: Path) -> None:
    """A worker's set_demand runs on the control process's scheduler; its refusal is raised."""
    backend = FakeBackend()

    async def refuse(model: str, replicas: int) -> None:
        if model == "nope":
            raise NotFoundError("the local scheduler runs no model named 'nope'")
        backend.desired[model] = replicas

    backend.set_demand = refuse  # type: ignore[method-assign]
    async with relayed(backend, ["m"], tmp_path) as routing:
        await routing.set_demand("m", 3)
        assert backend.desired["m"] == 3
        with pytest.raises(NotFoundError, match="no model named 'nope'"):
            await routing.set_demand("nope", 1)


async def test_a_workers_adapter_fetch_runs_on_the_control_process_and_says_why_it_failed(
        tmp_path: Path) -> None:
    """stage_adapter from a worker runs the control process's (where the Nomad backend
    fetches onto the replica's node); its refusal comes back, and which replicas' disks
    hold an adapter reaches the worker with the snapshot."""
    sql = Adapter(name="m-sql", base="m", source=Source.parse("http://mirror:8070/a/m-sql/"))
    backend = FakeBackend()
    backend.set_endpoints("m", ["http://10.0.0.1:8000", "http://10.0.0.2:8000"])
    staged: list[tuple[str, str, bool]] = []
    warm = {"http://10.0.0.2:8000"}

    async def stage(adapter: Adapter, address: str, *, again: bool = False) -> None:
        if address == "http://10.0.0.1:8000":
            raise UnavailableError("fetching its weights onto node a failed: HTTP 404")
        staged.append((adapter.name, address, again))

    backend.stage_adapter = stage  # type: ignore[method-assign]
    backend.adapter_warm = lambda adapter, address: address in warm  # type: ignore[method-assign]
    async with relayed(backend, ["m"], tmp_path, {"m-sql": sql}) as routing:
        await asyncio.wait_for(routing.synced.wait(), 10)
        await routing.stage_adapter(sql, "http://10.0.0.2:8000", again=True)
        assert staged == [("m-sql", "http://10.0.0.2:8000", True)]
        with pytest.raises(UnavailableError, match="HTTP 404"):
            await routing.stage_adapter(sql, "http://10.0.0.1:8000")
        assert routing.adapter_warm(sql, "http://10.0.0.2:8000")
        assert not routing.adapter_warm(sql, "http://10.0.0.1:8000")


# ------------------------------------------------------------------ llmgw serve --workers 2


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes], str]]:
    """A sim engine in a process, and `llmgw serve --workers 2` in front of it."""
    sim = subprocess.Popen([sys.executable, "-m", "llmgw.testing.simengine"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert sim.stdout is not None
    engine = sim.stdout.readline().decode().strip()
    port = _free_port()
    config = tmp_path / "server.yaml"
    config.write_text(
        f"listen: 127.0.0.1:{port}\ndatabase: sqlite:///{tmp_path}/llmgw.db\n"
        f"admin_tokens: [{TOKEN}]\nmodels:\n  - name: chat\n    upstream: [{engine}]\n"
        "    routing: {engine_metrics: true}\n")
    log = open(tmp_path / "serve.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "llmgw", "serve", "-c", str(config),
                             "--workers", "2", "--log-level", "warning"],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                    break
            assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
            time.sleep(0.1)
        yield url, proc, str(tmp_path / "serve.log")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(40)
        except subprocess.TimeoutExpired:
            proc.kill()
        sim.kill()
        sim.wait()
        sim.stdout.close()
        log.close()


def _workers(proc: subprocess.Popen[bytes]) -> list[int]:
    """The gateway workers among the control process's children (not multiprocessing's
    resource tracker)."""
    out = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True,
                         check=False)
    pids = []
    for pid in (int(p) for p in out.stdout.split()):
        with contextlib.suppress(OSError):
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                pids.append(pid)
    return pids


def _served_total(metrics: str) -> float:
    return sum(float(v) for v in re.findall(
        r'^llmgw_gateway_requests_total\{model="chat",status="200"\} (\S+)$', metrics, re.M))


def test_two_workers_serve_one_port_and_count_every_request_once(
        served: tuple[str, subprocess.Popen[bytes], str]) -> None:
    """Requests spread over two workers; /metrics from any worker sums both; the API answers."""
    url, proc, _ = served
    assert len(_workers(proc)) == 2
    with httpx.Client(base_url=url, timeout=30) as client:
        for i in range(40):
            # A fresh connection each time, so the kernel spreads them over the workers.
            r = httpx.post(f"{url}/v1/chat/completions", timeout=30, json={
                "model": "chat", "messages": [{"role": "user", "content": f"q{i}"}],
                "max_tokens": 2}, headers={"connection": "close"})
            assert r.status_code == 200, r.text
        totals = {_served_total(httpx.get(f"{url}/metrics", headers={"connection": "close"},
                                          timeout=10).text) for _ in range(6)}
        assert totals == {40.0}
        models = client.get("/api/v1/models", headers=HEADERS)
        assert models.status_code == 200
        assert [m["name"] for m in models.json()] == ["chat"]
        assert client.get("/_relay/routing").status_code == 404
        assert client.get("/api/v1/models").status_code == 401


def test_a_worker_that_dies_is_replaced_and_the_port_keeps_serving(
        served: tuple[str, subprocess.Popen[bytes], str]) -> None:
    """SIGKILL of a worker: the other serves meanwhile, a new one starts, counts survive."""
    url, proc, log = served
    body = {"model": "chat", "messages": [{"role": "user", "content": "q"}], "max_tokens": 2}
    for _ in range(5):
        assert httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30).status_code == 200
    victim = _workers(proc)[0]
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while True:
        now = _workers(proc)
        if len(now) == 2 and victim not in now:
            break
        assert time.monotonic() < deadline, Path(log).read_text()
        r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30,
                       headers={"connection": "close"})
        assert r.status_code == 200
        time.sleep(0.1)
    assert "gateway worker 0" in Path(log).read_text() or "gateway worker 1" in \
        Path(log).read_text()
    total = _served_total(httpx.get(f"{url}/metrics", timeout=10).text)
    assert total >= 5


def test_serve_stops_its_workers_at_once_instead_of_waiting_out_their_polls(
        served: tuple[str, subprocess.Popen[bytes], str]) -> None:
    """SIGTERM ends `serve --workers 2` well within one relay poll: the control server's
    shutdown waits for open requests, and the workers' long polls are open requests."""
    _, proc, log = served
    workers = _workers(proc)
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(POLL / 2)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"still running {POLL / 2:.0f}s after SIGTERM:\n"
                             + Path(log).read_text()) from None
    # uvicorn re-raises the signal it caught once it has shut down: -SIGTERM is a clean stop.
    assert proc.returncode in (0, -signal.SIGTERM), Path(log).read_text()
    assert not [pid for pid in workers if Path(f"/proc/{pid}").exists()]


async def test_closing_the_relay_answers_a_held_poll_at_once(tmp_path: Path) -> None:
    """A poll held for a change is answered when the relay closes, not when it times out."""
    backend = FakeBackend()
    relay = RoutingRelay(backend, lambda: ["m"])
    relay.start()
    path = str(tmp_path / "control.sock")
    server = uvicorn.Server(uvicorn.Config(relay, uds=path, lifespan="off", log_level="error"))
    task = asyncio.create_task(server.serve())
    try:
        await _until(lambda: server.started, "the relay to listen")
        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=path)) as session:
            poll = asyncio.create_task(_get(session, "/_relay/routing?after=1&wait=600"))
            await _until(lambda: bool(server.server_state.tasks), "the poll to be held")
            await relay.close()
            async with asyncio.timeout(POLL / 2):
                status = await poll
        assert status == 200
    finally:
        server.should_exit = True
        await task
        await relay.close()


async def _get(session: aiohttp.ClientSession, target: str) -> int:
    async with session.get(f"http://control{target}") as r:
        await r.read()
        return r.status
