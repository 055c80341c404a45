"""The gateway against simulated engines: prefix affinity, engine signals, admission, scaling."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from llmgw.gateway.keys import add_key
from llmgw.scheduler.base import ScalerDecisions as Decisions
from llmgw.testing.simengine import SimEngine, SimSpec
from tests.gateway.conftest import GatewayFactory, chat_model, wait_for
from tests.gateway.doubles import FakeBackend
from tests.gateway.engine import FakeEngine

SimFactory = Callable[..., Awaitable[SimEngine]]
FAST = {"signal_interval": "100ms", "scale_interval": "200ms"}


@pytest.fixture
async def sims() -> AsyncIterator[SimFactory]:
    started: list[SimEngine] = []

    async def start(spec: SimSpec | None = None) -> SimEngine:
        engine = SimEngine(spec or SimSpec(step_time=0.002, prefill_per_token=0.00002))
        await engine.start()
        started.append(engine)
        return engine

    yield start
    for engine in started:
        await engine.stop()


def conversation(session: int, turns: int) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": f"Session {session}. " + "Be brief. " * 150},
                {"role": "user", "content": f"first question of {session}"}]
    for t in range(1, turns):
        messages += [{"role": "assistant", "content": f"answer {t}"},
                     {"role": "user", "content": f"follow-up {t}"}]
    return messages


async def ask(gw: Any, model: str, messages: list[dict[str, str]], *, key: str | None = None,
              max_tokens: int = 4) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return await gw.client.post("/v1/chat/completions", headers=headers, json={
        "model": model, "messages": messages, "max_tokens": max_tokens})


async def test_prefix_affinity_keeps_a_conversation_on_the_replica_that_cached_it(
        make_gateway: GatewayFactory, sims: SimFactory) -> None:
    """Every turn of a session reaches one replica, and later turns report cached tokens."""
    engines = [await sims() for _ in range(3)]
    model = chat_model("m", upstream=[e.url for e in engines],
                       routing={"policy": "prefix-affinity", "engine_metrics": True})
    gw = await make_gateway([model], **FAST)
    cached: list[int] = []
    for session in range(6):
        before = [e.requests for e in engines]
        for turn in range(1, 4):
            r = await ask(gw, "m", conversation(session, turn))
            assert r.status_code == 200, r.text
            if turn > 1:
                cached.append(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
        grew = [e.requests - b for e, b in zip(engines, before, strict=True)]
        assert sorted(grew) == [0, 0, 3], f"session {session} spread over replicas: {grew}"
    assert all(c > 300 for c in cached), cached
    assert len({e.url for e in engines if e.requests}) >= 2


async def test_least_outstanding_ignores_the_prefix(make_gateway: GatewayFactory,
                                                    sims: SimFactory) -> None:
    """Under least-outstanding, sequential turns of a session rotate over the replicas."""
    engines = [await sims() for _ in range(3)]
    model = chat_model("m", upstream=[e.url for e in engines],
                       routing={"policy": "least-outstanding"})
    gw = await make_gateway([model], **FAST)
    for turn in range(1, 4):
        assert (await ask(gw, "m", conversation(1, turn))).status_code == 200
    assert [e.requests for e in engines] == [1, 1, 1]


async def test_the_gateway_reads_engine_queues_and_lives_without_them(
        make_gateway: GatewayFactory, sims: SimFactory, engines: Callable[..., Any],
        caplog: pytest.LogCaptureFixture) -> None:
    """A vLLM-like replica is scraped; one without /metrics serves anyway, warned about once."""
    sim = await sims()
    plain: FakeEngine = await engines("plain")
    model = chat_model("m", upstream=[sim.url, plain.url],
                       routing={"policy": "least-outstanding", "engine_metrics": True})
    caplog.set_level(logging.WARNING, logger="llmgw.gateway.signals")
    gw = await make_gateway([model], **FAST)
    balancer = gw.gateway.balancer
    loop = asyncio.get_running_loop()
    await wait_for(lambda: balancer.sample(sim.url, loop.time()) is not None,
                   what="the simulated engine's metrics to be read")
    await wait_for(lambda: gw.gateway.signals.rounds >= 5, what="five scrape rounds")
    assert balancer.sample(plain.url, loop.time()) is None
    for _ in range(4):
        r = await gw.chat("m")
        assert r.status_code == 200
    assert plain.finished >= 1
    warnings = [r for r in caplog.records if plain.url in r.getMessage()]
    assert len(warnings) == 1
    metrics = (await gw.client.get("/metrics")).text
    assert 'llmgw_gateway_engine_requests{model="m",state="running"}' in metrics


async def test_a_saturated_model_queues_then_answers_429_with_retry_after(
        make_gateway: GatewayFactory, sims: SimFactory) -> None:
    """Beyond max_concurrency and the queue's bound, requests get 429 in OpenAI's shape."""
    sim = await sims(SimSpec(step_time=0.02, max_seqs=1))
    model = chat_model("m", upstream=[sim.url], routing={
        "policy": "least-outstanding", "max_concurrency": 1, "queue_size": 2,
        "queue_wait": "30s"})
    gw = await make_gateway([model], **FAST)
    answers = await asyncio.gather(*(ask(gw, "m", conversation(i, 1), max_tokens=10)
                                     for i in range(6)))
    codes = sorted(r.status_code for r in answers)
    assert codes.count(200) >= 3
    refused = [r for r in answers if r.status_code == 429]
    assert refused, codes
    error = refused[0].json()["error"]
    assert error["code"] == "model_overloaded"
    assert error["type"] == "rate_limit_error"
    assert int(refused[0].headers["retry-after"]) >= 1
    assert max(sim.running + sim.waiting, 0) <= 1
    metrics = (await gw.client.get("/metrics")).text
    assert 'llmgw_gateway_admission_rejections_total{model="m",reason="queue_full"}' in metrics


async def test_a_request_held_longer_than_queue_wait_is_answered_429(
        make_gateway: GatewayFactory, sims: SimFactory) -> None:
    """A queued request that waits past routing.queue_wait is refused, not served late."""
    sim = await sims(SimSpec(step_time=0.05, max_seqs=1))
    model = chat_model("m", upstream=[sim.url], routing={
        "policy": "least-outstanding", "max_concurrency": 1, "queue_wait": "200ms"})
    gw = await make_gateway([model], **FAST)
    slow = asyncio.create_task(ask(gw, "m", conversation(1, 1), max_tokens=40))
    await wait_for(lambda: sim.running == 1, what="the first request to run")
    late = await ask(gw, "m", conversation(2, 1))
    assert late.status_code == 429
    assert "routing.queue_wait" in late.json()["error"]["message"]
    assert (await slow).status_code == 200


async def test_interactive_keys_are_served_before_batch_keys(
        make_gateway: GatewayFactory, sims: SimFactory, tmp_path: Path) -> None:
    """With the model saturated, a later interactive request overtakes a queued batch one."""
    keys = tmp_path / "keys.json"
    bulk = add_key(keys, "nightly", priority="batch")
    person = add_key(keys, "alice")
    sim = await sims(SimSpec(step_time=0.03, max_seqs=1))
    model = chat_model("m", upstream=[sim.url], routing={
        "policy": "least-outstanding", "max_concurrency": 1})
    gw = await make_gateway([model], keys_file=keys, **FAST)
    done: list[str] = []

    async def call(who: str, key: str, tokens: int) -> None:
        r = await ask(gw, "m", conversation(len(done), 1), key=key, max_tokens=tokens)
        assert r.status_code == 200, r.text
        done.append(who)

    first = asyncio.create_task(call("first", person, 20))
    await wait_for(lambda: sim.running == 1, what="the first request to run")
    batch = asyncio.create_task(call("batch", bulk, 2))
    await wait_for(lambda: len(gw.gateway.queues["m"]) == 1, what="the batch request to queue")
    interactive = asyncio.create_task(call("interactive", person, 2))
    await asyncio.gather(first, batch, interactive)
    assert done == ["first", "interactive", "batch"]


async def test_a_teams_burst_does_not_starve_another_team(
        make_gateway: GatewayFactory, sims: SimFactory) -> None:
    """Within a priority class, a team arriving behind another team's burst goes next."""
    from llmgw.tenancy import Limits
    from tests.gateway.test_tenants import make_key, make_team

    sim = await sims(SimSpec(step_time=0.03, max_seqs=1))
    model = chat_model("m", upstream=[sim.url], routing={
        "policy": "least-outstanding", "max_concurrency": 1})
    gw = await make_gateway([model], listen="0.0.0.0:8080", **FAST)
    await make_team(gw.store, "bulk", Limits())
    await make_team(gw.store, "small", Limits())
    bulk = await make_key(gw.store, "bulk-key", "bulk")
    small = await make_key(gw.store, "small-key", "small")
    await wait_for(lambda: len(gw.gateway.keys) == 2, what="the runtime keys")
    done: list[str] = []

    async def call(who: str, key: str, tokens: int) -> None:
        r = await ask(gw, "m", conversation(len(done), 1), key=key, max_tokens=tokens)
        assert r.status_code == 200, r.text
        done.append(who)

    first = asyncio.create_task(call("bulk", bulk, 20))
    await wait_for(lambda: sim.running == 1, what="the first request to run")
    burst = [asyncio.create_task(call("bulk", bulk, 2)) for _ in range(5)]
    await wait_for(lambda: len(gw.gateway.queues["m"]) == 5, what="the burst to queue")
    late = asyncio.create_task(call("small", small, 2))
    await wait_for(lambda: len(gw.gateway.queues["m"]) == 6, what="the other team to queue")
    await asyncio.gather(first, *burst, late)
    # First come, first served would make it last (7th). Deficit round robin lets at
    # most one quantum (1,024 tokens: two of the burst's ~400-token requests) go first.
    assert done.index("small") <= 3, done


