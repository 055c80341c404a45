"""Gateway errors in OpenAI's JSON error shape, as responses and as SSE events.

Every error the gateway answers is an ``llmgw.errors`` exception (the one
tree), turned into ``{"error": {"message", "type", "param", "code"}}`` here and
only here. ``type`` uses OpenAI's vocabulary (``invalid_request_error``,
``authentication_error``, …) and ``code`` is a short machine-readable string
(``model_not_found``, ``invalid_api_key``), because those are what OpenAI's
clients and the code written against them look at; the status line carries
the number.

The leaves below add the statuses the shared tree has no class for (405, 413,
502, 504) and the ``code`` each gateway failure reports:

    DefinitionError  → InvalidRequestError 400, BodyTooLargeError 413
    AuthError        → InvalidKeyError 401
    ForbiddenError   → ModelNotAllowedError 403
    NotFoundError    → ModelNotFoundError 404, UnknownPathError 404
    LlmgwError       → MethodNotAllowedError 405 (Allow)
    RateLimitedError → KeyRateLimitedError 429, ModelBusyError 429 (Retry-After)
    UnavailableError → NoReplicaError 503 (Retry-After)
                       UpstreamError 502 → UpstreamTimeoutError 504, StreamBrokenError
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import msgspec

from llmgw.errors import (
    AuthError,
    DefinitionError,
    ForbiddenError,
    LlmgwError,
    NotFoundError,
    RateLimitedError,
    UnavailableError,
)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class InvalidRequestError(DefinitionError):
    """Malformed JSON, a missing ``model``, a ``stream`` that is not a boolean."""

    code = "invalid_request"


class BodyTooLargeError(DefinitionError):
    status = 413
    kind = "request_too_large"
    code = "request_too_large"


class InvalidKeyError(AuthError):
    code = "invalid_api_key"


class ModelNotAllowedError(ForbiddenError):
    code = "model_not_allowed"


class ModelNotFoundError(NotFoundError):
    code = "model_not_found"


class UnknownPathError(NotFoundError):
    code = "unknown_url"


class MethodNotAllowedError(LlmgwError):
    """A method the path does not take; the answer's ``Allow`` lists those it does."""

    status = 405
    kind = "method_not_allowed"
    code = "method_not_allowed"

    def __init__(self, method: str, path: str, allow: tuple[str, ...], purpose: str = "") -> None:
        super().__init__(f"{method} {path}: use {' or '.join(allow)}{purpose}")
        self.allow = allow


class KeyRateLimitedError(RateLimitedError):
    code = "rate_limit_exceeded"


