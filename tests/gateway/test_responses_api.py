"""/v1/responses through the official `openai` client: translated, passed through, stored."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest

from llmgw.errors import StoreUnavailableError
from llmgw.gateway.keys import add_key
from tests.gateway.conftest import GatewayFactory, GatewayHandle, chat_model
from tests.gateway.engine import FakeEngine

WEATHER = {"type": "function", "name": "weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}


@pytest.fixture
async def setup(make_gateway: GatewayFactory, engines, tmp_path: Path
                ) -> tuple[GatewayHandle, openai.AsyncOpenAI, FakeEngine, FakeEngine, str]:
    chat_engine = await engines("llama")
    native = await engines("vllm")
    keys = tmp_path / "keys.json"
    key = add_key(keys, "alice")
    other = add_key(keys, "bob")
    gw = await make_gateway([
        chat_model("chat", upstream=[chat_engine.url], served_name="org/chat"),
        chat_model("native", upstream=[native.url], served_name="org/native",
                   capabilities=["chat", "responses"]),
        chat_model("embedder", upstream=[native.url], capabilities=["embeddings"]),
    ], keys_file=keys)
    client = gw.openai(key)
    return gw, client, chat_engine, native, other


async def test_a_chat_model_answers_a_response_translated_from_chat(setup) -> None:  # type: ignore[no-untyped-def]
    """The engine gets a chat completion (served name, system + user), the client a Response."""
    _, client, engine, _, _ = setup
    response = await client.responses.create(model="chat", input="Hi there",
                                             instructions="Be brief.", max_output_tokens=20,
                                             temperature=0.3)
    assert response.output_text == "hello from llama"
    assert response.status == "completed"
    assert response.model == "chat"
    assert response.usage is not None
    assert response.usage.total_tokens == 8
    assert engine.paths == ["/v1/chat/completions"]
    sent = engine.requests[-1]
    assert sent["model"] == "org/chat"
    assert sent["messages"] == [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "Hi there"}]
    assert (sent["max_tokens"], sent["temperature"]) == (20, 0.3)


async def test_a_translated_stream_is_the_responses_event_sequence(setup) -> None:  # type: ignore[no-untyped-def]
    """Streaming yields response.created … output_text.delta … response.completed in order."""
    _, client, engine, _, _ = setup
    engine.chunks = 3
    stream = await client.responses.create(model="chat", input="count", stream=True)
    kinds, deltas = [], []
    final = None
    async for event in stream:
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        if event.type == "response.completed":
            final = event.response
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]
    assert deltas == ["tok0 ", "tok1 ", "tok2 "]
    assert final is not None
    assert final.output_text == "tok0 tok1 tok2 "
    assert engine.requests[-1]["stream_options"] == {"include_usage": True}


async def test_previous_response_id_continues_the_conversation(setup) -> None:  # type: ignore[no-untyped-def]
    """The second turn reaches the engine with the first turn's input and answer before it."""
    _, client, engine, _, _ = setup
    first = await client.responses.create(model="chat", input="My name is Ada.")
    second = await client.responses.create(model="chat", input="What is my name?",
                                           previous_response_id=first.id)
    assert second.previous_response_id == first.id
    assert engine.requests[-1]["messages"] == [
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": "hello from llama"},
        {"role": "user", "content": "What is my name?"}]


async def test_a_stored_response_is_retrieved_and_deleted_by_its_key_only(setup) -> None:  # type: ignore[no-untyped-def]
    """retrieve returns the same Response; another key gets 404; after delete, 404."""
    gw, client, _, _, other_key = setup
    created = await client.responses.create(model="chat", input="keep this")
    again = await client.responses.retrieve(created.id)
    assert again.model_dump() == created.model_dump()
    stranger = gw.openai(other_key)
    with pytest.raises(openai.NotFoundError):
        await stranger.responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        await stranger.responses.create(model="chat", input="x", previous_response_id=created.id)
    await client.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        await client.responses.retrieve(created.id)


async def test_store_false_keeps_nothing(setup) -> None:  # type: ignore[no-untyped-def]
    """A response created with store: false can be neither retrieved nor continued."""
    _, client, _, _, _ = setup
    response = await client.responses.create(model="chat", input="forget me", store=False)
    assert response.store is False
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError) as err:
        await client.responses.create(model="chat", input="x", previous_response_id=response.id)
    assert err.value.body["param"] == "previous_response_id"  # type: ignore[index]


