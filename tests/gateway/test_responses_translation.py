"""Responses ⇄ chat completions translation, as pure functions (no server)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llmgw.gateway.errors import InvalidRequestError
from llmgw.gateway.responses import (
    ChatToResponses,
    EventReader,
    ResponsesObserver,
    chat_request,
    check_request,
    context_after,
    input_items,
    passthrough_request,
    response_from_chat,
    skeleton,
)

WEATHER = {"type": "function", "name": "weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
           "strict": True}


def translate(raw: dict[str, Any], engine: str | None = "vllm") -> dict[str, Any]:
    return chat_request(raw, input_items(raw), "org/served", engine)


def events(data: bytes) -> list[dict[str, Any]]:
    out = []
    for name, payload in EventReader().feed(data):
        event = json.loads(payload)
        assert name == event["type"]
        out.append(event)
    return out


def sse_chunks(*chunks: dict[str, Any], done: bool = True) -> bytes:
    body = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
    return body + (b"data: [DONE]\n\n" if done else b"")


def delta(content: str | None = None, **extra: Any) -> dict[str, Any]:
    d: dict[str, Any] = dict(extra)
    if content is not None:
        d["content"] = content
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": d,
                                                           "finish_reason": None}]}


def test_a_string_input_and_instructions_become_system_and_user_messages() -> None:
    """`instructions` is the system message and a bare string input the user's message."""
    body = translate({"model": "m", "instructions": "Be brief.", "input": "Hi there",
                      "max_output_tokens": 50, "temperature": 0.2, "top_p": 0.9})
    assert body["model"] == "org/served"
    assert body["messages"] == [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "Hi there"}]
    assert (body["max_tokens"], body["temperature"], body["top_p"]) == (50, 0.2, 0.9)
    assert not {"input", "instructions"} & set(body)


def test_fields_the_translation_does_not_know_reach_the_engine_unchanged() -> None:
    """Engine extras such as top_k and seed pass through; echo-only fields are not sent."""
    body = translate({"model": "m", "input": "x", "top_k": 40, "seed": 7,
                      "metadata": {"a": "b"}, "reasoning": {"effort": "low"}, "store": True})
    assert (body["top_k"], body["seed"]) == (40, 7)
    assert not {"metadata", "reasoning", "store"} & set(body)


def test_message_items_with_images_developer_role_and_output_text() -> None:
    """Developer becomes system, image parts become image_url parts, assistant text is a string."""
    body = translate({"model": "m", "input": [
        {"role": "developer", "content": "rules"},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "what is this?"},
            {"type": "input_image", "image_url": "https://img.example/cat.png",
             "detail": "low"}]},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "a cat", "annotations": []}]},
    ]})
    assert body["messages"] == [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": "https://img.example/cat.png",
                                                "detail": "low"}}]},
        {"role": "assistant", "content": "a cat"},
    ]


def test_function_calls_and_their_outputs_become_tool_calls_and_tool_messages() -> None:
    """Two function_call items share one assistant message; each output is a tool message."""
    body = translate({"model": "m", "tools": [WEATHER],
                      "tool_choice": {"type": "function", "name": "weather"}, "input": [
                          {"role": "user", "content": "Paris and Rome?"},
                          {"type": "function_call", "call_id": "c1", "name": "weather",
                           "arguments": '{"city":"Paris"}'},
                          {"type": "function_call", "call_id": "c2", "name": "weather",
                           "arguments": '{"city":"Rome"}'},
                          {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
                          {"type": "function_call_output", "call_id": "c2", "output": "rain"},
                      ]})
    assert body["messages"][1] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function",
         "function": {"name": "weather", "arguments": '{"city":"Paris"}'}},
        {"id": "c2", "type": "function",
         "function": {"name": "weather", "arguments": '{"city":"Rome"}'}}]}
    assert body["messages"][2:] == [{"role": "tool", "tool_call_id": "c1", "content": "sunny"},
                                    {"role": "tool", "tool_call_id": "c2", "content": "rain"}]
    assert body["tools"] == [{"type": "function", "function": {
        "name": "weather", "description": "Weather in a city",
        "parameters": WEATHER["parameters"], "strict": True}}]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "weather"}}