class NoReplicaError(UnavailableError):
    """No replica of the model (nor of a fallback) can take the request now."""

    code = "model_unavailable"

    def __init__(self, message: str, *, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class CatalogUnavailableError(UnavailableError):
    """Not a declared model, and the runtime ones could not be read from the store yet."""

    code = "catalog_unavailable"

    def __init__(self, message: str, *, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class UpstreamError(UnavailableError):
    """Every replica and fallback that was tried failed before answering."""

    status = 502
    kind = "upstream_error"
    code = "upstream_error"


class UpstreamTimeoutError(UpstreamError):
    """Every attempt that failed did so by timing out before the first byte."""

    status = 504
    kind = "upstream_timeout"
    code = "upstream_timeout"


class StreamBrokenError(UpstreamError):
    """A stream that had already sent bytes to the client broke; it cannot be retried."""

    code = "stream_interrupted"


class ClientGone(Exception):  # noqa: N818 - a signal, not an error condition
    """The client went away (disconnected, or sending to it failed). Never a replica's fault."""


# OpenAI's ``type`` for each status; another 4xx is an invalid request, a 5xx a
# server_error.
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}
# The ``type`` values of OpenAI's vocabulary an engine's error may keep.
_OPENAI_TYPES = frozenset({*_TYPES.values(), "server_error", "insufficient_quota"})
# Codes of the shared tree that mean something else to an OpenAI client: a body the
# shared decoder refused is an invalid request, as every other endpoint says.
_CODES = {"invalid_definition": "invalid_request"}


def openai_type(status: int) -> str:
    return _TYPES.get(status) or ("invalid_request_error" if 400 <= status < 500
                                  else "server_error")


class _Detail(msgspec.Struct):
    message: str
    type: str
    param: str | None
    code: str | None


class _Body(msgspec.Struct):
    error: _Detail


_encode = msgspec.json.Encoder().encode


def error_json(err: LlmgwError) -> bytes:
    """``err`` as OpenAI's error object."""
    code = getattr(err, "code", None) or err.kind
    detail = _Detail(
        message=err.message,
        type=getattr(err, "openai_type", None) or openai_type(err.status),
        param=err.field,
        code=_CODES.get(code, code),
    )
    return _encode(_Body(detail))


# The most of an engine's error text kept as a message (an HTML page, a traceback).
MAX_ENGINE_MESSAGE = 4096


def engine_error_json(status: int, body: bytes) -> bytes:
    """An engine's error answer as OpenAI's error object, its message kept.

    Engines answer errors in their own dialects: vLLM with its exception's
    name as ``type`` and the HTTP status as an integer ``code`` (older
    versions without the ``error`` wrapper), llama.cpp's server with an
    integer ``code``, FastAPI's validation with ``detail``, some with plain
    text. OpenAI's clients read ``error.type`` and a string or null
    ``error.code``; the engine's message is what the user needs and is kept
    as it is. An integer code says no more than the status line and becomes
    null; a ``type`` outside OpenAI's vocabulary becomes the status's.
    """
    try:
        decoded = msgspec.json.decode(body)
    except msgspec.DecodeError:
        decoded = None
    source: dict[str, Any] = {}
    if isinstance(decoded, dict):
        inner = decoded.get("error")
        source = inner if isinstance(inner, dict) else decoded
    message = source.get("message")
    if not isinstance(message, str):
        detail = source.get("detail")
        if isinstance(detail, str):
            message = detail
        elif isinstance(detail, list):
            message = "; ".join(_fastapi_item(d) for d in detail)
        elif isinstance(decoded, dict) and isinstance(decoded.get("error"), str):
            message = decoded["error"]
        else:
            message = body.decode("utf-8", "replace").strip()
    kind = source.get("type")
    param = source.get("param")
    code = source.get("code")
    return _encode(_Body(_Detail(
        message=message[:MAX_ENGINE_MESSAGE] or f"the engine answered HTTP {status}",
        type=kind if kind in _OPENAI_TYPES else openai_type(status),
        param=param if isinstance(param, str) else None,
        code=code if isinstance(code, str) else None,
    )))


def _fastapi_item(item: Any) -> str:
    """One item of FastAPI's validation ``detail``: where, then what."""
    if not isinstance(item, dict):
        return str(item)
    where = ".".join(str(p) for p in item.get("loc") or [] if p != "body")
    text = str(item.get("msg", item))
    return f"{where}: {text}" if where else text


def retry_after(err: LlmgwError) -> int | None:
    """Whole seconds for a ``Retry-After`` header, if the error carries a delay."""
    value: float | None = getattr(err, "retry_after", None)
    if value is None:
        return None
    return max(1, int(value + 0.999))


def sse_error_event(err: LlmgwError) -> bytes:
    """The last event of a stream that broke after it had started.

    OpenAI's streams carry errors as a ``data:`` event whose object has an
    ``error`` key; its Python client raises ``APIError`` on exactly that.
    """
    return b"data: " + error_json(err) + b"\n\n"


async def send_error(send: Send, err: LlmgwError) -> None:
    body = error_json(err)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    seconds = retry_after(err)
    if seconds is not None:
        headers.append((b"retry-after", str(seconds).encode()))
    allow: tuple[str, ...] | None = getattr(err, "allow", None)
    if allow:
        headers.append((b"allow", ", ".join(allow).encode()))
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class ModelBusyError(RateLimitedError):
    """Every replica of the model is saturated and its admission queue is full or too slow."""

    code = "model_overloaded"
