"""What llmgw answers on OpenAI's operations is what OpenAI's published schemas say.

The schemas are the structural extract of openai/openai-openapi pinned in
``openai_schemas.json`` (made by ``llmgw.testing.openai_schemas``; its header
names the commit). Every operation llmgw serves is exercised against
simulated engines (``tests.gateway.engine``, answering as vLLM does), and
each object it answers — and each event of its streams — is validated with
``jsonschema`` against the schema the document gives that operation and
status; every error answer against ``ErrorResponse``. The engines' own
objects pass through llmgw, so this checks that llmgw keeps them intact and
that what llmgw makes itself (Responses translated from chat, files,
batches, models, errors, stored responses and their input items) is right.

Where the document says nothing, nothing is validated, and the test says
so: the legacy completions stream has no event schema (its chunks are the
completion object with ``finish_reason`` null before the last, which the
document's enum forbids), a file's content and synthesised speech are bytes,
and deleting a response has no body schema. An empty list answers
``first_id``/``last_id`` null, which the list schemas (strings, required)
cannot describe; the empty lists are checked for exactly that.

A second test sends, for each JSON operation, a valid request with each
top-level field the document lets be ``null`` set to ``null``, and expects
it accepted and answered schema-valid: llmgw must not refuse what OpenAI
accepts, nor echo a ``null`` the answer's schema forbids.
"""

from __future__ import annotations

import functools
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

from llmgw.gateway.keys import add_key
from tests.gateway.conftest import GatewayFactory, GatewayHandle, chat_model
from tests.gateway.engine import FakeEngine
from tests.gateway.test_files_batches import finished, line

EXTRACT = json.loads((Path(__file__).with_name("openai_schemas.json")).read_text())
DEFS: dict[str, Any] = EXTRACT["$defs"]
OPERATIONS: dict[str, Any] = EXTRACT["operations"]

# Each operation llmgw serves, and the test below that validates its answers. A new
# operation in the extract fails test_every_served_operation_is_checked until it is here.
COVERED = {
    "POST /chat/completions": "test_inference_answers_and_streams",
    "POST /completions": "test_inference_answers_and_streams",
    "POST /embeddings": "test_inference_answers_and_streams",
    "POST /responses": "test_responses_objects_and_events",
    "GET /responses/{response_id}": "test_responses_objects_and_events",
    "DELETE /responses/{response_id}": "test_responses_objects_and_events (no body schema)",
    "GET /responses/{response_id}/input_items": "test_responses_objects_and_events",
    "POST /audio/transcriptions": "test_audio_answers",
    "POST /audio/translations": "test_audio_answers",
    "POST /audio/speech": "test_audio_answers (bytes: no schema)",
    "GET /files": "test_files_and_batches",
    "POST /files": "test_files_and_batches",
    "GET /files/{file_id}": "test_files_and_batches",
    "DELETE /files/{file_id}": "test_files_and_batches",
    "GET /files/{file_id}/content": "test_files_and_batches (bytes: no schema)",
    "POST /batches": "test_files_and_batches",
    "GET /batches": "test_files_and_batches",
    "GET /batches/{batch_id}": "test_files_and_batches",
    "POST /batches/{batch_id}/cancel": "test_files_and_batches",
    "GET /models": "test_models",
    "GET /models/{model}": "test_models",
}


@functools.cache
def _validator(schema_json: str) -> jsonschema.Draft202012Validator:
    schema = {"$defs": DEFS, **json.loads(schema_json)}
    return jsonschema.Draft202012Validator(schema)


def check(value: Any, schema: dict[str, Any], what: str) -> None:
    """Fail naming each place where ``value`` does not match ``schema`` (in the extract)."""
    errors = sorted(_validator(json.dumps(schema, sort_keys=True)).iter_errors(value),
                    key=lambda e: list(e.absolute_path))
    shown = []
    for error in errors[:5]:
        best = _cause(error)
        shown.append(f"  at {'/'.join(map(str, best.absolute_path)) or '(top)'}: "
                     f"{best.message[:300]}")
    assert not errors, f"{what} does not match OpenAI's schema:\n" + "\n".join(shown)