async def test_function_tools_round_trip_through_chat_tool_calls(setup) -> None:  # type: ignore[no-untyped-def]
    """A tool call comes back as a function_call item; its output goes back as a tool message."""
    _, client, engine, _, _ = setup

    def reply(path: str, body: dict[str, Any]) -> dict[str, Any] | None:
        if body["messages"][-1]["role"] == "tool":
            return None
        return {"id": "c", "object": "chat.completion", "created": 1, "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                    "role": "assistant", "content": None, "tool_calls": [{
                        "id": "call_7", "type": "function", "function": {
                            "name": "weather", "arguments": '{"city":"Oslo"}'}}]}}]}

    engine.reply = reply
    first = await client.responses.create(model="chat", input="Weather in Oslo?",
                                          tools=[WEATHER], tool_choice="auto")
    [call] = first.output
    assert call.type == "function_call"
    assert (call.call_id, call.name, json.loads(call.arguments)) == \
        ("call_7", "weather", {"city": "Oslo"})
    sent = engine.requests[-1]
    assert sent["tools"] == [{"type": "function", "function": {
        k: v for k, v in WEATHER.items() if k != "type"}}]
    assert sent["tool_choice"] == "auto"
    await client.responses.create(
        model="chat", previous_response_id=first.id, tools=[WEATHER],
        input=[{"type": "function_call_output", "call_id": "call_7", "output": "12°C, rain"}])
    messages = engine.requests[-1]["messages"]
    assert messages[-2] == {"role": "assistant", "content": None, "tool_calls": [{
        "id": "call_7", "type": "function",
        "function": {"name": "weather", "arguments": '{"city":"Oslo"}'}}]}
    assert messages[-1] == {"role": "tool", "tool_call_id": "call_7", "content": "12°C, rain"}


async def test_a_responses_engine_is_passed_the_request_with_the_conversation_inlined(
        setup) -> None:  # type: ignore[no-untyped-def]
    """vLLM-style engines get /v1/responses with store false and earlier turns in the input;
    the gateway still stores, retrieves and continues the response."""
    _, client, _, native, _ = setup
    first = await client.responses.create(model="native", input="one", top_p=0.5,
                                          extra_body={"top_k": 3})
    assert first.output_text == "responded by vllm"
    assert native.paths == ["/v1/responses"]
    assert native.requests[-1] == {"model": "org/native", "input": "one", "top_p": 0.5,
                                   "top_k": 3, "store": False}
    assert first.store is True
    assert (await client.responses.retrieve(first.id)).id == first.id
    second = await client.responses.create(model="native", input="two",
                                           previous_response_id=first.id)
    sent = native.requests[-1]
    assert "previous_response_id" not in sent
    # The first turn's input item is sent with the id it was stored under.
    assert sent["input"][0].pop("id").startswith("msg_")
    assert sent["input"][0] == {"type": "message", "role": "user", "content": "one"}
    assert sent["input"][1]["content"][0]["text"] == "responded by vllm"
    assert sent["input"][2] == {"type": "message", "role": "user", "content": "two"}
    assert second.previous_response_id == first.id


async def test_a_passed_through_stream_is_kept_for_retrieval(setup) -> None:  # type: ignore[no-untyped-def]
    """Streaming from a Responses engine passes its events and stores the completed response."""
    _, client, _, _, _ = setup
    stream = await client.responses.create(model="native", input="stream it", stream=True)
    events = [event async for event in stream]
    assert events[0].type == "response.created"
    completed = events[-1]
    assert completed.type == "response.completed"
    stored = await client.responses.retrieve(completed.response.id)
    assert stored.output_text == "responded by vllm"
    assert stored.store is True


async def test_a_fallback_of_another_kind_gets_the_request_in_its_own_shape(
        make_gateway: GatewayFactory, engines) -> None:
    """A failing Responses engine falls back to a chat model, which is sent a chat completion."""
    native, chat = await engines("vllm"), await engines("llama")
    native.fail_status = 503
    gw = await make_gateway([
        chat_model("native", upstream=[native.url], capabilities=["responses"],
                   fallbacks=["chat"]),
        chat_model("chat", upstream=[chat.url])])
    client = gw.openai()
    response = await client.responses.create(model="native", input="hi")
    assert response.output_text == "hello from llama"
    assert native.paths == ["/v1/responses"]
    assert chat.paths == ["/v1/chat/completions"]


async def test_a_model_without_chat_or_responses_is_refused_naming_what_it_serves(
        setup) -> None:  # type: ignore[no-untyped-def]
    """An embeddings-only model answers 400 listing its capabilities; nothing is forwarded."""
    _, client, _, native, _ = setup
    with pytest.raises(openai.BadRequestError, match="serves embeddings") as err:
        await client.responses.create(model="embedder", input="hi")
    assert err.value.code == "unsupported_endpoint"
    assert native.requests == []


async def test_built_in_tools_are_refused_for_a_translated_model(setup) -> None:  # type: ignore[no-untyped-def]
    """web_search cannot be carried by chat completions: 400 naming tools[0], nothing sent."""
    _, client, engine, _, _ = setup
    with pytest.raises(openai.BadRequestError, match="web_search") as err:
        await client.responses.create(model="chat", input="news?",
                                      tools=[{"type": "web_search"}])
    assert err.value.body["param"] == "tools[0]"  # type: ignore[index]
    assert engine.requests == []


async def test_a_store_outage_is_a_503_for_reads_and_never_costs_an_answer(setup) -> None:  # type: ignore[no-untyped-def]
    """With the store down, retrieve is 503; a new response is still answered, just not kept."""
    gw, client, _, _, _ = setup

    async def down(*args: object, **kwargs: object) -> None:
        raise StoreUnavailableError("SQLite database x could not be read; check the disk")

    gw.store.get_response = down  # type: ignore[method-assign]
    gw.store.put_response = down  # type: ignore[method-assign]
    with pytest.raises(openai.InternalServerError) as err:
        await client.responses.retrieve("resp_x")
    assert err.value.status_code == 503
    answered = await client.responses.create(model="chat", input="still there?")
    assert answered.output_text == "hello from llama"
