"""Rerank, score and audio through the `openai` client, and the capability check before them."""

from __future__ import annotations

import hashlib
import io
import warnings
from typing import Any

import httpx
import openai
import pytest

from tests.gateway.conftest import GatewayFactory, GatewayHandle, chat_model
from tests.gateway.engine import FakeEngine

AUDIO = bytes(range(256)) * 4096 + b"\r\n--not-a-boundary\r\n"      # about 1 MiB


@pytest.fixture
async def setup(make_gateway: GatewayFactory, engines
                ) -> tuple[GatewayHandle, openai.AsyncOpenAI, FakeEngine]:
    engine = await engines("e")
    gw = await make_gateway([
        chat_model("reranker", upstream=[engine.url], served_name="BAAI/bge-reranker",
                   capabilities=["rerank", "score"]),
        chat_model("whisper", upstream=[engine.url], served_name="openai/whisper-large",
                   capabilities=["audio"]),
        chat_model("tts", upstream=[engine.url], served_name="Qwen/TTS",
                   capabilities=["speech"]),
        chat_model("chat", upstream=[engine.url]),
    ], max_upload_size="2MiB")
    client = gw.openai()
    return gw, client, engine


async def test_rerank_and_score_are_routed_with_the_body_intact(setup) -> None:  # type: ignore[no-untyped-def]
    """Cohere/Jina-style rerank and vLLM's score reach the engine unchanged but for the model."""
    _, client, engine = setup
    rerank: dict[str, Any] = await client.post(
        "/rerank", cast_to=dict[str, Any],  # type: ignore[arg-type]
        body={"model": "reranker", "query": "capital of France?", "top_n": 2,
              "documents": ["Paris is the capital", "Rerankers are fun", "vLLM serves"]})
    assert [r["index"] for r in rerank["results"]] == [0, 1]
    assert engine.paths[-1] == "/v1/rerank"
    assert engine.requests[-1] == {"model": "BAAI/bge-reranker", "query": "capital of France?",
                                   "top_n": 2, "documents": ["Paris is the capital",
                                                             "Rerankers are fun", "vLLM serves"]}
    score: dict[str, Any] = await client.post(
        "/score", cast_to=dict[str, Any],  # type: ignore[arg-type]
        body={"model": "reranker", "text_1": "a", "text_2": ["b", "c"]})
    assert score["data"][0]["score"] == 0.5
    assert engine.requests[-1] == {"model": "BAAI/bge-reranker", "text_1": "a",
                                   "text_2": ["b", "c"]}


async def test_an_endpoint_the_model_lacks_is_a_400_naming_its_capabilities(setup) -> None:  # type: ignore[no-untyped-def]
    """A chat model asked to rerank answers 400 listing what it serves; the engine sees nothing."""
    _, client, engine = setup
    with pytest.raises(openai.BadRequestError) as err:
        await client.post("/rerank", cast_to=dict[str, Any],  # type: ignore[arg-type]
                          body={"model": "chat", "query": "q", "documents": ["d"]})
    assert err.value.code == "unsupported_endpoint"
    assert "does not serve /v1/rerank" in err.value.message
    assert "chat, completions, embeddings and responses (translated to chat)" in \
        err.value.message
    with pytest.raises(openai.BadRequestError, match="serves rerank and score"):
        await client.chat.completions.create(model="reranker", messages=[])
    assert engine.requests == []


async def test_a_fallback_that_cannot_serve_the_endpoint_is_skipped(
        make_gateway: GatewayFactory, engines) -> None:
    """A failing reranker falls back past a chat model to the next reranker."""
    down, chat, good = await engines("down"), await engines("chat"), await engines("good")
    down.fail_status = 503
    gw = await make_gateway([
        chat_model("rr", upstream=[down.url], capabilities=["rerank"],
                   fallbacks=["chatty", "rr2"]),
        chat_model("chatty", upstream=[chat.url]),
        chat_model("rr2", upstream=[good.url], capabilities=["rerank"])])
    r = await gw.client.post("/v1/rerank", json={"model": "rr", "query": "q",
                                                 "documents": ["d"]})
    assert r.status_code == 200
    assert r.headers["x-llmgw-model"] == "rr2"
    assert chat.requests == []


