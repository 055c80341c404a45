"""Streams that break after they started are continued on another replica of the same model."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from llmgw.catalog.decode import convert
from llmgw.catalog.model import Model
from llmgw.gateway.resume import Splice, resume_kind
from llmgw.testing.simengine import SimEngine, SimSpec
from tests.gateway.conftest import GatewayFactory, GatewayHandle
from tests.gateway.doubles import FakeBackend

SimFactory = Callable[..., Awaitable[SimEngine]]
PROMPT = [{"role": "user", "content": "Tell a long story."}]


@pytest.fixture
async def sims() -> AsyncIterator[SimFactory]:
    started: list[SimEngine] = []

    async def start(chunk_tokens: int = 1) -> SimEngine:
        engine = SimEngine(SimSpec(step_time=0.001, prefill_per_token=0.00001,
                                   chunk_tokens=chunk_tokens), name="served")
        await engine.start()
        started.append(engine)
        return engine

    yield start
    for engine in started:
        await engine.stop()


class Recorder:
    """Keeps the inference bodies a simulated engine received (its own record is only the
    paths)."""

    def __init__(self, engine: SimEngine) -> None:
        self.bodies: list[dict[str, Any]] = []
        original = engine._json

        async def recording(request: Any) -> dict[str, Any]:
            body = await original(request)
            if request.path.startswith("/v1/"):
                self.bodies.append(body)
            return body

        engine._json = recording  # type: ignore[method-assign]


def model(name: str = "m", engine: str = "vllm", **kw: Any) -> Model:
    kw.setdefault("routing", {"policy": "least-outstanding"})
    return convert({"name": name, "source": "/models/x", "engine": engine,
                    "profiles": [{"name": "cpu", "cpu_cores": 1, "memory": "1GiB"}], **kw},
                   Model)


async def gateway(make_gateway: GatewayFactory, models: list[Model],
                  endpoints: dict[str, list[SimEngine]]) -> GatewayHandle:
    backend = FakeBackend()
    for name, engines in endpoints.items():
        backend.set_endpoints(name, [e.url for e in engines])
    return await make_gateway(models, backend=backend)


def events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[len("data: "):]) for line in text.splitlines()
            if line.startswith("data: ") and line != "data: [DONE]"]


def content(evs: list[dict[str, Any]]) -> str:
    return "".join((c["delta"].get("content") or "") if "delta" in c else (c.get("text") or "")
                   for e in evs for c in e.get("choices", []))


def finishes(evs: list[dict[str, Any]]) -> list[str]:
    return [c["finish_reason"] for e in evs for c in e.get("choices", [])
            if c.get("finish_reason")]


async def stream(gw: GatewayHandle, path: str, **body: Any) -> str:
    r = await gw.client.post(path, json={"model": "m", "stream": True, **body})
    assert r.status_code == 200
    return r.text


async def metric(gw: GatewayHandle, line_start: str) -> float:
    text = (await gw.client.get("/metrics")).text
    for line in text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_a_broken_chat_stream_is_continued_with_exactly_the_missing_text(
        make_gateway: GatewayFactory, sims: SimFactory) -> None:
    """A chat stream cut after 5 of 12 tokens reaches the client whole: the text of an
    uninterrupted answer, one id, one role, one finish_reason, no error; the other replica
    was asked to continue the 5 tokens with 7 more."""
    other, breaking = await sims(), await sims()
    seen = Recorder(other)
    gw = await gateway(make_gateway, [model()], {"m": [other, breaking]})
    breaking.break_streams(5)
    text = await stream(gw, "/v1/chat/completions", messages=PROMPT, max_tokens=12)
    assert breaking.requests == 1, "the first pick should be the replica that breaks"
    evs = events(text)
    whole = events(await stream(gw, "/v1/chat/completions", messages=PROMPT, max_tokens=12))
    assert content(evs) == content(whole) == "".join(f"t{i} " for i in range(12))
    assert finishes(evs) == ["length"]
    assert "error" not in text
    assert text.count("data: [DONE]") == 1
    assert len({e["id"] for e in evs}) == 1
    assert sum("role" in c.get("delta", {}) for e in evs for c in e["choices"]) == 1
    continued = seen.bodies[0]
    assert continued["continue_final_message"] is True
    assert continued["add_generation_prompt"] is False
    assert continued["max_tokens"] == 7
    assert continued["messages"] == [*PROMPT, {"role": "assistant",
                                               "content": "t0 t1 t2 t3 t4 "}]
    assert await metric(gw, 'llmgw_gateway_streams_resumed_total{model="m"}') == 1


def external(engine: str | None, urls: list[str]) -> Model:
    entry: dict[str, Any] = {"name": "m", "upstream": urls,
                             "routing": {"policy": "least-outstanding"}}
    if engine is not None:
        entry["engine"] = engine
    return convert(entry, Model)


async def test_an_external_vllm_upstream_resumes_a_broken_chat_stream(
        make_gateway: GatewayFactory, sims: SimFactory) -> None:
    """A vLLM fleet run outside llmgw (upstream, engine: vllm) has its broken chat stream
    continued on its other server as a scheduled vLLM replica's is: continue_final_message,
    add_generation_prompt false, the budget from its /tokenize."""
    other, breaking = await sims(), await sims()
    seen = Recorder(other)
    gw = await make_gateway([external("vllm", [other.url, breaking.url])],
                            backend=FakeBackend())
    breaking.break_streams(5)
    text = await stream(gw, "/v1/chat/completions", messages=PROMPT, max_tokens=12)
    assert breaking.requests == 1, "the first pick should be the server that breaks"
    evs = events(text)
    assert content(evs) == "".join(f"t{i} " for i in range(12))
    assert finishes(evs) == ["length"]
    assert "error" not in text
    continued = seen.bodies[0]
    assert continued["continue_final_message"] is True
    assert continued["add_generation_prompt"] is False
    assert continued["max_tokens"] == 7
    assert "/tokenize" in other.paths
    assert await metric(gw, 'llmgw_gateway_streams_resumed_total{model="m"}') == 1


async def test_an_external_sglang_upstream_is_asked_to_continue_without_vllms_flag(
        make_gateway: GatewayFactory, sims: SimFactory) -> None:
    """SGLang continues a final assistant message with continue_final_message alone: it has
    no add_generation_prompt field, so none is sent (the simulated engine has vLLM's face,
    so only the request it is sent is checked here)."""
    other, breaking = await sims(), await sims()
    seen = Recorder(other)
    gw = await make_gateway([external("sglang", [other.url, breaking.url])],
                            backend=FakeBackend())
    breaking.break_streams(4)
    await stream(gw, "/v1/chat/completions", messages=PROMPT, max_tokens=10)
    continued = seen.bodies[0]
    assert continued["continue_final_message"] is True
    assert "add_generation_prompt" not in continued
    assert continued["messages"][-1] == {"role": "assistant", "content": "t0 t1 t2 t3 "}
    assert continued["max_tokens"] == 6


async def test_an_external_upstream_that_names_no_engine_gets_only_openais_api(
        make_gateway: GatewayFactory, sims: SimFactory) -> None:
    """No engine is OpenAI's API: a broken chat stream ends with the error event (no
    continue_final_message is sent), a broken completion is continued by its prompt alone,
    and /tokenize is never asked."""
    other, breaking = await sims(), await sims()
    gw = await make_gateway([external(None, [other.url, breaking.url])],
                            backend=FakeBackend())
    breaking.break_streams(3)
    text = await stream(gw, "/v1/chat/completions", messages=PROMPT, max_tokens=8)
    assert '"code":"stream_interrupted"' in text
    assert other.requests == 0
    breaking.break_streams(3)
    evs = events(await stream(gw, "/v1/completions", prompt="Once", max_tokens=8))
    assert content(evs) == "".join(f"t{i} " for i in range(8))
    assert "/tokenize" not in other.paths + breaking.paths


async def test_a_broken_completion_stream_continues_from_its_prompt_and_usage_adds_up(
        make_gateway: GatewayFactory, sims: SimFactory) -> None:
    """A completion is continued with the delivered text appended to its prompt, and the
    usage the client gets counts every token it received."""
    other, breaking = await sims(), await sims()
    seen = Recorder(other)
    gw = await gateway(make_gateway, [model()], {"m": [other, breaking]})
    breaking.break_streams(3)
    text = await stream(gw, "/v1/completions", prompt="Once", max_tokens=9,
                        stream_options={"include_usage": True})
    evs = events(text)
    assert content(evs) == "".join(f"t{i} " for i in range(9))
    assert finishes(evs) == ["length"]
    assert seen.bodies[0]["prompt"] == "Oncet0 t1 t2 "
    assert seen.bodies[0]["max_tokens"] == 6
    usage = [e["usage"] for e in evs if e.get("usage")]
    assert usage[-1]["completion_tokens"] == 9


async def test_events_carrying_several_tokens_are_counted_by_the_engine_before_resuming(
        make_gateway: GatewayFactory, sims: SimFactory) -> None:
    """Events of three tokens each (a lagging reader's merged output): the continuation's
    budget comes from vLLM's /tokenize of the delivered text, so the answer still stops at
    max_tokens."""
    other, breaking = await sims(3), await sims(3)
    seen = Recorder(other)
    gw = await gateway(make_gateway, [model()], {"m": [other, breaking]})
    breaking.break_streams(2)
    evs = events(await stream(gw, "/v1/chat/completions", messages=PROMPT, max_tokens=12))
    assert content(evs) == "".join(f"t{i} " for i in range(12))
    assert "/tokenize" in other.paths
    delivered = seen.bodies[0]["messages"][-1]["content"].count(" ")
    assert delivered > 2, "two events should have carried more than two tokens"
    assert seen.bodies[0]["max_tokens"] == 12 - delivered


async def test_a_stream_that_goes_silent_is_continued_after_the_idle_timeout(
        make_gateway: GatewayFactory, sims: SimFactory) -> None:
    """An engine that stops sending mid-stream (frozen, hung) costs the client a pause of
    timeouts.idle, not its answer."""
    other, stalling = await sims(), await sims()
    # Long enough that the healthy engine's own pauses on a busy CPU never reach it.
    gw = await gateway(make_gateway, [model(timeouts={"idle": "1s"})],
                       {"m": [other, stalling]})
    stalling.break_streams(4, stall=True)
    evs = events(await stream(gw, "/v1/chat/completions", messages=PROMPT, max_tokens=10))
    assert content(evs) == "".join(f"t{i} " for i in range(10))
    assert finishes(evs) == ["length"]
    assert await metric(
        gw, 'llmgw_gateway_upstream_errors_total{model="m",reason="idle_timeout"}') == 1


@pytest.mark.parametrize(("engine", "path", "extra"), [
    ("vllm", "/v1/chat/completions", {"n": 2}),
    ("vllm", "/v1/chat/completions", {"logprobs": True}),
    ("vllm", "/v1/chat/completions", {"tools": [{"type": "function",
                                                 "function": {"name": "f"}}]}),
    ("vllm", "/v1/completions", {"echo": True}),
    ("llama.cpp", "/v1/chat/completions", {}),
])
async def test_streams_that_cannot_be_continued_exactly_end_with_the_error_event(
        make_gateway: GatewayFactory, sims: SimFactory, engine: str, path: str,
        extra: dict[str, Any]) -> None:
    """n > 1, logprobs, tools, echo, and chat on llama.cpp (whose server ignores
    continue_final_message) get today's error event and nobody else is asked."""
    other, breaking = await sims(), await sims()
    gw = await gateway(make_gateway, [model(engine=engine)], {"m": [other, breaking]})
    breaking.break_streams(3)
    body = {"messages": PROMPT} if path.endswith("chat/completions") else {"prompt": "Once"}
    text = await stream(gw, path, max_tokens=8, **body, **extra)
    assert '"code":"stream_interrupted"' in text
    assert other.requests == 0
    assert await metric(gw, 'llmgw_gateway_streams_unrecoverable_total{model="m",'
                            'reason="not_resumable"}') == 1


async def test_llama_cpp_completions_are_continued(make_gateway: GatewayFactory,
                                                   sims: SimFactory) -> None:
    """Completions are continued on llama.cpp too: appending to a prompt is what a
    completion means on every engine."""
    other, breaking = await sims(), await sims()
    gw = await gateway(make_gateway, [model(engine="llama.cpp")], {"m": [other, breaking]})
    breaking.break_streams(2)
    evs = events(await stream(gw, "/v1/completions", prompt="Once", max_tokens=6))
    assert content(evs) == "".join(f"t{i} " for i in range(6))


async def test_a_model_can_opt_out_of_resumption(make_gateway: GatewayFactory,
                                                 sims: SimFactory) -> None:
    """routing.resume_streams: 0 keeps the error event."""
    other, breaking = await sims(), await sims()
    gw = await gateway(make_gateway, [model(routing={"policy": "least-outstanding",
                                                     "resume_streams": 0})],
                       {"m": [other, breaking]})
    breaking.break_streams(3)
    text = await stream(gw, "/v1/chat/completions", messages=PROMPT, max_tokens=8)
    assert '"code":"stream_interrupted"' in text
    assert other.requests == 0
    assert await metric(gw, 'llmgw_gateway_streams_unrecoverable_total{model="m",'
                            'reason="not_resumable"}') == 1


async def test_resumes_are_bounded_per_request(make_gateway: GatewayFactory,
                                               sims: SimFactory) -> None:
    """With resume_streams 1, a continuation that breaks again ends with the error event,
    after the text both replicas delivered."""
    engines = [await sims() for _ in range(3)]
    gw = await gateway(make_gateway, [model(routing={"policy": "least-outstanding",
                                                     "resume_streams": 1})],
                       {"m": engines})
    for engine in engines:
        engine.break_streams(3)
    text = await stream(gw, "/v1/chat/completions", messages=PROMPT, max_tokens=20)
    assert content(events(text.split("\n\ndata: {\"error\"")[0])) == \
        "".join(f"t{i} " for i in range(6))
    assert '"code":"stream_interrupted"' in text
    assert sum(e.requests for e in engines) == 2
    assert await metric(gw, 'llmgw_gateway_streams_resumed_total{model="m"}') == 1
    assert await metric(gw, 'llmgw_gateway_streams_unrecoverable_total{model="m",'
                            'reason="limit"}') == 1


async def test_a_resumption_never_goes_to_a_fallback_model(make_gateway: GatewayFactory,
                                                            sims: SimFactory) -> None:
    """The only replica breaks: the fallback (another model) is not asked to continue."""
    only, spare = await sims(), await sims()
    gw = await gateway(make_gateway, [model(fallbacks=["spare"]), model("spare")],
                       {"m": [only], "spare": [spare]})
    only.break_streams(3)
    text = await stream(gw, "/v1/chat/completions", messages=PROMPT, max_tokens=8)
    assert '"code":"stream_interrupted"' in text
    assert spare.requests == 0
    assert await metric(gw, 'llmgw_gateway_streams_unrecoverable_total{model="m",'
                            'reason="no_replica"}') == 1


def test_only_requests_that_stay_exact_are_resumable() -> None:
    """resume_kind: chat on vLLM and SGLang, completions everywhere, nothing with extra
    choices."""
    chat = json.dumps({"model": "m", "messages": PROMPT, "stream": True}).encode()
    assert resume_kind("/v1/chat/completions", chat, "vllm") == "chat"
    assert resume_kind("/v1/chat/completions", chat, "sglang") == "chat"
    assert resume_kind("/v1/chat/completions", chat, "llama.cpp") is None
    assert resume_kind("/v1/chat/completions", chat, "openai") is None
    assert resume_kind("/v1/chat/completions", chat, None) is None
    prompt = json.dumps({"model": "m", "prompt": "x", "n": 1}).encode()
    assert resume_kind("/v1/completions", prompt, None) == "completions"
    many = json.dumps({"model": "m", "prompt": ["x", "y"]}).encode()
    assert resume_kind("/v1/completions", many, "vllm") is None
    schema = json.dumps({"model": "m", "messages": PROMPT,
                         "response_format": {"type": "json_object"}}).encode()
    assert resume_kind("/v1/chat/completions", schema, "vllm") is None
    assert resume_kind("/v1/embeddings", prompt, "vllm") is None


def test_the_splice_passes_only_whole_events_and_stops_at_a_tool_call() -> None:
    """Bytes of half an event are held back; a tool call makes the stream unresumable."""
    splice = Splice("chat", 2, "vllm")
    first = b'data: {"id":"a","choices":[{"index":0,"delta":{"content":"hi "}}]}\n\n'
    assert splice.feed(first[:20]) == b""
    assert splice.feed(first[20:]) == first
    assert splice.text == ["hi "]
    assert splice.resumable
    call = (b'data: {"id":"a","choices":[{"index":0,"delta":{"tool_calls":'
            b'[{"index":0}]}}]}\n\n')
    assert splice.feed(call) == call
    assert not splice.resumable


def test_the_splice_reads_events_separated_by_crlf() -> None:
    """A server framing events with CRLF (sse-starlette's default) is read event by event
    too, and its [DONE] ends the stream."""
    splice = Splice("completions", 2, "vllm")
    first = b'data: {"id":"c","choices":[{"index":0,"text":"t0 "}]}\r\n\r\n'
    done = b"data: [DONE]\r\n\r\n"
    assert splice.feed(first[:-1]) == b""
    assert splice.feed(first[-1:] + done) == first + done
    assert splice.text == ["t0 "]
    assert splice.done
