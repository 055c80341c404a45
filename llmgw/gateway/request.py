"""The client's side of an inference request: its key header, its bounded body, its head.

The gateway parses only what it must to route a request — ``model`` and
``stream`` — with a two-field msgspec struct that skips everything else
unparsed; the body itself is forwarded as the client's bytes. Errors name
the field at fault (``param`` in OpenAI's error object).
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from llmgw.gateway.errors import BodyTooLargeError, ClientGone, InvalidRequestError, Receive
from llmgw.nesting import MAX_DEPTH, json_depth, too_deep


class RequestHead(msgspec.Struct):
    """The two fields of a request body the gateway needs; the rest is not parsed."""

    model: str
    stream: bool | None = None


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
