"""The small corners of OpenAI's API, through the official `openai` client where users go.

Listing files, a stored response's input items, ``null`` where OpenAI allows
it, a batch's output expiry, one error vocabulary, ``Allow`` on every 405,
``x-request-id`` on every answer, and engines' own error bodies answered in
OpenAI's shape.
"""

from __future__ import annotations

import io
import json
import logging
import time
from pathlib import Path
from typing import Any

import openai
import pytest

from llmgw.gateway.keys import add_key
from tests.gateway.conftest import GatewayFactory, GatewayHandle, chat_model, wait_for
from tests.gateway.engine import FakeEngine
from tests.gateway.test_files_batches import finished, line


@pytest.fixture
async def setup(make_gateway: GatewayFactory, engines, tmp_path: Path
                ) -> tuple[GatewayHandle, openai.AsyncOpenAI, FakeEngine, str]:
    engine = await engines("e")
    keys = tmp_path / "keys.json"
    key = add_key(keys, "alice")
    other = add_key(keys, "bob")
    gw = await make_gateway([chat_model("chat", upstream=[engine.url], served_name="org/chat")],
                            keys_file=keys)
    return gw, gw.openai(key), engine, other


async def _upload(client: openai.AsyncOpenAI, name: str) -> str:
    file = await client.files.create(file=(name, io.BytesIO(line(0))), purpose="batch")
    return file.id


# --- GET /v1/files -----------------------------------------------------------------------


async def test_files_list_shows_the_callers_files_newest_first_in_pages(setup) -> None:  # type: ignore[no-untyped-def]
    """files.list pages through the caller's own files only, newest first, by `after`."""
    gw, client, _, other_key = setup
    mine = [await _upload(client, f"{i}.jsonl") for i in range(5)]
    await _upload(gw.openai(other_key), "theirs.jsonl")
    page = await client.files.list(limit=2)
    assert [f.id for f in page.data] == mine[::-1][:2]
    assert page.has_more is True
    every = [f.id async for f in client.files.list(limit=2)]
    assert every == mine[::-1]
    oldest_first = [f.id async for f in client.files.list(order="asc")]
    assert oldest_first == mine
    raw = (await gw.client.get("/v1/files", params={"limit": 2, "after": mine[3]},
                               headers={"Authorization": f"Bearer {client.api_key}"})).json()
    assert raw["object"] == "list"
    assert [f["id"] for f in raw["data"]] == [mine[2], mine[1]]
    assert (raw["first_id"], raw["last_id"], raw["has_more"]) == (mine[2], mine[1], True)


async def test_files_list_filters_by_purpose_and_refuses_a_bad_limit(setup) -> None:  # type: ignore[no-untyped-def]
    """purpose=batch_output lists only a batch's results; a limit past 10,000 is a 400."""
    _, client, _, _ = setup
    file_id = await _upload(client, "in.jsonl")
    batch = await client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                        completion_window="24h")
    done = await finished(client, batch.id)
    outputs = [f.id async for f in client.files.list(purpose="batch_output")]
    assert outputs == [done.output_file_id]
    inputs = [f.id async for f in client.files.list(purpose="batch")]
    assert inputs == [file_id]
    with pytest.raises(openai.BadRequestError) as err:
        await client.files.list(limit=10001)
    assert err.value.body["param"] == "limit"  # type: ignore[index]
    assert err.value.code == "invalid_request"


# --- GET /v1/responses/{id}/input_items ----------------------------------------------------


async def test_input_items_list_the_conversation_a_response_was_given(setup) -> None:  # type: ignore[no-untyped-def]
    """A chained response's input items are the earlier turns and its own input, newest
    first, each with an id, paged by `after`; another key gets 404."""
    gw, client, _, other_key = setup
    first = await client.responses.create(model="chat", input="My name is Ada.")
    second = await client.responses.create(
        model="chat", previous_response_id=first.id,
        input=[{"role": "user", "content": "What is my name?"},
               {"role": "user", "content": [{"type": "input_text", "text": "Be brief."}]}])
    items = [i async for i in client.responses.input_items.list(second.id)]
    assert [i.type for i in items] == ["message"] * 4
    assert [i.role for i in items] == ["user", "user", "assistant", "user"]   # type: ignore[union-attr]
    texts = [i.content[0].text for i in items]  # type: ignore[union-attr]
    assert texts == ["Be brief.", "What is my name?", "hello from e", "My name is Ada."]
    assert items[2].id == first.output[0].id
    assert len({i.id for i in items}) == 4
    page = await client.responses.input_items.list(second.id, limit=2, order="asc")
    assert [i.content[0].text for i in page.data] == [  # type: ignore[union-attr]
        "My name is Ada.", "hello from e"]
    assert page.has_more is True
    rest = await client.responses.input_items.list(second.id, after=page.data[-1].id,
                                                   order="asc")
    assert [i.content[0].text for i in rest.data] == [  # type: ignore[union-attr]
        "What is my name?", "Be brief."]
    assert rest.has_more is False
    again = [i.id async for i in client.responses.input_items.list(second.id)]
    assert again == [i.id for i in items]          # ids are stable across reads
    with pytest.raises(openai.NotFoundError):
        await gw.openai(other_key).responses.input_items.list(second.id)


