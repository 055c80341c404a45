"""The gateway's endpoints, keys and bad input, against fake engines on loopback."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from llmgw.config import load_config
from llmgw.errors import ConfigError
from llmgw.gateway.keys import add_key, revoke_key
from llmgw.scheduler.base import BackendHealth
from tests.gateway.conftest import GatewayFactory, chat_model, wait_for


def _error(response: httpx.Response) -> dict[str, object]:
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"]
    return body["error"]  # type: ignore[no-any-return]


async def test_each_endpoint_is_forwarded_with_the_served_model_name(
        make_gateway: GatewayFactory, engines) -> None:
    """Chat, completions and embeddings reach the engine with `model` mapped to its served name,
    every other field unchanged."""
    engine = await engines("a")
    gw = await make_gateway([chat_model("llama", upstream=[engine.url],
                                        served_name="meta/Llama-3")])
    body = {"model": "llama", "messages": [{"role": "user", "content": "hi"}],
            "temperature": 0.70, "extra_field": {"b": 1, "a": [1, 2]}}
    chat = await gw.client.post("/v1/chat/completions", json=body)
    assert chat.status_code == 200
    assert chat.headers["x-llmgw-model"] == "llama"
    assert chat.json()["choices"][0]["message"]["content"] == "hello from a"
    completion = await gw.client.post("/v1/completions", json={"model": "llama", "prompt": "x"})
    assert completion.json()["choices"][0]["text"] == "hello from a"
    embedding = await gw.client.post("/v1/embeddings", json={"model": "llama",
                                                             "input": ["a", "b"]})
    assert len(embedding.json()["data"]) == 2
    assert engine.paths == ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"]
    assert [r["model"] for r in engine.requests] == ["meta/Llama-3"] * 3
    assert engine.requests[0] == {**body, "model": "meta/Llama-3"}


async def test_body_is_forwarded_byte_for_byte_when_names_match(
        make_gateway: GatewayFactory, engines) -> None:
    """With no served name to map, the engine receives exactly the client's bytes."""
    engine = await engines()
    gw = await make_gateway([chat_model("m", upstream=[engine.url])])
    raw = b'{"model":"m",  "messages":[{"role":"user","content":"x"}],"top_p":1.0e0}'
    seen: list[bytes] = []
    original = engine._handle

    async def spy(request):  # type: ignore[no-untyped-def]
        seen.append(await request.read())
        return await original(request)

    engine._handle = spy  # type: ignore[method-assign]
    app_router = engine._runner.app.router  # type: ignore[union-attr]
    for route in app_router.routes():
        if route.resource and route.resource.canonical == "/v1/chat/completions":
            route._handler = spy
    r = await gw.client.post("/v1/chat/completions", content=raw,
                             headers={"content-type": "application/json"})
    assert r.status_code == 200
    assert seen == [raw]


async def test_streaming_chunks_reach_the_client_before_the_engine_finishes(
        make_gateway: GatewayFactory, engines) -> None:
    """The first chunk arrives at the client while the engine is still holding the rest."""
    engine = await engines()
    engine.chunks = 4
    engine.gate = asyncio.Event()
    gw = await make_gateway([chat_model("m", upstream=[engine.url])])
    body = {"model": "m", "messages": [], "stream": True}
    async with gw.client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["x-llmgw-model"] == "m"
        lines = response.aiter_lines()
        first = await anext(lines)
        assert "tok0" in first
        assert engine.finished == 0
        assert engine.in_flight == 1
        engine.gate.set()
        rest = [line async for line in lines]
    assert engine.finished == 1
    assert [x for x in rest if x.startswith("data:")][-1] == "data: [DONE]"
    assert sum("tok" in x for x in rest) == 3


