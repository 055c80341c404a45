"""The Responses API and the capability check against the real embedded engine.

llama-cpp-python's server has no /v1/responses, so every request here is
translated by the gateway to a chat completion for the real Gemma 3 270M
replica, and its real answers (JSON and streams framed by sse-starlette)
translated back; the `openai` client is the judge of the result.

Greedy decoding is deterministic on one machine but not across CPUs: the
matrix kernels llama.cpp picks (AVX2, AVX-512, AMX, NEON) sum in different
orders, so a close call between two tokens can go either way. The tests
assert only what holds for any text, and where an answer must end within its
token budget the schema bounds its length (llama-cpp-python's grammar allows
at most one space between JSON tokens), so no CPU can run past it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest

from llmgw.catalog.build import Runtime, build_catalog
from llmgw.config import ServerConfig
from llmgw.gateway import Gateway
from llmgw.scheduler.local.backend import LocalBackend
from llmgw.store.sqlite import SqliteStore
from tests.gateway.conftest import serve

from .conftest import cpu_model, until

pytestmark = pytest.mark.slow


class _Catalog:
    def __init__(self, backend: LocalBackend) -> None:
        self.catalog = build_catalog([cpu_model("gemma")], runtime=Runtime(scheduler="local"))


@pytest.fixture
async def client(backend: LocalBackend, tmp_path: Path) -> AsyncIterator[openai.AsyncOpenAI]:
    view = _Catalog(backend)
    await backend.apply(view.catalog)
    await until(lambda: bool(backend.endpoints("gemma")), "gemma to be ready")
    store = SqliteStore(f"sqlite:///{tmp_path / 'store.db'}")
    await store.open()
    gateway = Gateway(ServerConfig(listen="127.0.0.1:0"), view, backend, store)
    await gateway.start()
    try:
        async with serve(gateway) as url:
            client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0,
                                        timeout=180)
            yield client
            await client.close()
    finally:
        await gateway.close()
        await store.close()


async def test_a_response_is_translated_to_and_from_the_real_engine(
        client: openai.AsyncOpenAI) -> None:
    """A Response with real text, then a streamed second turn continuing the first."""
    first = await client.responses.create(model="gemma", input="Name a colour.",
                                          instructions="Answer in one word.",
                                          max_output_tokens=16, temperature=0)
    assert first.status in ("completed", "incomplete")
    assert first.output_text.strip()
    stream = await client.responses.create(model="gemma", input="And another one?",
                                           previous_response_id=first.id,
                                           max_output_tokens=16, temperature=0, stream=True)
    kinds: list[str] = []
    deltas: list[str] = []
    final: Any = None
    async for event in stream:
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        if event.type in ("response.completed", "response.incomplete"):
            final = event.response
    assert kinds[0] == "response.created"
    assert len(deltas) > 1
    assert final is not None
    assert final.output_text == "".join(deltas)
    assert final.previous_response_id == first.id


async def test_a_json_schema_format_is_sent_in_llama_cpp_pythons_own_shape(
        client: openai.AsyncOpenAI) -> None:
    """text.format json_schema becomes json_object + schema, which the engine enforces."""
    # The grammar then allows at most 40 characters of JSON: it ends within 48 tokens.
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}},
              "required": ["city"]}
    response = await client.responses.create(
        model="gemma", input="Which city is the capital of France?", max_output_tokens=48,
        temperature=0, text={"format": {"type": "json_schema", "name": "answer",
                                        "schema": schema}})
    assert response.status == "completed"
    assert set(json.loads(response.output_text)) == {"city"}


async def test_a_chat_json_schema_is_reworded_for_the_engine_instead_of_failing_it(
        client: openai.AsyncOpenAI) -> None:
    """OpenAI's json_schema response_format, which llama-cpp-python answers with a 500, is
    sent as json_object + schema: the answer follows the schema."""
    # The grammar then allows at most 28 characters of JSON: it ends within 32 tokens.
    schema = {"type": "object", "properties": {"colour": {"type": "string", "maxLength": 10}},
              "required": ["colour"]}
    reply = await client.chat.completions.create(
        model="gemma", messages=[{"role": "user", "content": "Name a colour."}],
        max_tokens=32, temperature=0,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "colour", "schema": schema, "strict": True}})
    assert set(json.loads(reply.choices[0].message.content or "")) == {"colour"}


async def test_what_the_embedded_engine_cannot_do_is_refused_before_it(
        client: openai.AsyncOpenAI) -> None:
    """Embeddings and rerank are 400s from the gateway naming what gemma serves."""
    with pytest.raises(openai.BadRequestError, match="serves chat, completions"):
        await client.embeddings.create(model="gemma", input="x")
    with pytest.raises(openai.BadRequestError, match="does not serve /v1/rerank"):
        await client.post("/rerank", cast_to=dict[str, Any],  # type: ignore[arg-type]
                          body={"model": "gemma", "query": "q", "documents": ["d"]})


async def test_a_completion_stream_of_the_real_engine_is_passed_on_whole(
        client: openai.AsyncOpenAI) -> None:
    """A streamed completion of the real engine, resumable and so passed on event by event,
    arrives whole: its text, one finish_reason, no error event."""
    stream = await client.completions.create(model="gemma", prompt="Once upon a time",
                                             max_tokens=12, temperature=0, stream=True)
    texts: list[str] = []
    finishes: list[str] = []
    async for chunk in stream:
        for choice in chunk.choices:
            texts.append(choice.text)
            if choice.finish_reason:
                finishes.append(choice.finish_reason)
    assert "".join(texts).strip()
    assert len(finishes) == 1