# --- null where OpenAI allows it ----------------------------------------------------------


async def test_store_null_and_other_nulls_take_the_default(setup) -> None:  # type: ignore[no-untyped-def]
    """`store: null` keeps the response (the default), and null tool_choice and
    parallel_tool_calls are answered with their defaults rather than echoed."""
    _, client, _, _ = setup
    response = await client.responses.create(model="chat", input="hi", store=None,
                                             parallel_tool_calls=None, tool_choice=None,
                                             stream=None, background=None)
    assert response.parallel_tool_calls is True
    assert response.tool_choice == "auto"
    assert (await client.responses.retrieve(response.id)).id == response.id


# --- batches ------------------------------------------------------------------------------


async def test_a_batch_output_expires_as_output_expires_after_says(setup) -> None:  # type: ignore[no-untyped-def]
    """output_expires_after sets the output file's expires_at from its created_at."""
    _, client, _, _ = setup
    file_id = await _upload(client, "in.jsonl")
    batch = await client.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h",
        output_expires_after={"anchor": "created_at", "seconds": 7200})
    done = await finished(client, batch.id)
    output = await client.files.retrieve(done.output_file_id)
    assert output.expires_at == output.created_at + 7200
    assert (await client.files.retrieve(file_id)).expires_at is None


async def test_batch_request_errors_use_the_gateways_codes(setup) -> None:  # type: ignore[no-untyped-def]
    """A malformed batch request is `invalid_request` naming the field, as elsewhere."""
    _, client, _, _ = setup
    file_id = await _upload(client, "in.jsonl")
    for extra, param in (({"output_expires_after": {"anchor": "created_at", "seconds": 60}},
                          "output_expires_after.seconds"),
                         ({"surprise": 1}, "surprise")):
        with pytest.raises(openai.BadRequestError) as err:
            await client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                        completion_window="24h", extra_body=extra)
        assert err.value.code == "invalid_request"
        assert err.value.body["param"] == param  # type: ignore[index]


async def test_a_batch_object_carries_no_null_the_document_forbids(setup) -> None:  # type: ignore[no-untyped-def]
    """A new batch has no output_file_id, errors or *_at keys rather than nulls."""
    gw, client, _, _ = setup
    file_id = await _upload(client, "in.jsonl")
    batch = await client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                        completion_window="24h")
    raw = (await gw.client.get(f"/v1/batches/{batch.id}",
                               headers={"Authorization": f"Bearer {client.api_key}"})).json()
    nulls = {k for k, v in raw.items() if v is None and k != "metadata"}
    assert nulls == set()


# --- 405 -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "path", "allow"), [
    ("GET", "/v1/chat/completions", "POST"),
    ("PUT", "/v1/embeddings", "POST"),
    ("GET", "/v1/responses", "POST"),
    ("POST", "/v1/responses/resp_1", "GET, DELETE"),
    ("POST", "/v1/responses/resp_1/input_items", "GET"),
    ("DELETE", "/v1/files", "GET, POST"),
    ("POST", "/v1/files/file-1", "GET, DELETE"),
    ("POST", "/v1/files/file-1/content", "GET"),
    ("DELETE", "/v1/batches", "GET, POST"),
    ("POST", "/v1/batches/batch_1", "GET"),
    ("GET", "/v1/batches/batch_1/cancel", "POST"),
    ("POST", "/v1/models", "GET"),
    ("DELETE", "/v1/models/chat", "GET"),
    ("GET", "/v1/audio/transcriptions", "POST"),
])
async def test_a_405_says_which_methods_the_path_takes(setup, method: str, path: str,  # type: ignore[no-untyped-def]
                                                       allow: str) -> None:
    """Every 405 carries Allow with the path's methods (RFC 9110 15.5.6)."""
    gw, client, _, _ = setup
    r = await gw.client.request(method, path,
                                headers={"Authorization": f"Bearer {client.api_key}"})
    assert r.status_code == 405
    assert r.headers["allow"] == allow
    assert r.json()["error"]["code"] == "method_not_allowed"


# --- x-request-id ----------------------------------------------------------------------------


