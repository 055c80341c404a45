"""Every chat field the gateway does not route on reaches the engine exactly as the client sent it.

Each test sends one feature through the official `openai` client and checks
that the fake engine received the request body the client wrote — `model`
alone mapped to the served name — and that the engine's answer came back
unchanged.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from tests.gateway.conftest import GatewayFactory, GatewayHandle, chat_model
from tests.gateway.engine import FakeEngine

SERVED = "org/served-name"
MESSAGES = [{"role": "user", "content": "hello"}]


@pytest.fixture
async def setup(make_gateway: GatewayFactory, engines
                ) -> tuple[GatewayHandle, openai.AsyncOpenAI, FakeEngine]:
    engine = await engines("e")
    gw = await make_gateway([chat_model("m", upstream=[engine.url], served_name=SERVED)])
    client = gw.openai()
    return gw, client, engine


def received(engine: FakeEngine, sent: dict[str, Any]) -> None:
    assert engine.requests[-1] == {**sent, "model": SERVED}


async def test_tool_definitions_and_the_models_tool_calls(setup) -> None:  # type: ignore[no-untyped-def]
    """tools and tool_choice arrive intact; the engine's tool_calls reach the client."""
    _, client, engine = setup
    tool_call = {"id": "call_1", "type": "function",
                 "function": {"name": "lookup", "arguments": '{"q": "llmgw"}'}}
    engine.reply = lambda path, body: {
        "id": "c", "object": "chat.completion", "created": 1, "model": body["model"],
        "choices": [{"index": 0, "finish_reason": "tool_calls",
                     "message": {"role": "assistant", "content": None,
                                 "tool_calls": [tool_call]}}]}
    sent = {"model": "m", "messages": MESSAGES, "parallel_tool_calls": False,
            "tools": [{"type": "function", "function": {
                "name": "lookup", "description": "Search the docs", "strict": True,
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}},
                               "required": ["q"], "additionalProperties": False}}}],
            "tool_choice": {"type": "function", "function": {"name": "lookup"}}}
    reply = await client.chat.completions.create(**sent)
    received(engine, sent)
    [call] = reply.choices[0].message.tool_calls or []
    assert call.model_dump() == tool_call


async def test_tool_results_in_the_conversation(setup) -> None:  # type: ignore[no-untyped-def]
    """Assistant tool_calls and tool messages in the history arrive unchanged."""
    _, client, engine = setup
    sent = {"model": "m", "messages": [
        {"role": "user", "content": "find it"},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "lookup", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "found"}]}
    await client.chat.completions.create(**sent)
    received(engine, sent)


async def test_response_format_json_schema(setup) -> None:  # type: ignore[no-untyped-def]
    """A strict JSON schema response_format arrives key for key."""
    _, client, engine = setup
    sent = {"model": "m", "messages": MESSAGES, "response_format": {
        "type": "json_schema", "json_schema": {
            "name": "person", "strict": True, "schema": {
                "type": "object", "additionalProperties": False, "required": ["name", "age"],
                "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}}}}}
    await client.chat.completions.create(**sent)
    received(engine, sent)


async def test_a_llama_cpp_model_gets_the_schema_in_the_shape_its_server_takes(
        make_gateway: GatewayFactory, engines) -> None:
    """For llama.cpp only, json_schema is sent as json_object + schema; the rest byte for byte."""
    engine = await engines("llama")
    gw = await make_gateway([chat_model("local")])        # a scheduled llama.cpp model
    gw.backend.set_endpoints("local", [engine.url])
    client = gw.openai()
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    await client.chat.completions.create(
        model="local", messages=MESSAGES, seed=3, response_format={
            "type": "json_schema", "json_schema": {"name": "n", "schema": schema}})
    assert engine.requests[-1] == {"model": "local", "messages": MESSAGES, "seed": 3,
                                   "response_format": {"type": "json_object", "schema": schema}}


async def test_n_choices_come_back_as_the_engine_sent_them(setup) -> None:  # type: ignore[no-untyped-def]
    """n > 1 reaches the engine and every choice reaches the client, in order."""
    _, client, engine = setup
    sent = {"model": "m", "messages": MESSAGES, "n": 3, "temperature": 1.2}
    reply = await client.chat.completions.create(**sent)
    received(engine, sent)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    completion = await client.completions.create(model="m", prompt="x", n=2, best_of=2)
    assert [c.index for c in completion.choices] == [0, 1]
    received(engine, {"model": "m", "prompt": "x", "n": 2, "best_of": 2})


async def test_logprobs_are_asked_for_and_returned(setup) -> None:  # type: ignore[no-untyped-def]
    """logprobs and top_logprobs arrive; the engine's per-token logprobs reach the client."""
    _, client, engine = setup
    sent = {"model": "m", "messages": MESSAGES, "logprobs": True, "top_logprobs": 2}
    reply = await client.chat.completions.create(**sent)
    received(engine, sent)
    logprobs = reply.choices[0].logprobs
    assert logprobs is not None
    assert [t.token for t in logprobs.content or []] == ["hello", "from", "e"]
    assert len((logprobs.content or [])[0].top_logprobs) == 2


async def test_seed_and_sampling_settings(setup) -> None:  # type: ignore[no-untyped-def]
    """seed, stop, penalties, logit_bias and an engine extra arrive as written."""
    _, client, engine = setup
    sent = {"model": "m", "messages": MESSAGES, "seed": 1234, "stop": ["\n\n", "END"],
            "presence_penalty": 0.5, "frequency_penalty": -0.25, "max_tokens": 17,
            "logit_bias": {"50256": -100}, "user": "u-42"}
    reply = await client.chat.completions.create(**sent, extra_body={"top_k": 20})
    received(engine, {**sent, "top_k": 20})
    assert reply.system_fingerprint == "seed-1234"


async def test_image_url_content_parts(setup) -> None:  # type: ignore[no-untyped-def]
    """Multimodal parts — an image by URL and by data URL, with detail — arrive unchanged."""
    _, client, engine = setup
    sent = {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is in these images?"},
        {"type": "image_url", "image_url": {"url": "https://img.example/cat.png",
                                            "detail": "high"}},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]}
    await client.chat.completions.create(**sent)
    received(engine, sent)


async def test_a_streamed_tool_call_passes_chunk_by_chunk(setup) -> None:  # type: ignore[no-untyped-def]
    """Tool-call deltas in a stream reach the client as the engine wrote them."""
    _, client, engine = setup
    pieces = ['{"q":', ' "llm', 'gw"}']
    engine.chat_chunks = [
        {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": SERVED,
         "choices": [{"index": 0, "finish_reason": None, "delta": {"tool_calls": [{
             "index": 0, **({"id": "call_1", "type": "function"} if i == 0 else {}),
             "function": {**({"name": "lookup"} if i == 0 else {}), "arguments": piece}}]}}]}
        for i, piece in enumerate(pieces)]
    stream = await client.chat.completions.create(
        model="m", messages=MESSAGES, stream=True,
        tools=[{"type": "function", "function": {"name": "lookup", "parameters": {}}}])
    arguments = [chunk.choices[0].delta.tool_calls[0].function.arguments  # type: ignore[index,union-attr]
                 async for chunk in stream]
    assert arguments == pieces
    assert json.loads("".join(arguments)) == {"q": "llmgw"}