def _cause(error: jsonschema.ValidationError) -> jsonschema.ValidationError:
    """The error inside a oneOf/anyOf failure that says what is wrong: within the branch
    whose ``type`` matched (the document's discriminator), else the most relevant one."""
    while error.context:
        branches: dict[Any, list[jsonschema.ValidationError]] = {}
        for sub in error.context:
            branches.setdefault(sub.schema_path[0], []).append(sub)
        matched = [errs for errs in branches.values()
                   if not any(list(e.relative_path) == ["type"] for e in errs)]
        if len(matched) != 1:
            return jsonschema.exceptions.best_match(error.context)
        # Within the branch, a nested oneOf/anyOf failure first: it goes deeper.
        error = next((e for e in matched[0] if e.context), matched[0][0])
    return error


def answer(operation: str, content: str = "application/json", status: str = "200"
           ) -> dict[str, Any]:
    schema: dict[str, Any] = OPERATIONS[operation]["responses"][status]["content"][content]
    return schema


def ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/$defs/{name}"}


def _event_schemas() -> dict[str, str]:
    """The schema of each Responses stream event, by its ``type``."""
    out = {}
    for option in DEFS["ResponseStreamEvent"]["anyOf"]:
        name = option["$ref"].rsplit("/", 1)[-1]
        for kind in DEFS[name]["properties"]["type"]["enum"]:
            out[kind] = name
    return out


EVENTS = _event_schemas()


def sse_data(text: str) -> Iterator[str]:
    """The ``data:`` payloads of an event stream, in order."""
    for block in text.replace("\r\n", "\n").split("\n\n"):
        data = [line[5:].removeprefix(" ") for line in block.split("\n")
                if line.startswith("data:")]
        if data:
            yield "\n".join(data)


def check_chat_stream(text: str, what: str) -> int:
    chunks = 0
    for data in sse_data(text):
        if data == "[DONE]":
            continue
        check(json.loads(data), answer("POST /chat/completions", "text/event-stream"),
              f"{what} chunk {chunks}")
        chunks += 1
    return chunks


def check_responses_stream(text: str, what: str) -> list[str]:
    kinds = []
    for data in sse_data(text):
        event = json.loads(data)
        kind = event.get("type")
        assert kind in EVENTS, f"{what}: event type {kind!r} is not one of OpenAI's"
        check(event, ref(EVENTS[kind]), f"{what} event {len(kinds)} ({kind})")
        kinds.append(kind)
    return kinds


def check_error(r: httpx.Response, what: str) -> dict[str, Any]:
    assert r.status_code >= 400, what
    body: dict[str, Any] = r.json()
    check(body, ref("ErrorResponse"), f"{what} ({r.status_code})")
    return body


@pytest.fixture
async def setup(make_gateway: GatewayFactory, engines, tmp_path: Path
                ) -> tuple[GatewayHandle, dict[str, str], FakeEngine, FakeEngine, str]:
    chat = await engines("llama")
    native = await engines("vllm")
    held = await engines("held")
    held.hang = True
    keys = tmp_path / "keys.json"
    key = add_key(keys, "alice", ["chat", "native", "embed", "whisper", "voice", "down",
                                  "slow", "broken", "held"])
    limited = add_key(keys, "limited", rpm=1)
    gw = await make_gateway([
        chat_model("chat", upstream=[chat.url], served_name="org/chat"),
        chat_model("native", upstream=[native.url], capabilities=["chat", "responses"]),
        chat_model("embed", upstream=[native.url], capabilities=["embeddings"]),
        chat_model("whisper", upstream=[native.url], capabilities=["audio"]),
        chat_model("voice", upstream=[native.url], capabilities=["speech"]),
        chat_model("other", upstream=[chat.url]),
        chat_model("down"),    # scheduled, no replica: 503
        chat_model("slow", upstream=[native.url], timeouts={"first_byte": "200ms"}),
        chat_model("broken", upstream=["http://127.0.0.1:1"]),
        chat_model("held", upstream=[held.url]),     # never answers: a batch that stays
    ], keys_file=keys, max_body_size="64KiB")
    return gw, {"Authorization": f"Bearer {key}"}, chat, native, limited


def test_every_served_operation_is_checked() -> None:
    """The table of covered operations is the extract's list of served operations."""
    assert set(COVERED) == set(OPERATIONS)


