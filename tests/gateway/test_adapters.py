"""Requests for LoRA adapters: routed where the adapter is, loaded once where it is not."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import msgspec
import pytest

from llmgw.catalog.adapter import Adapter
from llmgw.catalog.build import build_catalog
from llmgw.catalog.decode import convert
from llmgw.catalog.model import Model
from llmgw.catalog.source import Source
from llmgw.gateway.adapters import lora_info
from llmgw.testing.simengine import SimEngine, SimSpec
from tests.gateway.conftest import GatewayFactory, GatewayHandle, wait_for

Sims = Callable[..., Awaitable[list[SimEngine]]]
FAST = {"signal_interval": "100ms"}


def base(slots: int = 2) -> Model:
    return convert({
        "name": "qwen", "source": "/models/qwen", "engine": "vllm",
        "served_name": "Qwen/Qwen2.5-7B",
        "lora": {"slots": slots, "cpu_slots": slots},
        "routing": {"policy": "least-outstanding"},
        "profiles": [{"name": "cpu", "cpu_cores": 1, "memory": "1GiB"}]}, Model)


@pytest.fixture
async def sims() -> AsyncIterator[Sims]:
    started: list[SimEngine] = []

    async def start(n: int, *, slots: int = 2, load_time: float = 0.2,
                    check_paths: bool = True) -> list[SimEngine]:
        for _ in range(n):
            engine = SimEngine(SimSpec(step_time=0.002, prefill_per_token=0.00001,
                                       lora_slots=slots, lora_cpu_slots=slots,
                                       lora_load_time=load_time, lora_check_paths=check_paths),
                               name="Qwen/Qwen2.5-7B")
            await engine.start()
            started.append(engine)
        return started[-n:]

    yield start
    for engine in started:
        await engine.stop()


def adapter_dir(tmp_path: Path, name: str) -> Path:
    path = tmp_path / "adapters" / name
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text('{"r": 8, "peft_type": "LORA"}')
    return path


async def gateway(make_gateway: GatewayFactory, engines: list[SimEngine],
                  adapters: list[Adapter], slots: int = 2) -> GatewayHandle:
    model = base(slots)
    gw = await make_gateway([model], **FAST)
    gw.catalogs.catalog = build_catalog([model], adapters=adapters)
    gw.backend.set_endpoints("qwen", [e.url for e in engines])
    return gw


def loads(engines: list[SimEngine]) -> int:
    return sum(e.lora.load_calls for e in engines)


async def test_concurrent_requests_for_an_unloaded_adapter_cause_one_load(
        make_gateway: GatewayFactory, sims: Sims, tmp_path: Path) -> None:
    """Eight requests at once on one replica: one load, and every one answered by it."""
    [engine] = await sims(1)
    sql = Adapter(name="qwen-sql", base="qwen",
                  source=Source.parse(str(adapter_dir(tmp_path, "sql"))))
    gw = await gateway(make_gateway, [engine], [sql])
    answers = await asyncio.gather(*(gw.chat("qwen-sql", max_tokens=2) for _ in range(8)))
    assert [r.status_code for r in answers] == [200] * 8
    assert {r.json()["model"] for r in answers} == {"qwen-sql"}
    assert gw.gateway.adapters.loads == 1
    assert engine.lora.registered["qwen-sql"] == str(tmp_path / "adapters" / "sql")
    assert gw.gateway.metrics.adapter_loads.labels("qwen", "qwen-sql",
                                                   "loaded")._value.get() == 1
    assert engine.requests == 8


async def test_a_hot_adapter_spreads_without_loading_twice_anywhere(
        make_gateway: GatewayFactory, sims: Sims, tmp_path: Path) -> None:
    """A queue behind its holder loads it on another replica, never twice on one."""
    engines = await sims(3)
    sql = Adapter(name="qwen-sql", base="qwen",
                  source=Source.parse(str(adapter_dir(tmp_path, "sql"))))
    gw = await gateway(make_gateway, engines, [sql])
    answers = await asyncio.gather(*(gw.chat("qwen-sql", max_tokens=8) for _ in range(24)))
    assert [r.status_code for r in answers] == [200] * 24
    holders = [e for e in engines if "qwen-sql" in e.lora.registered]
    assert len(holders) >= 2
    assert gw.gateway.adapters.loads == len(holders)


async def test_later_requests_go_to_the_replica_that_holds_the_adapter(
        make_gateway: GatewayFactory, sims: Sims, tmp_path: Path) -> None:
    """Once loaded, an adapter's requests find it; nothing is loaded again."""
    engines = await sims(3)
    adapters = [Adapter(name=f"ft-{i}", base="qwen",
                        source=Source.parse(str(adapter_dir(tmp_path, f"ft-{i}"))))
                for i in range(3)]
    gw = await gateway(make_gateway, engines, adapters)
    for _ in range(3):
        for a in adapters:
            assert (await gw.chat(a.name, max_tokens=2)).status_code == 200
    assert loads(engines) == 3


