"""The local scheduler with the real engine: llama-cpp-python serving the Gemma 3 270M GGUF.

Each test starts real ``python -m llama_cpp.server`` processes and talks to
them over HTTP, as the gateway does. They are slow (a model load on a loaded
two-core machine can take tens of seconds), so every wait is a condition with
a generous deadline.
"""

from __future__ import annotations

import json
import os
import signal
import socket
from pathlib import Path

import httpx
import msgspec
import pytest

from llmgw.catalog.build import build_catalog
from llmgw.catalog.model import Scaling
from llmgw.scheduler.local.backend import LocalBackend

from .conftest import alive, cpu_model, group_members, until

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


async def ready(backend: LocalBackend, model: str, count: int = 1) -> list[str]:
    await until(lambda: len(backend.endpoints(model)) >= count, f"{count} ready {model}")
    return backend.endpoints(model)


async def chat(base: str, **extra: object) -> str:
    async with httpx.AsyncClient(timeout=120) as client:
        answer = await client.post(f"{base}/v1/chat/completions", json={
            "model": "gemma", "messages": QUESTION, "max_tokens": 24, "temperature": 0,
            **extra})
    answer.raise_for_status()
    content = answer.json()["choices"][0]["message"]["content"]
    assert isinstance(content, str)
    return content


async def test_a_replica_answers_a_chat_with_real_text(backend: LocalBackend) -> None:
    """The Gemma GGUF loads, becomes healthy, and a chat completion returns generated text."""
    await backend.apply(build_catalog([cpu_model("gemma")]))
    [base] = await ready(backend, "gemma")
    text = await chat(base)
    assert text.strip(), "the engine answered an empty message: wrong chat format?"
    assert any(c.isalpha() for c in text)
    kinds = [e.kind for e in backend.seen]  # type: ignore[attr-defined]
    assert kinds[:2] == ["loading", "ready"]
    ready_event = backend.seen[1]  # type: ignore[attr-defined]
    assert ready_event.address == base
    status = backend.status("gemma")
    assert (status.desired, status.ready, status.crash_loop) == (1, 1, False)


async def test_a_streamed_chat_arrives_in_chunks_of_real_text(backend: LocalBackend) -> None:
    """stream=true yields several server-sent chunks whose deltas join into text."""
    await backend.apply(build_catalog([cpu_model("gemma")]))
    [base] = await ready(backend, "gemma")
    pieces: list[str] = []
    async with httpx.AsyncClient(timeout=120) as client, client.stream(
            "POST", f"{base}/v1/chat/completions",
            json={"model": "gemma", "messages": QUESTION, "max_tokens": 24, "temperature": 0,
                  "stream": True}) as answer:
        async for line in answer.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                delta = json.loads(line[6:])["choices"][0]["delta"]
                pieces.append(delta.get("content") or "")
    assert len([p for p in pieces if p]) > 3
    assert "".join(pieces).strip()


async def test_a_killed_engine_is_restarted_and_serves_again(backend: LocalBackend) -> None:
    """SIGKILL of the engine: the replica fails, restarts with back-off, and answers again."""
    await backend.apply(build_catalog([cpu_model("gemma")]))
    await ready(backend, "gemma")
    [before] = await backend.replicas("gemma")
    pid = backend._runners[before.id].pid  # the engine's process id
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    await until(lambda: backend.endpoints("gemma") == [], "the dead replica to leave routing", 30)

    async def restarted() -> bool:
        [r] = await backend.replicas("gemma")
        return r.restarts == 1 and r.healthy
    await until(restarted, "the restarted replica to be healthy")
    [after] = await backend.replicas("gemma")
    assert after.id == before.id
    assert "killed by SIGKILL" in after.message
    assert not alive(pid)
    assert (await chat(backend.endpoints("gemma")[0])).strip()


async def test_scaling_down_and_closing_leave_no_engine_behind(tmp_path: Path) -> None:
    """Stopped replicas' processes (and their groups) are gone, checked by pid."""
    from .conftest import FAST, laptop_4c_8g, nothing_in_flight, server_config

    backend = LocalBackend(server_config(), machine=laptop_4c_8g(), timing=FAST)
    nothing_in_flight(backend)
    await backend.start()
    try:
        pair = cpu_model("gemma", min_=2)
        await backend.apply(build_catalog([pair]))
        await ready(backend, "gemma", 2)
        pids = {r.id: backend._runners[r.id].pid for r in await backend.replicas("gemma")}
        assert all(pids.values())
        await backend.apply(build_catalog([msgspec.structs.replace(pair, scaling=Scaling(min=1))]))

        async def one() -> bool:
            return len(await backend.replicas("gemma")) == 1
        await until(one, "the surplus replica to stop", 60)
        [kept] = await backend.replicas("gemma")
        stopped = [pid for rid, pid in pids.items() if rid != kept.id]
        assert stopped
        assert stopped[0] is not None
        assert not alive(stopped[0])
    finally:
        await backend.close()
    for pid in pids.values():
        assert pid is not None
        assert not alive(pid)
        assert not group_members(pid)
    assert await backend.replicas() == []