async def test_inference_answers_and_streams(setup) -> None:  # type: ignore[no-untyped-def]
    """Chat completions (JSON, streamed, with logprobs, with usage), completions and
    embeddings match their schemas."""
    gw, auth, chat, _, _ = setup
    post = gw.client.post
    messages = [{"role": "user", "content": "hi"}]
    r = await post("/v1/chat/completions", headers=auth,
                   json={"model": "chat", "messages": messages, "logprobs": True,
                         "top_logprobs": 2})
    check(r.json(), answer("POST /chat/completions"), "a chat completion")
    chat.chunks = 3
    for options in (None, {"include_usage": True}):
        r = await post("/v1/chat/completions", headers=auth,
                       json={"model": "chat", "messages": messages, "stream": True,
                             "stream_options": options})
        assert check_chat_stream(r.text, f"a chat stream ({options})") >= 3
    chat.chat_chunks = [
        {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
         "choices": [{"index": 0, "delta": {"role": "assistant", "tool_calls": [
             {"index": 0, "id": "call_1", "type": "function",
              "function": {"name": "weather", "arguments": ""}}]}, "finish_reason": None}]},
        {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
         "choices": [{"index": 0, "delta": {"tool_calls": [
             {"index": 0, "function": {"arguments": '{"city": "Oslo"}'}}]},
             "finish_reason": "tool_calls"}]}]
    r = await post("/v1/chat/completions", headers=auth,
                   json={"model": "chat", "messages": messages, "stream": True})
    assert check_chat_stream(r.text, "a chat stream of tool calls") == 2
    chat.chat_chunks = None
    r = await post("/v1/completions", headers=auth, json={"model": "chat", "prompt": "once"})
    check(r.json(), answer("POST /completions"), "a completion")
    r = await post("/v1/embeddings", headers=auth,
                   json={"model": "embed", "input": ["a", "b"], "encoding_format": "float"})
    check(r.json(), answer("POST /embeddings"), "embeddings")