async def test_an_adapter_that_fails_to_load_is_503_with_the_engines_reason(
        make_gateway: GatewayFactory, sims: Sims, tmp_path: Path) -> None:
    """No adapter_config.json: 503 naming the engine's refusal, never the base's answer."""
    engines = await sims(2)
    empty = tmp_path / "not-an-adapter"
    empty.mkdir()
    bad = Adapter(name="qwen-bad", base="qwen", source=Source.parse(str(empty)))
    gw = await gateway(make_gateway, engines, [bad])
    r = await gw.chat("qwen-bad", max_tokens=2)
    assert r.status_code == 503, r.text
    error = r.json()["error"]
    assert error["code"] == "adapter_unavailable"
    assert "adapter_config.json is missing" in error["message"]
    assert sum(e.requests for e in engines) == 0


async def test_the_least_recently_used_adapter_is_evicted_but_a_pinned_one_stays(
        make_gateway: GatewayFactory, sims: Sims, tmp_path: Path) -> None:
    """One replica, two slots: the pinned adapter survives three others passing through."""
    [engine] = await sims(1)
    names = ["pin", "a", "b", "c"]
    adapters = [Adapter(name=n, base="qwen", pinned=n == "pin",
                        source=Source.parse(str(adapter_dir(tmp_path, n)))) for n in names]
    gw = await gateway(make_gateway, [engine], adapters)
    await wait_for(lambda: "pin" in engine.lora.registered, what="the pinned adapter")
    for n in ("a", "b", "c"):
        gw.gateway.adapters.placement.held(engine.url).loaded_at.clear()   # past residency
        assert (await gw.chat(n, max_tokens=2)).status_code == 200
    assert sorted(engine.lora.registered) == ["c", "pin"]


async def test_another_gateway_process_sees_what_was_loaded_and_does_not_reload(
        make_gateway: GatewayFactory, sims: Sims, tmp_path: Path) -> None:
    """What is loaded where is read from the engines, so a second process uses it."""
    engines = await sims(3)
    sql = Adapter(name="qwen-sql", base="qwen",
                  source=Source.parse(str(adapter_dir(tmp_path, "sql"))))
    first = await gateway(make_gateway, engines, [sql])
    assert (await first.chat("qwen-sql", max_tokens=2)).status_code == 200
    second = await gateway(make_gateway, engines, [sql])
    placement = second.gateway.adapters.placement
    await wait_for(lambda: bool(placement.holders("qwen-sql", [e.url for e in engines])),
                   what="the second process to read the engines' adapters")
    assert (await second.chat("qwen-sql", max_tokens=2)).status_code == 200
    assert loads(engines) == 1


async def test_a_dead_replica_holding_the_adapter_costs_no_request(
        make_gateway: GatewayFactory, sims: Sims, tmp_path: Path) -> None:
    """The holder dies: the adapter is loaded on a live replica and the request answered."""
    engines = await sims(2)
    sql = Adapter(name="qwen-sql", base="qwen",
                  source=Source.parse(str(adapter_dir(tmp_path, "sql"))))
    gw = await gateway(make_gateway, engines, [sql])
    assert (await gw.chat("qwen-sql", max_tokens=2)).status_code == 200
    [holder] = [e for e in engines if "qwen-sql" in e.lora.registered]
    await holder.stop()
    r = await gw.chat("qwen-sql", max_tokens=2)
    assert r.status_code == 200, r.text
    [other] = [e for e in engines if e is not holder]
    assert "qwen-sql" in other.lora.registered