def test_json_schema_output_is_response_format_and_llama_cpp_gets_its_own_shape() -> None:
    """text.format json_schema becomes response_format; for llama.cpp, json_object + schema."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    raw = {"model": "m", "input": "count", "text": {"format": {
        "type": "json_schema", "name": "count", "schema": schema, "strict": True}}}
    assert translate(raw)["response_format"] == {
        "type": "json_schema", "json_schema": {"name": "count", "schema": schema,
                                               "strict": True}}
    assert translate(raw, "llama.cpp")["response_format"] == {"type": "json_object",
                                                              "schema": schema}


def test_streaming_and_logprobs_settings() -> None:
    """stream asks the engine for usage too; top_logprobs turns logprobs on."""
    body = translate({"model": "m", "input": "x", "stream": True, "top_logprobs": 3})
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert (body["logprobs"], body["top_logprobs"]) == (True, 3)


@pytest.mark.parametrize(("raw", "field"), [
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0]"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0]"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
     "input[0].content[0]"),
    ({"input": [{"role": "wizard", "content": "x"}]}, "input[0].role"),
    ({"input": 42}, "input"),
])
def test_what_chat_cannot_carry_is_refused_naming_the_field(raw: dict[str, Any],
                                                            field: str) -> None:
    """Built-in tools, item references, file inputs and bad shapes are 400s at their path."""
    with pytest.raises(InvalidRequestError) as err:
        translate({"model": "m", **raw})
    assert err.value.field == field


@pytest.mark.parametrize(("raw", "field"), [
    ({"background": True}, "background"), ({"store": "yes"}, "store"),
    ({"previous_response_id": 3}, "previous_response_id"), ({"prompt": {"id": "p"}}, "prompt"),
])
def test_requests_no_engine_can_serve_are_refused(raw: dict[str, Any], field: str) -> None:
    """Background mode, stored prompts and ill-typed store/previous ids are refused up front."""
    with pytest.raises(InvalidRequestError) as err:
        check_request({"model": "m", "input": "x", **raw})
    assert err.value.field == field


def test_passthrough_sends_the_whole_conversation_and_asks_the_engine_not_to_store() -> None:
    """For a Responses-speaking engine the previous turns are inlined and store is false."""
    items = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    body = passthrough_request({"model": "m", "input": "b", "previous_response_id": "resp_1",
                                "top_k": 5}, items, "org/served")
    assert body == {"model": "org/served", "input": items, "store": False, "top_k": 5}


def test_a_chat_completion_becomes_a_completed_response() -> None:
    """Text, tool calls and usage map onto output items and Responses usage."""
    base = skeleton({"model": "m", "input": "x", "tools": [WEATHER]}, id="resp_1",
                    created_at=10, model="m")
    chat = {"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "weather", "arguments": '{"city":"Oslo"}'}}]}}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18,
                  "prompt_tokens_details": {"cached_tokens": 4}}}
    response = response_from_chat(chat, base, now=20)
    assert (response["id"], response["status"], response["completed_at"]) == \
        ("resp_1", "completed", 20)
    message, call = response["output"]
    assert message["content"] == [{"type": "output_text", "text": "Checking.",
                                   "annotations": [], "logprobs": []}]
    assert {k: call[k] for k in ("type", "call_id", "name", "arguments")} == {
        "type": "function_call", "call_id": "c1", "name": "weather",
        "arguments": '{"city":"Oslo"}'}
    assert response["usage"] == {"input_tokens": 11,
                                 "input_tokens_details": {"cached_tokens": 4,
                                                          "cache_write_tokens": 0},
                                 "output_tokens": 7,
                                 "output_tokens_details": {"reasoning_tokens": 0},
                                 "total_tokens": 18}
    assert response["tools"] == [WEATHER]
    assert "user" not in response


def test_the_skeleton_answers_nulls_and_gaps_with_defaults() -> None:
    """A function tool is echoed with strict and parameters, a null tool_choice,
    parallel_tool_calls or store as their defaults, and no usage before there is any."""
    base = skeleton({"model": "m", "input": "x", "tool_choice": None, "store": None,
                     "parallel_tool_calls": None, "user": None,
                     "tools": [{"type": "function", "name": "now"}]},
                    id="resp_1", created_at=1, model="m")
    assert base["tools"] == [{"type": "function", "name": "now", "strict": None,
                              "parameters": None}]
    assert (base["tool_choice"], base["parallel_tool_calls"], base["store"]) == \
        ("auto", True, True)
    assert not {"user", "usage"} & set(base)


def test_a_completion_cut_by_max_tokens_is_incomplete() -> None:
    """finish_reason length → status incomplete with reason max_output_tokens."""
    base = skeleton({"model": "m", "input": "x"}, id="resp_1", created_at=1, model="m")
    chat = {"choices": [{"finish_reason": "length", "message": {"content": "abc"}}]}
    response = response_from_chat(chat, base)
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}


def test_a_chat_stream_becomes_the_responses_event_sequence() -> None:
    """created, in_progress, item added, part added, deltas, done events, completed — numbered."""
    base = skeleton({"model": "m", "input": "x"}, id="resp_1", created_at=1, model="m")
    stream = ChatToResponses(base)
    raw = stream.begin()
    data = sse_chunks(delta("Hel"), delta("lo"),
                      {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
                      {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2,
                                                "total_tokens": 5}})
    for i in range(0, len(data), 7):       # arbitrary cuts across events
        raw += stream.feed(data[i:i + 7])
    raw += stream.end()
    got = events(raw)
    assert [e["type"] for e in got] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed"]
    assert [e["sequence_number"] for e in got] == list(range(len(got)))
    assert [e["delta"] for e in got if e["type"] == "response.output_text.delta"] == \
        ["Hel", "lo"]
    completed = got[-1]["response"]
    assert completed["output"][0]["content"][0]["text"] == "Hello"
    assert completed["usage"]["output_tokens"] == 2
    assert stream.final == completed


def test_streamed_tool_calls_become_function_call_items_with_argument_deltas() -> None:
    """A tool call streamed in pieces is one function_call item with its argument deltas."""
    base = skeleton({"model": "m", "input": "x"}, id="resp_1", created_at=1, model="m")
    stream = ChatToResponses(base)
    first = {"index": 0, "id": "c1", "type": "function",
             "function": {"name": "weather", "arguments": ""}}
    raw = stream.begin() + stream.feed(sse_chunks(
        delta(tool_calls=[first]),
        delta(tool_calls=[{"index": 0, "function": {"arguments": '{"city":'}}]),
        delta(tool_calls=[{"index": 0, "function": {"arguments": '"Oslo"}'}}]),
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}))
    got = events(raw)
    assert [e["delta"] for e in got if e["type"] == "response.function_call_arguments.delta"] \
        == ['{"city":', '"Oslo"}']
    done = next(e for e in got if e["type"] == "response.function_call_arguments.done")
    assert done["arguments"] == '{"city":"Oslo"}'
    [item] = got[-1]["response"]["output"]
    assert (item["type"], item["call_id"], item["name"], item["status"]) == \
        ("function_call", "c1", "weather", "completed")


def test_an_error_event_in_the_chat_stream_fails_the_response() -> None:
    """The gateway's broken-stream event becomes an error event and response.failed."""
    base = skeleton({"model": "m", "input": "x"}, id="resp_1", created_at=1, model="m")
    stream = ChatToResponses(base)
    raw = stream.begin() + stream.feed(sse_chunks(
        delta("par"), {"error": {"message": "the replica's stream broke", "code":
                                 "stream_interrupted"}}, done=False))
    got = events(raw)
    assert [e["type"] for e in got][-2:] == ["error", "response.failed"]
    assert got[-2]["code"] == "stream_interrupted"
    assert got[-1]["response"]["status"] == "failed"
    assert stream.end() == b""


