"""The one place errors become HTTP responses.

Every error body has OpenAI's shape, so the gateway and the control API speak
alike and a client needs one parser:
``{"error": {"message": ..., "type": ..., "param": <field or null>, "code": <status>}}``.

Definition errors are 400 with the reason and the field; refusals (a declared
model, a removal that would break a fallback) 409; unknown names 404; a store
or scheduler that cannot be reached 503. Anything unexpected is a 500 that
says to read the server's log, and is logged with its traceback.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import msgspec
from litestar import Request, Response
from litestar.exceptions import HTTPException, ValidationException

from llmgw.catalog.rules import explain
from llmgw.errors import LlmgwError
from llmgw.tenancy import TEAM_WIDE

log = logging.getLogger("llmgw.api")


class ErrorDetail(msgspec.Struct, kw_only=True):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorBody(msgspec.Struct):
    error: ErrorDetail


def error_response(status: int, kind: str, message: str, param: str | None = None,
                   headers: dict[str, str] | None = None) -> Response[ErrorBody]:
    return Response(
        ErrorBody(ErrorDetail(message=message, type=kind, param=param, code=status)),
        status_code=status, headers=headers,
    )


def _llmgw(_: Request[Any, Any, Any], exc: LlmgwError) -> Response[ErrorBody]:
    headers = None
    retry_after = getattr(exc, "retry_after", None)
    if retry_after is not None:
        headers = {"Retry-After": str(max(1, round(retry_after)))}
    return error_response(exc.status, exc.kind, exc.message, exc.field, headers)


EMPTY_BODY = ("request body: empty; this endpoint takes a JSON object "
              "(Content-Type: application/json), its fields as documented at /api/docs")
_UNKNOWN = re.compile(r"Object contains unknown field `([^`]*)`")


def _validation(_: Request[Any, Any, Any], exc: ValidationException) -> Response[ErrorBody]:
    """Litestar's own body validation (msgspec underneath), reworded like ours."""
    extra = exc.extra if isinstance(exc.extra, list) else []
    if extra and isinstance(extra[0], dict):
        first = extra[0]
        message, key = str(first.get("message", exc.detail)), str(first.get("key") or "")
        where = first.get("source") or "body"
        source = str(getattr(where, "value", where))   # Litestar's ParamType, a str enum
        if source in ("path", "query"):
            # A parameter: its name, and its rule in words (``llmgw.api.params``).
            return error_response(400, "invalid_request",
                                  f"{source} parameter {key}: {explain(message)}", key or None)
        if key == "data" or key.startswith("data."):
            key = key[5:]  # Litestar names the body parameter; the body is the root
        unknown = _UNKNOWN.match(message)
        if unknown:
            field = unknown.group(1)
            # Only a key's limits lack the team-wide fields (``llmgw.tenancy.KeyLimits``).
            message = ("set on the team, for all its keys; a key cannot set it"
                       if key == "limits" and field in TEAM_WIDE else
                       "unknown field; check the spelling against the documented keys")
            key = f"{key}.{field}" if key else field
        if message == "'data'" and not key:
            # Litestar's word for a handler's body that was not sent at all.
            return error_response(400, "invalid_request", EMPTY_BODY)
        where = f"request body: {key}" if key else "request body"
        return error_response(400, "invalid_request", f"{where}: {explain(message)}",
                              key or None)
    return error_response(400, "invalid_request", f"request body: {exc.detail}")


def _http(_: Request[Any, Any, Any], exc: HTTPException) -> Response[ErrorBody]:
    kind = {401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed",
            413: "request_too_large"}.get(exc.status_code, "http_error")
    message = exc.detail
    if exc.status_code == 413:
        message = "request body too large; a model definition is a few kilobytes"
    return error_response(exc.status_code, kind, message, headers=exc.headers)


def _internal(request: Request[Any, Any, Any], exc: Exception) -> Response[ErrorBody]:
    log.exception("unexpected error serving %s %s", request.method, request.url.path,
                  exc_info=exc)
    return error_response(500, "internal_error",
                          "internal error; the server's log has the traceback")


exception_handlers: dict[int | type[Exception], Any] = {
    LlmgwError: _llmgw,
    ValidationException: _validation,
    HTTPException: _http,
    Exception: _internal,
}