async def test_responses_objects_and_events(setup) -> None:  # type: ignore[no-untyped-def]
    """Responses translated from chat and passed through, their streams (text, tool calls,
    logprobs, cut short, failed), a stored one and its input items match their schemas."""
    gw, auth, chat, _, _ = setup
    post = gw.client.post
    tool = {"type": "function", "name": "weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
    created = answer("POST /responses")
    first = (await post("/v1/responses", headers=auth,
                        json={"model": "chat", "input": "hi", "instructions": "Be brief.",
                              "tools": [tool], "metadata": {"k": "v"}})).json()
    check(first, created, "a translated response")
    r = await post("/v1/responses", headers=auth,
                   json={"model": "chat", "input": "again", "previous_response_id": first["id"],
                         "top_logprobs": 2, "include": ["message.output_text.logprobs"]})
    second = r.json()
    check(second, created, "a translated response with logprobs")
    for model in ("chat", "native"):
        r = await post("/v1/responses", headers=auth,
                       json={"model": model, "input": "stream", "stream": True})
        kinds = check_responses_stream(r.text, f"a {model} Responses stream")
        assert (kinds[0], kinds[-1]) == ("response.created", "response.completed")
    native = (await post("/v1/responses", headers=auth,
                         json={"model": "native", "input": "hi"})).json()
    check(native, created, "a passed-through response")
    chat.chat_chunks = [
        {"choices": [{"index": 0, "delta": {"content": "Let me look. "},
                      "logprobs": {"content": [{"token": "Let", "logprob": -0.1,
                                                "bytes": [76, 101, 116],
                                                "top_logprobs": []}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "id": "call_1", "function": {"name": "weather", "arguments": ""}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": '{"city":"Oslo"}'}}]},
            "finish_reason": "length"}]},
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 5,
                                  "total_tokens": 8}}]
    r = await post("/v1/responses", headers=auth,
                   json={"model": "chat", "input": "tools", "stream": True, "tools": [tool]})
    kinds = check_responses_stream(r.text, "a stream of text, a tool call, cut short")
    assert "response.function_call_arguments.done" in kinds
    assert kinds[-1] == "response.incomplete"
    chat.chat_chunks = [{"choices": [{"index": 0, "delta": {"content": "par"}}]},
                        {"error": {"message": "the engine fell over", "type": "InternalError",
                                   "code": 500}}]
    r = await post("/v1/responses", headers=auth,
                   json={"model": "chat", "input": "fail", "stream": True})
    kinds = check_responses_stream(r.text, "a failed stream")
    assert kinds[-2:] == ["error", "response.failed"]
    chat.chat_chunks = None
    stored = await gw.client.get(f"/v1/responses/{second['id']}", headers=auth)
    check(stored.json(), answer("GET /responses/{response_id}"), "a stored response")
    items = await gw.client.get(f"/v1/responses/{second['id']}/input_items", headers=auth)
    listing = items.json()
    assert len(listing["data"]) == 3
    check(listing, answer("GET /responses/{response_id}/input_items"), "input items")
    typed = await post("/v1/responses", headers=auth, json={"model": "chat", "input": [
        {"type": "message", "role": "developer", "content": "Be kind."},
        {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
        {"type": "function_call", "call_id": "call_9", "name": "weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_9", "output": "sunny"}]})
    items = await gw.client.get(f"/v1/responses/{typed.json()['id']}/input_items",
                                params={"order": "asc"}, headers=auth)
    check(items.json(), answer("GET /responses/{response_id}/input_items"),
          "input items of every kind")
    deleted = await gw.client.delete(f"/v1/responses/{first['id']}", headers=auth)
    assert deleted.status_code == 200


async def test_audio_answers(setup) -> None:  # type: ignore[no-untyped-def]
    """Transcriptions and translations match their schemas; speech is audio bytes."""
    gw, auth, _, _, _ = setup
    for path in ("/v1/audio/transcriptions", "/v1/audio/translations"):
        r = await gw.client.post(path, headers=auth, data={"model": "whisper"},
                                 files={"file": ("a.wav", b"RIFF....WAVE", "audio/wav")})
        check(r.json(), answer(f"POST {path[3:]}"), path)
    r = await gw.client.post("/v1/audio/speech", headers=auth,
                             json={"model": "voice", "input": "hello", "voice": "alloy"})
    assert r.status_code == 200
    assert r.content.startswith(b"ID3")


async def test_files_and_batches(setup) -> None:  # type: ignore[no-untyped-def]
    """Files (uploaded, listed, retrieved, deleted, expiring) and batches (created, listed,
    running, completed, failed, cancelled) match their schemas; empty lists have null ids."""
    gw, auth, _, _, _ = setup
    get = gw.client.get
    client = gw.openai(auth["Authorization"].removeprefix("Bearer "))
    for path in ("/v1/files", "/v1/batches"):
        empty = (await get(path, headers=auth)).json()
        assert (empty["data"], empty["first_id"], empty["last_id"], empty["has_more"]) == \
            ([], None, None, False)
    r = await gw.client.post("/v1/files", headers=auth, data={
        "purpose": "batch", "expires_after[anchor]": "created_at",
        "expires_after[seconds]": "3600"}, files={"file": ("in.jsonl", line(0) + line(1))})
    upload = r.json()
    check(upload, answer("POST /files"), "an uploaded file")
    assert upload["expires_at"] == upload["created_at"] + 3600
    check((await get(f"/v1/files/{upload['id']}", headers=auth)).json(),
          answer("GET /files/{file_id}"), "a file")
    batch = (await gw.client.post("/v1/batches", headers=auth, json={
        "input_file_id": upload["id"], "endpoint": "/v1/chat/completions",
        "completion_window": "24h", "metadata": {"run": "1"},
        "output_expires_after": {"anchor": "created_at", "seconds": 3600}})).json()
    check(batch, answer("POST /batches"), "a new batch")
    done = await finished(client, batch["id"])
    shown = (await get(f"/v1/batches/{done.id}", headers=auth)).json()
    check(shown, answer("GET /batches/{batch_id}"), "a completed batch")
    listed = (await get("/v1/files", headers=auth)).json()
    assert len(listed["data"]) == 2
    check(listed, answer("GET /files"), "the list of files")
    wrong = (await client.files.create(
        file=("bad.jsonl", io.BytesIO(line(0, url="/v1/embeddings"))), purpose="batch")).id
    failed = await client.batches.create(input_file_id=wrong, endpoint="/v1/chat/completions",
                                         completion_window="24h")
    failed_shown = (await get(f"/v1/batches/{(await finished(client, failed.id)).id}",
                              headers=auth)).json()
    assert failed_shown["status"] == "failed"
    check(failed_shown, answer("GET /batches/{batch_id}"), "a failed batch")
    held = (await client.files.create(file=("held.jsonl", io.BytesIO(line(0, model="held"))),
                                      purpose="batch")).id
    pending = await client.batches.create(input_file_id=held, endpoint="/v1/chat/completions",
                                          completion_window="24h")
    cancelled = await gw.client.post(f"/v1/batches/{pending.id}/cancel", headers=auth)
    check(cancelled.json(), answer("POST /batches/{batch_id}/cancel"), "a cancelled batch")
    check((await get("/v1/batches", headers=auth)).json(), answer("GET /batches"),
          "the list of batches")
    removed = await gw.client.delete(f"/v1/files/{wrong}", headers=auth)
    check(removed.json(), answer("DELETE /files/{file_id}"), "a deleted file")
    content = await get(f"/v1/files/{upload['id']}/content", headers=auth)
    assert content.content == line(0) + line(1)


async def test_models(setup) -> None:  # type: ignore[no-untyped-def]
    """The model list and one model match their schemas."""
    gw, auth, _, _, _ = setup
    check((await gw.client.get("/v1/models", headers=auth)).json(), answer("GET /models"),
          "the model list")
    check((await gw.client.get("/v1/models/chat", headers=auth)).json(),
          answer("GET /models/{model}"), "a model")


async def test_every_error_is_openais_error_object(setup) -> None:  # type: ignore[no-untyped-def]
    """400, 401, 403, 404, 405, 413, 429 (with Retry-After), 502, 503, 504, an engine's own
    4xx and the error event ending a broken stream are all ErrorResponse objects."""
    gw, auth, chat, native, limited = setup
    c = gw.client
    body = {"model": "chat", "messages": []}
    cases: list[tuple[str, httpx.Response]] = [
        ("malformed JSON", await c.post("/v1/chat/completions", headers=auth, content=b"{")),
        ("no key", await c.post("/v1/chat/completions", json=body)),
        ("a model the key may not use",
         await c.post("/v1/chat/completions", headers=auth, json={**body, "model": "other"})),
        ("an unknown model",
         await c.post("/v1/chat/completions", headers=auth, json={**body, "model": "x"})),
        ("an unknown path", await c.get("/v1/nowhere", headers=auth)),
        ("an unknown file", await c.get("/v1/files/file-0", headers=auth)),
        ("an unknown response", await c.get("/v1/responses/resp_0/input_items", headers=auth)),
        ("a wrong method", await c.put("/v1/files", headers=auth)),
        ("a body too large", await c.post("/v1/chat/completions", headers=auth,
                                          json={**body, "pad": "x" * 70000})),
        ("a bad list limit", await c.get("/v1/files", params={"limit": 0}, headers=auth)),
        ("a bad batch", await c.post("/v1/batches", headers=auth, json={"endpoint": 1})),
        ("a refused Responses field", await c.post("/v1/responses", headers=auth, json={
            "model": "chat", "input": "x", "tools": [{"type": "web_search"}]})),
        ("no replica", await c.post("/v1/chat/completions", headers=auth,
                                    json={**body, "model": "down"})),
        ("no engine answering", await c.post("/v1/chat/completions", headers=auth,
                                             json={**body, "model": "broken"})),
    ]
    limited_auth = {"Authorization": f"Bearer {limited}"}
    await c.get("/v1/models", headers=limited_auth)
    await c.post("/v1/chat/completions", headers=limited_auth, json=body)
    over = await c.post("/v1/chat/completions", headers=limited_auth, json=body)
    cases.append(("over the rate limit", over))
    native.hang = True
    cases.append(("an engine too slow", await c.post("/v1/chat/completions", headers=auth,
                                                     json={**body, "model": "slow"})))
    native.hang = False
    chat.fail_status, chat.fail_body = 400, (json.dumps(
        {"object": "error", "message": "bad", "type": "BadRequestError", "param": None,
         "code": 400}).encode(), "application/json")
    cases.append(("an engine's 400", await c.post("/v1/chat/completions", headers=auth,
                                                  json=body)))
    chat.fail_status = chat.fail_body = None
    statuses = set()
    for what, r in cases:
        check_error(r, what)
        statuses.add(r.status_code)
    assert statuses >= {400, 401, 403, 404, 405, 413, 429, 502, 503, 504}
    assert int(over.headers["retry-after"]) >= 1
    check(int(over.headers["retry-after"]),
          OPERATIONS["POST /chat/completions"]["responses"]["429"]["headers"]["Retry-After"]
          ["schema"], "Retry-After")
    chat.chunks, chat.die_after_chunks = 4, 1
    broken = await c.post("/v1/chat/completions", headers=auth, json={**body, "stream": True})
    last = list(sse_data(broken.text))[-1]
    check(json.loads(last), ref("ErrorResponse"), "the event ending a broken stream")


def _nullable_fields(schema: dict[str, Any]) -> list[str]:
    """Top-level properties of a request schema (allOf merged) that admit null."""
    properties = _properties_of(schema)
    return sorted(name for name, prop in properties.items() if _admits_null(prop))


def _properties_of(schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = DEFS[schema["$ref"].rsplit("/", 1)[-1]]
    out = dict(schema.get("properties", {}))
    for inner in schema.get("allOf", []):
        out.update(_properties_of(inner))
    return out


def _admits_null(schema: dict[str, Any]) -> bool:
    while "$ref" in schema:
        schema = DEFS[schema["$ref"].rsplit("/", 1)[-1]]
    kind = schema.get("type")
    if kind == "null" or (isinstance(kind, list) and "null" in kind):
        return True
    return any(_admits_null(s) for s in schema.get("anyOf", []) + schema.get("oneOf", []))


# A valid request of each JSON operation, and what the answer is validated against.
NULLABLE_CASES = {
    "POST /chat/completions": ("/v1/chat/completions", "chat",
                               {"messages": [{"role": "user", "content": "hi"}]}),
    "POST /completions": ("/v1/completions", "chat", {"prompt": "once"}),
    "POST /embeddings": ("/v1/embeddings", "embed", {"input": "a"}),
    "POST /responses": ("/v1/responses", "chat", {"input": "hi"}),
}


def _nullable_params() -> list[tuple[str, str, str]]:
    """(operation, model, field) for each nullable field; Responses both translated from
    chat and passed to an engine that speaks them."""
    out = []
    for operation, (_, model, _) in NULLABLE_CASES.items():
        body = OPERATIONS[operation]["requestBody"]["content"]["application/json"]
        models = (model, "native") if operation == "POST /responses" else (model,)
        out += [(operation, m, f) for f in _nullable_fields(body) if f != "model"
                for m in models]
    return out


def test_the_nullable_fields_are_found() -> None:
    """The walk of the request schemas finds the fields the document lets be null."""
    params = {(op, f) for op, _, f in _nullable_params()}
    assert ("POST /responses", "store") in params
    assert ("POST /responses", "parallel_tool_calls") in params
    assert ("POST /chat/completions", "stream_options") in params
    assert ("POST /embeddings", "input") not in params


@pytest.mark.parametrize(("operation", "model", "field"), _nullable_params())
async def test_null_is_accepted_wherever_openai_allows_it(  # type: ignore[no-untyped-def]
        setup, operation: str, model: str, field: str) -> None:
    """A request with one nullable field set to null is answered 200, schema-valid."""
    gw, auth, _, _, _ = setup
    path, _, body = NULLABLE_CASES[operation]
    r = await gw.client.post(path, headers=auth, json={"model": model, **body, field: None})
    assert r.status_code == 200, r.text
    check(r.json(), answer(operation), f"{operation} with {field}: null")


async def test_the_batch_request_accepts_null_metadata(setup) -> None:  # type: ignore[no-untyped-def]
    """CreateBatchRequest's nullable fields (metadata) take null."""
    gw, auth, _, _, _ = setup
    nullable = _nullable_fields(
        OPERATIONS["POST /batches"]["requestBody"]["content"]["application/json"])
    assert nullable == ["metadata"]
    client = gw.openai(auth["Authorization"].removeprefix("Bearer "))
    file_id = (await client.files.create(file=("in.jsonl", io.BytesIO(line(0))),
                                         purpose="batch")).id
    r = await gw.client.post("/v1/batches", headers=auth, json={
        "input_file_id": file_id, "endpoint": "/v1/chat/completions",
        "completion_window": "24h", "metadata": None})
    assert r.status_code == 200, r.text
    check(r.json(), answer("POST /batches"), "a batch with metadata: null")


def test_the_extract_carries_no_prose() -> None:
    """The pinned extract names its source and holds structure only."""
    source = EXTRACT["source"]
    assert source["repository"] == "openai/openai-openapi"
    assert len(source["commit"]) == 40

    def keywords(schema: Any) -> Iterator[str]:
        """The keywords used in ``schema`` and every schema inside it."""
        if isinstance(schema, list):
            for item in schema:
                yield from keywords(item)
        if not isinstance(schema, dict):
            return
        for key, value in schema.items():
            yield key
            if key in ("properties", "patternProperties", "$defs"):
                for inner in value.values():
                    yield from keywords(inner)
            elif key not in ("enum", "const", "default", "required", "discriminator"):
                yield from keywords(value)

    found = set(keywords(list(EXTRACT["$defs"].values())))
    assert not found & {"description", "title", "example", "examples", "summary",
                        "x-oaiMeta", "nullable"}

