"""The pieces of a request the gateway reads or rewrites, without servers."""

from __future__ import annotations

import json

import pytest

from llmgw.gateway.errors import InvalidRequestError
from llmgw.gateway.proxy import rewrite_model, target_url
from llmgw.gateway.request import parse_head


def test_parse_head_reads_model_and_stream_only() -> None:
    """model and stream are read; every other field, however odd, is left alone."""
    head = parse_head(b'{"messages": [{"x": [1, {"y": null}]}], "model": "m", "stream": true}')
    assert (head.model, head.stream) == ("m", True)
    assert parse_head(b'{"model": "m", "stream": null}').stream is None


@pytest.mark.parametrize(("body", "param"), [
    (b"", None), (b"{", None), (b"null", None), (b'"model"', None),
    (b"{}", "model"), (b'{"model": null}', "model"), (b'{"model": ""}', "model"),
    (b'{"model": "m", "stream": 1}', "stream"), (b'{"model": "m", "stream": "true"}', "stream"),
])
def test_parse_head_errors_name_the_field(body: bytes, param: str | None) -> None:
    """Each malformed body is a 400 whose param names the field at fault, if any."""
    with pytest.raises(InvalidRequestError) as err:
        parse_head(body)
    assert err.value.status == 400
    assert err.value.field == param


def test_rewrite_model_changes_only_the_model() -> None:
    """The served name replaces model; other values keep their exact spelling."""
    body = b'{"model":"alias","temperature":1.0e0,"messages":[{"b":1,"a":2}]}'
    out = rewrite_model(body, "org/Served-Model")
    assert json.loads(out)["model"] == "org/Served-Model"
    assert b'"temperature":1.0e0' in out
    assert b'"messages":[{"b":1,"a":2}]' in out


@pytest.mark.parametrize(("base", "url"), [
    ("http://10.0.0.5:8000", "http://10.0.0.5:8000/v1/chat/completions"),
    ("http://10.0.0.5:8000/", "http://10.0.0.5:8000/v1/chat/completions"),
    ("https://api.example.com/v1", "https://api.example.com/v1/chat/completions"),
    ("https://example.com/openai/v1/", "https://example.com/openai/v1/chat/completions"),
])
def test_target_url_accepts_base_urls_with_or_without_v1(base: str, url: str) -> None:
    """A replica's base URL may end in /v1 or not; the request lands on .../v1/<endpoint>."""
    assert target_url(base, "/v1/chat/completions") == url


def test_an_engine_never_sees_hop_by_hop_credentials_or_oversized_headers() -> None:
    """Connection and the headers it names, this hop's, the key, and lines an engine refuses."""
    from llmgw.gateway.proxy import MAX_FORWARDED_HEADER, upstream_headers

    sent = upstream_headers([
        (b"connection", b"keep-alive, X-Secret-Hop"), (b"x-secret-hop", b"1"),
        (b"keep-alive", b"timeout=5"), (b"transfer-encoding", b"chunked"),
        (b"authorization", b"Bearer sk"), (b"x-big", b"a" * MAX_FORWARDED_HEADER),
        (b"x-request-id", b"r1"), (b"content-type", b"application/json"),
    ])
    assert sent == {"x-request-id": "r1", "content-type": "application/json",
                    "accept-encoding": "identity"}


def test_a_deeply_nested_body_is_refused_before_it_is_decoded() -> None:
    with pytest.raises(InvalidRequestError, match="nested more than 128 levels"):
        parse_head(b'{"model": "m", "x": ' + b"[" * 900 + b"]" * 900 + b"}")
    assert parse_head(b'{"model": "m", "x": ' + b"[" * 127 + b"]" * 127 + b"}").model == "m"


def test_the_request_id_reaches_the_engines_that_take_it() -> None:
    """vLLM is sent the id the client is answered with; llama.cpp none (llama-cpp-python
    refuses an x-request-id that is not a UUID with an empty 400); another engine what the
    client sent."""
    from llmgw.gateway import requestid
    from llmgw.gateway.proxy import upstream_headers

    client = [(b"x-request-id", b"trace-7"), (b"content-type", b"application/json")]
    token = requestid.current.set(b"trace-7")
    try:
        assert upstream_headers([client[1]], "vllm")["x-request-id"] == "trace-7"
        assert "x-request-id" not in upstream_headers(client, "llama.cpp")
        assert upstream_headers(client, None)["x-request-id"] == "trace-7"
        assert "x-request-id" not in upstream_headers([client[1]], None)
    finally:
        requestid.current.reset(token)