def test_the_observer_restores_store_and_previous_id_and_keeps_the_completed_response() -> None:
    """Passed-through events get the client's store/previous_response_id back; final is kept."""
    observer = ResponsesObserver(store=True, previous="resp_0")
    completed = {"type": "response.completed", "sequence_number": 3,
                 "response": {"id": "resp_9", "store": False, "previous_response_id": None,
                              "output": [{"type": "message"}]}}
    out = observer.feed(b"event: response.output_text.delta\ndata: {\"type\":"
                        b"\"response.output_text.delta\",\"delta\":\"x\"}\n\n"
                        b"event: response.completed\ndata: " + json.dumps(completed).encode()
                        + b"\n\n")
    got = events(out)
    assert got[0]["delta"] == "x"
    assert got[1]["response"]["store"] is True
    assert got[1]["response"]["previous_response_id"] == "resp_0"
    assert observer.final is not None
    assert observer.final["id"] == "resp_9"


def test_the_next_turn_continues_from_input_and_output() -> None:
    """context_after is the input items, each given an id if it had none, followed by the
    response's output items."""
    items = [{"role": "user", "content": "hi"},
             {"type": "function_call_output", "call_id": "c1", "output": "4", "id": "fco_1"}]
    response = {"output": [{"type": "message", "role": "assistant", "content": []}]}
    first, second, *rest = context_after(items, response)
    assert first.pop("id").startswith("msg_")
    assert first == items[0]
    assert "id" not in items[0]              # the request's own items are not changed
    assert second == items[1]
    assert rest == response["output"]


def test_crlf_events_split_across_pieces_are_read_whole() -> None:
    """Events framed with CRLF (sse-starlette's default) and cut anywhere are still events."""
    reader = EventReader()
    data = b"event: a\r\ndata: 1\r\n\r\ndata: 2\r\n\r\n"
    got = [ev for i in range(len(data)) for ev in reader.feed(data[i:i + 1])]
    assert got == [("a", b"1"), (None, b"2")]
