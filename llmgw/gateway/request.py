"""The client's side of an inference request: its key header, its bounded body, its head.

The gateway parses only what it must to route a request — ``model`` and
``stream`` — with a two-field msgspec struct that skips everything else
unparsed; the body itself is forwarded as the client's bytes. Errors name
the field at fault (``param`` in OpenAI's error object).
"""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping
from typing import Any

import msgspec

from llmgw.gateway.errors import BodyTooLargeError, ClientGone, InvalidRequestError, Receive
from llmgw.nesting import MAX_DEPTH, json_depth, too_deep

# Set in a request's ``scope["state"]`` once its caller proved who it is (an API key or
# an admin token): the server's connection guard (``llmgw.connection``) caps, per client
# address, the connections that have not, and reads this to tell them apart.
AUTHENTICATED = "llmgw.authenticated"


def mark_authenticated(scope: MutableMapping[str, Any]) -> None:
    """Say on ``scope`` that its caller is authenticated (see ``AUTHENTICATED``)."""
    state = scope.get("state")
    if isinstance(state, dict):
        state[AUTHENTICATED] = True
    else:
        scope["state"] = {AUTHENTICATED: True}


class RequestHead(msgspec.Struct):
    """The fields of a request body the gateway needs; the rest is not parsed.

    ``stream_options`` is kept as raw bytes: only a stream whose client did not
    ask for usage has it read (``with_usage``).
    """

    model: str
    stream: bool | None = None
    stream_options: msgspec.Raw = msgspec.Raw()      # empty: absent
    # Read leniently (a wrong type is the engine's to refuse): the fair share's estimate.
    max_tokens: msgspec.Raw = msgspec.Raw()
    max_completion_tokens: msgspec.Raw = msgspec.Raw()


_head_decoder = msgspec.json.Decoder(RequestHead)


def parse_head(body: bytes) -> RequestHead:
    """``model`` and ``stream`` of a request body, or a 400 naming what is wrong.

    A body nested deeper than ``llmgw.nesting.MAX_DEPTH`` is refused here, so
    neither this decoder nor an engine ever reads it.
    """
    if json_depth(body) > MAX_DEPTH:
        raise InvalidRequestError(too_deep("the request body"))
    try:
        head = _head_decoder.decode(body)
    except msgspec.ValidationError as exc:  # before DecodeError, its base class
        text = str(exc)
        if "`$.stream`" in text:
            raise InvalidRequestError("stream: must be true or false", field="stream") from None
        if "`$.model`" in text or "missing required field `model`" in text:
            raise InvalidRequestError(
                "model: a string naming the model is required (GET /v1/models lists them)",
                field="model") from None
        raise InvalidRequestError(f"the request body must be a JSON object: {text}") from None
    except msgspec.DecodeError as exc:
        raise InvalidRequestError(f"the request body is not valid JSON: {exc}") from None
    if not head.model:
        raise InvalidRequestError("model: must not be empty (GET /v1/models lists the models)",
                                  field="model")
    return head


def header(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    """The first value of header ``name`` (lower-case, as ASGI gives them)."""
    for n, v in headers:
        if n == name:
            return v
    return None


def _too_large(size: int, limit: int) -> str:
    return (f"the request body ({size} bytes) is over this gateway's limit of "
            f"{limit} bytes (gateway.max_body_size)")


async def read_body(headers: Iterable[tuple[bytes, bytes]], receive: Receive,
                    limit: int) -> bytes:
    """The whole request body, refused with 413 as soon as it is known to exceed ``limit``.

    A declared Content-Length over the limit is refused before reading
    anything; a chunked body, as soon as what has arrived passes it.
    """
    declared = header(headers, b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLargeError(_too_large(int(declared), limit))
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone("the client went away while sending its request")
        chunk: bytes = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                raise BodyTooLargeError(_too_large(size, limit))
            chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


_raw_object = msgspec.json.Decoder(dict[str, msgspec.Raw])
_encode = msgspec.json.Encoder().encode
_TRUE = msgspec.Raw(b"true")


def with_usage(body: bytes, options: msgspec.Raw) -> bytes | None:
    """``body`` asking the engine for a usage chunk, or None if it already asks.

    A stream carries token counts only in a last chunk the client must ask
    for (``stream_options.include_usage``, OpenAI's API); the ledger needs them
    for every stream. Other options the client set are kept.
    """
    opts: dict[str, msgspec.Raw] = {}
    if len(options) and bytes(options).strip() != b"null":
        try:
            opts = _raw_object.decode(options)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None          # not an object: the engine will say what is wrong
        if bytes(opts.get("include_usage", b"")).strip() == b"true":
            return None
    opts["include_usage"] = _TRUE
    fields = _raw_object.decode(body)
    fields["stream_options"] = msgspec.Raw(_encode(opts))
    return _encode(fields)


# What a request is assumed to generate when it does not say (the fair share's estimate).
DEFAULT_ANSWER_TOKENS = 256


def answer_tokens(head: RequestHead) -> int | None:
    """The answer a request allows (``max_completion_tokens``, else ``max_tokens``);
    None when it states neither as a whole number."""
    for raw in (head.max_completion_tokens, head.max_tokens):
        text = bytes(raw).strip()
        if text.isdigit():
            return int(text)
    return None