async def test_models_lists_only_what_the_key_may_use(make_gateway: GatewayFactory, engines,
                                                      tmp_path: Path) -> None:
    """GET /v1/models lists the catalog filtered by the key's allow-list."""
    engine = await engines()
    keys = tmp_path / "keys.json"
    limited = add_key(keys, "limited", ["b"])
    full = add_key(keys, "full")
    gw = await make_gateway([chat_model(n, upstream=[engine.url]) for n in ("a", "b", "c")],
                            keys_file=keys)

    async def ids(key: str) -> list[str]:
        r = await gw.client.get("/v1/models", headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200
        assert r.json()["object"] == "list"
        return [m["id"] for m in r.json()["data"]]

    assert await ids(limited) == ["b"]
    assert await ids(full) == ["a", "b", "c"]
    one = await gw.client.get("/v1/models/b", headers={"Authorization": f"Bearer {limited}"})
    assert one.json()["id"] == "b"
    hidden = await gw.client.get("/v1/models/a", headers={"Authorization": f"Bearer {limited}"})
    assert hidden.status_code == 404
    assert (await gw.client.get("/v1/models")).status_code == 401


async def test_bad_input_gets_openai_shaped_errors_and_others_are_still_served(
        make_gateway: GatewayFactory, engines) -> None:
    """Malformed JSON, missing or mistyped fields, unknown models, wrong methods and paths
    are each refused with the right status; a good request right after is served."""
    engine = await engines()
    gw = await make_gateway([chat_model("m", upstream=[engine.url])], max_body_size=1000)
    post = gw.client.post
    cases = [
        (await post("/v1/chat/completions", content=b'{"model": "m", '), 400, None),
        (await post("/v1/chat/completions", content=b"[1, 2]"), 400, None),
        (await post("/v1/chat/completions", json={"messages": []}), 400, "model"),
        (await post("/v1/chat/completions", json={"model": 3}), 400, "model"),
        (await post("/v1/chat/completions", json={"model": ""}), 400, "model"),
        (await post("/v1/chat/completions", json={"model": "m", "stream": "yes"}), 400,
         "stream"),
        (await post("/v1/chat/completions", json={"model": "nope"}), 404, "model"),
        (await post("/v1/chat/completions", json={"model": "m", "pad": "x" * 2000}), 413, None),
        (await gw.client.get("/v1/chat/completions"), 405, None),
        (await post("/v1/assistants", json={}), 404, None),
    ]
    for response, status, param in cases:
        assert response.status_code == status, (response.status_code, response.text)
        error = _error(response)
        assert error["param"] == param, error
    assert _error(cases[6][0])["code"] == "model_not_found"
    assert _error(cases[0][0])["type"] == "invalid_request_error"
    assert engine.requests == []
    ok = await gw.chat("m")
    assert ok.status_code == 200


async def test_body_limit_applies_without_content_length(make_gateway: GatewayFactory,
                                                          engines) -> None:
    """A chunked body that grows past max_body_size is refused with 413 while reading."""
    engine = await engines()
    gw = await make_gateway([chat_model("m", upstream=[engine.url])], max_body_size=1000)

    async def chunks():  # type: ignore[no-untyped-def]
        yield b'{"model": "m", "pad": "'
        for _ in range(20):
            yield b"x" * 100
        yield b'"}'

    r = await gw.client.post("/v1/chat/completions", content=chunks(),
                             headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert "max_body_size" in _error(r)["message"]  # type: ignore[operator]


async def test_keys_are_required_and_checked(make_gateway: GatewayFactory, engines,
                                             tmp_path: Path) -> None:
    """No key and a wrong key are 401, a key not allowed the model 403, a good key 200."""
    engine = await engines()
    keys = tmp_path / "keys.json"
    alice = add_key(keys, "alice", ["a"])
    gw = await make_gateway([chat_model(n, upstream=[engine.url]) for n in ("a", "b")],
                            keys_file=keys)
    missing = await gw.chat("a")
    wrong = await gw.chat("a", key="sk-llmgw-not-a-key")
    basic = await gw.client.post("/v1/chat/completions", json={"model": "a"},
                                 headers={"Authorization": f"Basic {alice}"})
    forbidden = await gw.chat("b", key=alice)
    ok = await gw.chat("a", key=alice)
    assert [r.status_code for r in (missing, wrong, basic, forbidden, ok)] == [
        401, 401, 401, 403, 200]
    assert _error(wrong)["code"] == "invalid_api_key"
    assert _error(forbidden)["type"] == "permission_error"
    assert len(engine.requests) == 1
    assert len(engine.headers) == 1
    assert "authorization" not in engine.headers[0]
    assert alice not in " ".join(engine.headers[0].values())


async def test_revoked_and_added_keys_take_effect_without_restart(
        make_gateway: GatewayFactory, engines, tmp_path: Path) -> None:
    """The gateway notices the keys file changing: a revoked key is refused, a new one works."""
    engine = await engines()
    keys = tmp_path / "keys.json"
    alice = add_key(keys, "alice")
    gw = await make_gateway([chat_model("m", upstream=[engine.url])], keys_file=keys,
                            keys_check_interval="50ms")
    assert (await gw.chat("m", key=alice)).status_code == 200
    revoke_key(keys, "alice")
    bob = add_key(keys, "bob")
    statuses: dict[str, int] = {}

    async def poll() -> bool:
        statuses["alice"] = (await gw.chat("m", key=alice)).status_code
        statuses["bob"] = (await gw.chat("m", key=bob)).status_code
        return statuses == {"alice": 401, "bob": 200}

    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while not await poll():
        assert loop.time() < deadline, statuses
        await asyncio.sleep(0.05)


async def test_rate_limit_answers_429_with_retry_after(make_gateway: GatewayFactory, engines,
                                                       tmp_path: Path) -> None:
    """A key over its requests-per-minute gets 429 with Retry-After; other keys are unaffected."""
    engine = await engines()
    keys = tmp_path / "keys.json"
    slow = add_key(keys, "slow", rpm=2)
    other = add_key(keys, "other")
    gw = await make_gateway([chat_model("m", upstream=[engine.url])], keys_file=keys)
    statuses = [(await gw.chat("m", key=slow)).status_code for _ in range(2)]
    limited = await gw.chat("m", key=slow)
    assert statuses == [200, 200]
    assert limited.status_code == 429
    assert 1 <= int(limited.headers["retry-after"]) <= 30
    assert _error(limited)["type"] == "rate_limit_error"
    assert (await gw.chat("m", key=other)).status_code == 200


async def test_requests_refused_403_do_not_count_against_the_rate_limit(
        make_gateway: GatewayFactory, engines, tmp_path: Path) -> None:
    """Asking for models the key may not use leaves its allowance for the ones it may."""
    engine = await engines()
    keys = tmp_path / "keys.json"
    key = add_key(keys, "narrow", rpm=2, models=["m"])
    gw = await make_gateway([chat_model("m", upstream=[engine.url]),
                             chat_model("other", upstream=[engine.url])], keys_file=keys)
    refused = [(await gw.chat("other", key=key)).status_code for _ in range(5)]
    assert refused == [403] * 5
    assert [(await gw.chat("m", key=key)).status_code for _ in range(2)] == [200, 200]
    assert (await gw.chat("m", key=key)).status_code == 429


async def test_without_keys_file_inference_is_open_only_on_loopback(
        make_gateway: GatewayFactory, engines) -> None:
    """No keys_file: a loopback listener serves without a key, any other listener refuses."""
    engine = await engines()
    local = await make_gateway([chat_model("m", upstream=[engine.url])], listen="127.0.0.1:80")
    assert (await local.chat("m")).status_code == 200
    public = await make_gateway([chat_model("m", upstream=[engine.url])], listen="0.0.0.0:80")
    refused = await public.chat("m", key="anything")
    assert refused.status_code == 401
    assert "keys_file" in _error(refused)["message"]  # type: ignore[operator]


async def test_metrics_count_requests_tokens_and_replicas(make_gateway: GatewayFactory,
                                                          engines) -> None:
    """/metrics reports requests by model and status, latency, TTFT, tokens from usage (also in
    streams), in-flight and healthy replicas."""
    engine = await engines()
    gw = await make_gateway([chat_model("m", upstream=[engine.url])])
    await gw.chat("m")
    await gw.chat("m", stream=True, stream_options={"include_usage": True})
    await gw.chat("unknown-model")
    await gw.client.post("/v1/chat/completions", content=b"{")
    await wait_for(lambda: engine.finished == 2, what="both requests to finish")
    text = (await gw.client.get("/metrics")).text
    expected = [
        'llmgw_gateway_requests_total{model="m",status="200"} 2.0',
        'llmgw_gateway_requests_total{model="(unknown)",status="404"} 1.0',
        'llmgw_gateway_requests_total{model="",status="400"} 1.0',
        'llmgw_gateway_request_duration_seconds_count{model="m"} 2.0',
        'llmgw_gateway_time_to_first_token_seconds_count{model="m"} 1.0',
        'llmgw_gateway_tokens_total{kind="prompt",model="m"} 12.0',
        'llmgw_gateway_tokens_total{kind="completion",model="m"} 6.0',
        'llmgw_gateway_in_flight_requests{model="m"} 0.0',
        'llmgw_gateway_healthy_replicas{model="m"} 1.0',
        'llmgw_gateway_ejected_replicas{model="m"} 0.0',
    ]
    for line in expected:
        assert line in text, line


async def test_metrics_carry_the_schedulers_view_that_alerts_read(
        make_gateway: GatewayFactory, engines) -> None:
    """Each scheduled model's desired replica count and crash loop, and whether the
    scheduler is reachable, are on /metrics for the alerting rules (deploy/llmgw-rules.yml);
    an external model has no scheduler figures."""
    engine = await engines()
    gw = await make_gateway([chat_model("m"), chat_model("ext", upstream=[engine.url])])
    gw.backend.desired["m"] = 3
    gw.backend.set_endpoints("m", [engine.url])
    gw.backend.crash_looping.add("m")
    text = (await gw.client.get("/metrics")).text
    for line in ('llmgw_scheduler_desired_replicas{model="m"} 3.0',
                 'llmgw_scheduler_crash_loop{model="m"} 1.0',
                 'llmgw_gateway_healthy_replicas{model="m"} 1.0',
                 "llmgw_scheduler_up 1.0"):
        assert line in text, line
    assert 'llmgw_scheduler_desired_replicas{model="ext"}' not in text
    gw.backend.crash_looping.clear()
    gw.backend.scheduler_health = BackendHealth(ok=False, message="cannot reach Nomad")
    text = (await gw.client.get("/metrics")).text
    assert 'llmgw_scheduler_crash_loop{model="m"} 0.0' in text
    assert "llmgw_scheduler_up 0.0" in text


async def test_an_internal_error_is_a_500_and_the_gateway_keeps_serving(
        make_gateway: GatewayFactory, engines, monkeypatch) -> None:
    """A bug on the request path answers 500 in OpenAI's shape, logged; the next request works."""
    engine = await engines()
    gw = await make_gateway([chat_model("m", upstream=[engine.url])])
    original = gw.gateway.forwarder.forward
    calls = 0

    async def broken_once(*args, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("boom")
        return await original(*args, **kwargs)

    monkeypatch.setattr(gw.gateway.forwarder, "forward", broken_once)
    failed = await gw.chat("m")
    assert failed.status_code == 500
    assert "log" in _error(failed)["message"]  # type: ignore[operator]
    assert (await gw.chat("m")).status_code == 200


@pytest.mark.parametrize(("gateway", "complaint"), [
    ("{eject_for: soon}", r"gateway\.eject_for: 'soon' is not a duration"),
    ("{eject_for: 5m, eject_max: 1m}", r"gateway\.eject_max \(1m\) is shorter"),
    ("{max_body_size: 0}", r"gateway\.max_body_size: must be more than 0"),
    ("{batch_concurrency: 0}", r"gateway\.batch_concurrency: must be at least 1"),
    ("{responses_retention: 0s}", r"gateway\.responses_retention: must be more than 0"),
    ("{max_file_size: 0}", r"gateway\.max_file_size: must be more than 0"),
])
def test_a_bad_gateway_setting_is_a_config_error_naming_it(tmp_path: Path, gateway: str,
                                                          complaint: str) -> None:
    """A malformed or contradictory gateway setting stops start-up with the key path."""
    path = tmp_path / "server.yaml"
    path.write_text(f"gateway: {gateway}\n")
    with pytest.raises(ConfigError, match=complaint):
        load_config(path, env={})