async def test_v1_models_lists_adapters_with_their_base(make_gateway: GatewayFactory,
                                                        sims: Sims, tmp_path: Path) -> None:
    """An adapter appears in /v1/models with `parent`, as vLLM lists one."""
    engines = await sims(1)
    sql = Adapter(name="qwen-sql", base="qwen", source=Source.parse("/adapters/sql"))
    gw = await gateway(make_gateway, engines, [sql])
    cards = (await gw.client.get("/v1/models")).json()["data"]
    assert {"id": "qwen-sql", "parent": "qwen", "object": "model", "created": 0,
            "owned_by": "llmgw"} in cards
    one = (await gw.client.get("/v1/models/qwen-sql")).json()
    assert one["parent"] == "qwen"


async def test_a_held_stream_gets_keepalive_comments_while_its_adapter_loads(
        make_gateway: GatewayFactory, sims: Sims, tmp_path: Path) -> None:
    """A slow load holds a stream with SSE comments; its answer then streams as usual."""
    engines = await sims(1, load_time=1.0)
    sql = Adapter(name="qwen-sql", base="qwen",
                  source=Source.parse(str(adapter_dir(tmp_path, "sql"))))
    model = base()
    gw = await make_gateway([model], keepalive_interval="200ms", **FAST)
    gw.catalogs.catalog = build_catalog([model], adapters=[sql])
    gw.backend.set_endpoints("qwen", [engines[0].url])
    async with gw.client.stream("POST", "/v1/chat/completions", json={
            "model": "qwen-sql", "stream": True, "max_tokens": 2,
            "messages": [{"role": "user", "content": "hi"}]}) as r:
        text = "".join([chunk async for chunk in r.aiter_text()])
    assert r.status_code == 200
    assert ": waiting for a replica of qwen" in text
    assert text.rstrip().endswith("data: [DONE]")


def test_lora_info_reads_the_running_and_waiting_adapters() -> None:
    """vLLM's gauge carries comma-separated names in its labels."""
    page = (b'# TYPE vllm:lora_requests_info gauge\nvllm:lora_requests_info{max_lora="4",'
            b'running_lora_adapters="a,b",waiting_lora_adapters=""} 1.7e9\n')
    assert lora_info(page) == (["a", "b"], [])
    assert lora_info(b"vllm:num_requests_running 0\n") is None


async def test_a_key_without_the_adapter_in_its_allow_list_is_refused(
        make_gateway: GatewayFactory, sims: Sims, tmp_path: Path) -> None:
    """Allow-lists name adapters: allowing the base does not allow its fine-tunes."""
    from llmgw.gateway.keys import add_key

    engines = await sims(1)
    keys = tmp_path / "keys.json"
    token = add_key(keys, "team-a", models=["qwen"])
    sql = Adapter(name="qwen-sql", base="qwen", source=Source.parse("/adapters/sql"))
    model = base()
    gw = await make_gateway([model], keys_file=keys, **FAST)
    gw.catalogs.catalog = build_catalog([model], adapters=[sql])
    gw.backend.set_endpoints("qwen", [engines[0].url])
    r = await gw.chat("qwen-sql", key=token, max_tokens=2)
    assert r.status_code == 403
    listed = (await gw.client.get("/v1/models", headers={
        "Authorization": f"Bearer {token}"})).json()["data"]
    assert [c["id"] for c in listed] == ["qwen"]


async def test_a_responses_request_names_the_adapter_to_the_engine(
        make_gateway: GatewayFactory, sims: Sims, tmp_path: Path) -> None:
    """A Responses request for an adapter reaches the engine as the adapter, not its base."""
    [engine] = await sims(1)
    sql = Adapter(name="qwen-sql", base="qwen",
                  source=Source.parse(str(adapter_dir(tmp_path, "sql"))))
    model = msgspec.structs.replace(base(), capabilities=["chat", "completions"])
    gw = await make_gateway([model], **FAST)
    gw.catalogs.catalog = build_catalog([model], adapters=[sql])
    gw.backend.set_endpoints("qwen", [engine.url])
    r = await gw.client.post("/v1/responses", json={"model": "qwen-sql", "input": "hi",
                                                    "max_output_tokens": 2})
    assert r.status_code == 200, r.text
    assert engine.asked == ["qwen-sql"]
