"""The official `openai` package works against the gateway unchanged."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest

from llmgw.gateway.keys import add_key
from tests.gateway.conftest import GatewayFactory, GatewayHandle, chat_model


@pytest.fixture
async def setup(make_gateway: GatewayFactory, engines, tmp_path: Path
                ) -> AsyncIterator[tuple[GatewayHandle, openai.AsyncOpenAI, object]]:
    engine = await engines("e")
    engine.chunks = 4
    keys = tmp_path / "keys.json"
    key = add_key(keys, "client", ["chat", "dying"])
    gw = await make_gateway([chat_model("chat", upstream=[engine.url], served_name="org/chat"),
                             chat_model("other", upstream=[engine.url])], keys_file=keys)
    async with openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=key, max_retries=0) as client:
        yield gw, client, engine


async def test_chat_completion(setup) -> None:  # type: ignore[no-untyped-def]
    """client.chat.completions.create returns the engine's answer and usage."""
    _, client, _ = setup
    reply = await client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "hello"}])
    assert reply.choices[0].message.content == "hello from e"
    assert reply.usage is not None
    assert reply.usage.total_tokens == 8


async def test_streaming_chat_completion(setup) -> None:  # type: ignore[no-untyped-def]
    """A streamed chat completion yields every chunk, and the usage chunk when asked for."""
    _, client, _ = setup
    stream = await client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "hello"}], stream=True,
        stream_options={"include_usage": True})
    text, usage = [], None
    async for chunk in stream:
        if chunk.choices:
            text.append(chunk.choices[0].delta.content)
        if chunk.usage:
            usage = chunk.usage
    assert "".join(t or "" for t in text) == "tok0 tok1 tok2 tok3 "
    assert usage is not None
    assert usage.completion_tokens == 4


async def test_completions_and_streaming_completions(setup) -> None:  # type: ignore[no-untyped-def]
    """The legacy completions endpoint works, plain and streamed."""
    _, client, _ = setup
    done = await client.completions.create(model="chat", prompt="once upon")
    assert done.choices[0].text == "hello from e"
    stream = await client.completions.create(model="chat", prompt="once upon", stream=True)
    parts = [c.choices[0].text async for c in stream]
    assert parts == ["tok0 ", "tok1 ", "tok2 ", "tok3 "]


async def test_embeddings(setup) -> None:  # type: ignore[no-untyped-def]
    """Embeddings come back one vector per input."""
    _, client, engine = setup
    result = await client.embeddings.create(model="chat", input=["a", "b", "c"],
                                            encoding_format="float")
    assert [d.embedding for d in result.data] == [[0.25, -0.5, 1.0]] * 3
    assert engine.requests[-1]["model"] == "org/chat"


async def test_models_list(setup) -> None:  # type: ignore[no-untyped-def]
    """client.models.list shows only the models the key may use."""
    _, client, _ = setup
    page = await client.models.list()
    assert [m.id for m in page.data] == ["chat"]
    assert (await client.models.retrieve("chat")).id == "chat"


async def test_errors_become_the_matching_openai_exceptions(  # type: ignore[no-untyped-def]
        setup) -> None:
    """401, 403, 404 and 400 raise the openai package's typed errors with our message."""
    gw, client, _ = setup
    async with openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="sk-llmgw-wrong",
                                  max_retries=0) as bad_key:
        with pytest.raises(openai.AuthenticationError, match="not valid"):
            await bad_key.chat.completions.create(model="chat", messages=[])
    with pytest.raises(openai.PermissionDeniedError, match="may not use"):
        await client.chat.completions.create(model="other", messages=[])
    with pytest.raises(openai.NotFoundError) as not_found:
        await client.chat.completions.create(model="missing", messages=[])
    assert not_found.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError, match="stream"):
        await client.chat.completions.create(model="chat", messages=[],
                                             extra_body={"stream": "sometimes"})


async def test_a_broken_stream_raises_in_the_client(make_gateway: GatewayFactory, engines
                                                    ) -> None:
    """The error event that ends a broken stream surfaces as openai.APIError, not a short reply."""
    dying = await engines("dying")
    dying.chunks = 6
    dying.die_after_chunks = 2
    gw = await make_gateway([chat_model("m", upstream=[dying.url])])
    received: list[str | None] = []
    async with openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="unused",
                                  max_retries=0) as client:
        stream = await client.chat.completions.create(model="m", messages=[], stream=True)

        async def consume() -> None:
            async for chunk in stream:
                received.append(chunk.choices[0].delta.content)  # noqa: PERF401 - kept on error

        with pytest.raises(openai.APIError, match="stream broke"):
            await consume()
    assert received == ["tok0 ", "tok1 "]