async def test_a_transcription_upload_reaches_the_engine_whole_with_the_served_model(
        setup) -> None:  # type: ignore[no-untyped-def]
    """The file arrives byte for byte, every other field unchanged, model mapped."""
    _, client, engine = setup
    result = await client.audio.transcriptions.create(
        model="whisper", file=("speech.wav", io.BytesIO(AUDIO), "audio/wav"),
        language="de", prompt="Namen: Ada", temperature=0.2)
    assert result.text == "transcriptions by e"
    [upload] = engine.uploads
    assert upload["model"] == "openai/whisper-large"
    assert upload["file"] == {"filename": "speech.wav", "bytes": len(AUDIO),
                              "sha256": hashlib.sha256(AUDIO).hexdigest(),
                              "content_type": "audio/wav"}
    assert (upload["language"], upload["prompt"], upload["temperature"]) == \
        ("de", "Namen: Ada", "0.2")
    with warnings.catch_warnings():   # the client marks translations deprecated
        warnings.simplefilter("ignore", DeprecationWarning)
        translated = await client.audio.translations.create(
            model="whisper", file=("speech.wav", io.BytesIO(AUDIO)), response_format="text")
    assert "translations by e" in str(translated)
    assert engine.paths[-1] == "/v1/audio/translations"


async def test_the_model_field_may_follow_the_file(setup) -> None:  # type: ignore[no-untyped-def]
    """A form with the file first (curl -F file=@a -F model=x) is routed by its later field."""
    gw, _, engine = setup
    files = [("file", ("a.wav", AUDIO, "audio/wav")), ("model", (None, b"whisper"))]
    r = await gw.client.post("/v1/audio/transcriptions", files=files)
    assert r.status_code == 200, r.text
    assert engine.uploads[-1]["file"]["bytes"] == len(AUDIO)
    assert engine.uploads[-1]["model"] == "openai/whisper-large"


async def test_a_failed_upload_attempt_is_retried_with_the_same_bytes(
        make_gateway: GatewayFactory, engines) -> None:
    """A replica answering 503 is retried on the next one, which receives the whole upload."""
    bad, good = await engines("bad"), await engines("good")
    bad.fail_status = 503
    gw = await make_gateway([chat_model("w", upstream=[bad.url, good.url],
                                        capabilities=["audio"])])
    client = gw.openai()
    for _ in range(2):       # whichever replica the balancer tries first
        result = await client.audio.transcriptions.create(
            model="w", file=("a.wav", io.BytesIO(AUDIO)))
        assert result.text == "transcriptions by good"
    assert all(u["file"]["sha256"] == hashlib.sha256(AUDIO).hexdigest() for u in good.uploads)


async def test_an_upload_over_the_limit_is_413_and_not_multipart_is_400(setup) -> None:  # type: ignore[no-untyped-def]
    """Past gateway.max_upload_size the answer is 413; a JSON body to an upload path is 400."""
    gw, client, engine = setup
    with pytest.raises(openai.APIStatusError) as err:
        await client.audio.transcriptions.create(
            model="whisper", file=("big.wav", io.BytesIO(b"x" * (3 * 1024 * 1024))))
    assert err.value.status_code == 413
    assert "max_upload_size" in err.value.message
    chunked = httpx.AsyncClient(base_url=gw.url)

    async def body() -> Any:
        yield b"--B\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper\r\n"
        yield b"--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\n\r\n"
        for _ in range(3):
            yield b"y" * (1024 * 1024)

    r = await chunked.post("/v1/audio/transcriptions", content=body(),
                           headers={"content-type": "multipart/form-data; boundary=B"})
    assert r.status_code == 413
    await chunked.aclose()
    r = await gw.client.post("/v1/audio/transcriptions", json={"model": "whisper"})
    assert r.status_code == 400
    assert "multipart/form-data" in r.json()["error"]["message"]
    assert engine.uploads == []


async def test_speech_comes_back_as_the_engines_bytes(setup) -> None:  # type: ignore[no-untyped-def]
    """client.audio.speech returns the engine's audio exactly; the JSON request is intact."""
    _, client, engine = setup
    engine.chunk_delay = 0.01
    audio = await client.audio.speech.create(model="tts", voice="alloy", input="Hallo",
                                             response_format="mp3")
    assert audio.content == engine.speech
    assert engine.requests[-1] == {"model": "Qwen/TTS", "voice": "alloy", "input": "Hallo",
                                   "response_format": "mp3"}


async def test_speech_is_streamed_before_the_engine_finishes(setup) -> None:  # type: ignore[no-untyped-def]
    """The first audio bytes reach the client while the engine is still writing the rest."""
    gw, _, engine = setup
    engine.chunk_delay = 0.3
    async with gw.client.stream("POST", "/v1/audio/speech",
                                json={"model": "tts", "voice": "a", "input": "x"}) as r:
        assert r.headers["content-type"] == "audio/mpeg"
        first = await r.aiter_raw().__anext__()
        assert first
        assert engine.finished == 0