async def published(gw: Any, kind: str, timeout: float = 30.0) -> list[Any]:
    """The store's fresh reports of ``kind``, once there is at least one."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not (reports := await gw.store.reports(kind, 60)):
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for a {kind!r} report")
        await asyncio.sleep(0.02)
    return reports


async def test_the_scaler_asks_for_more_replicas_under_load_and_publishes_why(
        make_gateway: GatewayFactory, sims: SimFactory) -> None:
    """Demand over target per replica makes the lease holder raise the count, with a reason."""
    backend = FakeBackend()
    first = await sims(SimSpec(step_time=0.05, max_seqs=4))
    backend.set_endpoints("m", [first.url])
    backend.desired["m"] = 1
    model = chat_model("m", scaling={"min": 1, "max": 4, "target": 2},
                       routing={"policy": "least-outstanding"})
    gw = await make_gateway([model], backend=backend, **FAST)
    load = [asyncio.create_task(ask(gw, "m", conversation(i, 1), max_tokens=60))
            for i in range(8)]
    try:
        await wait_for(lambda: any(n > 1 for _, n in backend.demand_calls),
                       what="the scaler to ask for more replicas")
        model_name, count = backend.demand_calls[0]
        assert model_name == "m"
        assert 2 <= count <= 4
        # The scaler asks the backend first and publishes its decisions after.
        reports = await published(gw, "scaler")
        decided = msgspec.json.decode(reports[0].payload, type=Decisions).models["m"]
        assert decided.desired == count
        assert "requests on 1 ready replica" in decided.reason
    finally:
        for outcome in await asyncio.gather(*load, return_exceptions=True):
            if isinstance(outcome, BaseException):
                raise outcome
    metrics = (await gw.client.get("/metrics")).text
    assert 'llmgw_gateway_desired_replicas{model="m",reason="' in metrics


async def test_a_dead_replica_on_the_ring_costs_prefix_affinity_no_request(
        make_gateway: GatewayFactory, sims: SimFactory) -> None:
    """Conversations whose ring home refuses connections are retried on the next replica."""
    good = await sims()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    model = chat_model("m", upstream=[dead, good.url], routing={"policy": "prefix-affinity"})
    gw = await make_gateway([model], **FAST)
    statuses = [(await ask(gw, "m", conversation(i, 2))).status_code for i in range(8)]
    assert statuses == [200] * 8
    assert good.requests == 8