async def test_every_answer_has_a_request_id_the_client_may_choose(setup) -> None:  # type: ignore[no-untyped-def]
    """The SDK's _request_id is set on answers, streams and errors; a sane id sent by the
    client is echoed, an unsafe or overlong one replaced."""
    gw, client, _, _ = setup
    reply = await client.chat.completions.create(model="chat", messages=[])
    assert reply._request_id is not None
    assert reply._request_id.startswith("req_")
    again = await client.chat.completions.create(model="chat", messages=[])
    assert again._request_id != reply._request_id
    models = await client.models.with_raw_response.list()
    assert models.request_id is not None
    with pytest.raises(openai.NotFoundError) as err:
        await client.chat.completions.create(model="missing", messages=[])
    assert err.value.request_id is not None
    auth = {"Authorization": f"Bearer {client.api_key}"}
    body = {"model": "chat", "messages": [], "stream": True}
    async with gw.client.stream("POST", "/v1/chat/completions", json=body,
                                headers={**auth, "x-request-id": "trace-42.a:b"}) as r:
        assert r.headers["x-request-id"] == "trace-42.a:b"
    for bad in (b"x" * 300, b"has space", b"semi;colon", "ünï".encode(), b"100%"):
        r = await gw.client.get("/v1/models", headers={**auth, "x-request-id": bad})
        assert r.headers["x-request-id"].startswith("req_"), bad
    r = await gw.client.get("/v1/nowhere", headers=auth)
    assert r.status_code == 404
    assert r.headers["x-request-id"].startswith("req_")


async def test_the_request_id_is_in_the_log_lines_about_its_request(  # type: ignore[no-untyped-def]
        setup, caplog: pytest.LogCaptureFixture) -> None:
    """What the gateway logs while serving a request names that request's id."""
    gw, client, engine, _ = setup
    engine.chunks = 6
    engine.die_after_chunks = 2
    caplog.set_level(logging.WARNING, logger="llmgw.gateway")
    body = {"model": "chat", "messages": [], "stream": True}
    headers = {"Authorization": f"Bearer {client.api_key}", "x-request-id": "broken-7"}
    async with gw.client.stream("POST", "/v1/chat/completions", json=body,
                                headers=headers) as r:
        await r.aread()
    lines = [rec.getMessage() for rec in caplog.records if "broke" in rec.getMessage()]
    assert lines
    assert all("broken-7" in m for m in lines)


# --- an engine's own error body ------------------------------------------------------------


@pytest.mark.parametrize(("status", "body", "ctype", "message", "param", "code"), [
    # vLLM: ErrorResponse with its exception's name as type and the status as code.
    (400, {"error": {"message": "max_tokens is too large", "type": "BadRequestError",
                     "param": None, "code": 400}}, "application/json",
     "max_tokens is too large", None, None),
    # vLLM before 0.10: the same, not wrapped in "error".
    (400, {"object": "error", "message": "bad prompt", "type": "BadRequestError",
           "param": "prompt", "code": 400}, "application/json", "bad prompt", "prompt", None),
    # llama.cpp's server: an OpenAI-like object with an integer code.
    (400, {"error": {"code": 400, "message": "context too long",
                     "type": "invalid_request_error"}}, "application/json",
     "context too long", None, None),
    # FastAPI's validation answer (llama-cpp-python).
    (422, {"detail": [{"loc": ["body", "messages"], "msg": "field required"}]},
     "application/json", "field required", None, None),
    # A string code is the engine's word and is kept.
    (404, {"error": {"message": "no such model", "type": "NotFoundError",
                     "param": "model", "code": "model_not_found"}}, "application/json",
     "no such model", "model", "model_not_found"),
    (400, "Bad Request: unreadable", "text/plain", "Bad Request: unreadable", None, None),
])
async def test_an_engines_error_is_answered_in_openais_shape(  # type: ignore[no-untyped-def]
        setup, status: int, body: Any, ctype: str, message: str, param: str | None,
        code: str | None) -> None:
    """A 4xx from the engine reaches the client as {error: {message, type, param, code}}
    with the engine's message, a string or null code, and OpenAI's type for the status."""
    gw, client, engine, _ = setup
    engine.fail_status = status
    engine.fail_body = (body.encode() if isinstance(body, str) else json.dumps(body).encode(),
                        ctype)
    r = await gw.client.post("/v1/chat/completions", json={"model": "chat", "messages": []},
                             headers={"Authorization": f"Bearer {client.api_key}"})
    assert r.status_code == status
    assert r.headers["content-type"] == "application/json"
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert message in error["message"]
    assert error["param"] == param
    assert error["code"] == code
    assert error["type"] == "invalid_request_error"
    assert r.headers["x-llmgw-model"] == "chat"


async def test_a_request_id_reaches_the_teams_request_log(  # type: ignore[no-untyped-def]
        make_gateway: GatewayFactory, engines) -> None:
    """A team that logs requests finds each under the id its client was given."""
    from llmgw.tenancy import Limits
    from tests.gateway.test_tenants import make_key, make_team

    engine = await engines()
    gw = await make_gateway([chat_model("m", upstream=[engine.url])], listen="0.0.0.0:8080",
                            ledger_interval="50ms")
    await make_team(gw.store, "meta", Limits(log_requests="metadata"))
    key = await make_key(gw.store, "meta-key", "meta")
    await wait_for(lambda: len(gw.gateway.keys) == 1, what="the runtime key")
    r = await gw.client.post("/v1/chat/completions", json={"model": "m", "messages": []},
                             headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200
    await gw.gateway.ledger.flush()   # type: ignore[union-attr]
    [logged] = await gw.store.request_logs("meta", time.time() + 1, 10)
    assert json.loads(logged.record)["request_id"] == r.headers["x-request-id"]