async def test_a_corrupt_gguf_crash_loops_with_the_engines_output_while_others_serve(
        backend: LocalBackend, gemma_path: Path, tmp_path: Path) -> None:
    """A GGUF cut short makes llama.cpp exit; the model shows the loop and llama.cpp's lines."""
    broken = tmp_path / "broken.gguf"
    with gemma_path.open("rb") as src:
        broken.write_bytes(src.read(4 * 1024 * 1024))
    await backend.apply(build_catalog([cpu_model("gemma"), cpu_model("broken", str(broken))]))
    await until(lambda: backend.status("broken").crash_loop, "the broken model's crash loop")
    error = backend.status("broken").last_error or ""
    assert "crash loop" in error
    assert "could not load the model file" in error
    assert "--- last lines of the engine's output ---" in error
    [replica] = await backend.replicas("broken")
    assert replica.message == error
    assert replica.restarts >= 2
    [base] = await ready(backend, "gemma")
    assert (await chat(base)).strip()


async def test_an_engine_that_exits_at_once_shows_why(backend: LocalBackend) -> None:
    """A bad engine argument: the server's own usage error is on the model."""
    await backend.apply(build_catalog([cpu_model("gemma", engine_args=["--no_such_flag", "1"])]))
    await until(lambda: backend.status("gemma").last_error is not None, "the model's error")
    error = backend.status("gemma").last_error or ""
    assert "the engine exited with status" in error
    assert "--no_such_flag" in error


async def test_a_taken_port_is_skipped() -> None:
    """A port of the range held by another program is not given to the engine."""
    from llmgw.config import LocalConfig, SchedulerConfig, ServerConfig

    from .conftest import FAST, laptop_4c_8g

    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        taken = other.getsockname()[1]
        config = ServerConfig(scheduler=SchedulerConfig(local=LocalConfig(
            port_range=(taken, min(taken + 20, 65535)))))
        backend = LocalBackend(config, machine=laptop_4c_8g(), timing=FAST)
        try:
            await backend.apply(build_catalog([cpu_model("gemma")]))
            [base] = await ready(backend, "gemma")
            assert base != f"http://127.0.0.1:{taken}"
            assert (await chat(base)).strip()
        finally:
            await backend.close()


async def test_a_profile_edit_shows_stale_until_rollout_replaces_it(
        backend: LocalBackend) -> None:
    """The running replica keeps serving while stale; rollout swaps it once the new one is up."""
    v1 = cpu_model("gemma", context=2048)
    await backend.apply(build_catalog([v1]))
    [old_base] = await ready(backend, "gemma")
    [old] = await backend.replicas("gemma")
    v2 = cpu_model("gemma", context=1024)
    catalog = build_catalog([v2])
    await backend.apply(catalog)
    [same] = await backend.replicas("gemma")
    assert same.id == old.id
    assert same.fingerprint != catalog.fingerprint("gemma", "cpu")
    assert backend.endpoints("gemma") == [old_base]

    await backend.rollout("gemma")

    async def replaced() -> bool:
        replicas = await backend.replicas("gemma")
        return [r.fingerprint for r in replicas] == [catalog.fingerprint("gemma", "cpu")] and \
            replicas[0].healthy
    await until(replaced, "the rolled-out replica to replace the old one")
    assert backend.endpoints("gemma") != [old_base]
    # The old replica served until the new one was ready: it never left the model empty.
    kinds = [(e.kind, e.replica) for e in backend.seen]  # type: ignore[attr-defined]
    new_ready = next(i for i, (k, r) in enumerate(kinds) if k == "ready" and r != old.id)
    old_stopped = next(i for i, (k, r) in enumerate(kinds) if k == "stopped" and r == old.id)
    assert new_ready < old_stopped


async def test_an_on_demand_model_loads_when_asked_and_stops_at_zero(
        backend: LocalBackend) -> None:
    """set_demand(1) loads a replica that answers; set_demand(0) stops it and its process."""
    await backend.apply(build_catalog([cpu_model("gemma", min_=0)]))
    assert backend.endpoints("gemma") == []
    await backend.set_demand("gemma", 1)
    [base] = await ready(backend, "gemma")
    assert (await chat(base)).strip()
    [r] = await backend.replicas("gemma")
    pid = backend._runners[r.id].pid
    await backend.set_demand("gemma", 0)

    async def stopped() -> bool:
        return await backend.replicas("gemma") == []
    await until(stopped, "the on-demand replica to stop", 60)
    assert pid is not None
    assert not alive(pid)
