"""Batch files and batch objects in OpenAI's format: pure functions, no I/O.

An input file is JSONL, one request per line::

    {"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions", "body": {...}}

It is read as a stream (``LineSplitter``), never whole: a line is at most
``max_line`` bytes (the gateway's request body limit) and a longer one is
reported as such rather than buffered. Each line's ``body`` stays the bytes
the client wrote (``msgspec.Raw``) and is sent to the engine as it is.

Two kinds of bad line, treated differently, as OpenAI does:

* a line that is not a request at all (not JSON, no ``custom_id``, no
  object ``body``, ``stream: true``) is *malformed*: it fails on its own,
  into the error file, and the rest of the batch runs;
* a well-formed line that names an endpoint other than the batch's, a model
  that does not exist, that the owner's key may not use or that cannot serve
  the endpoint fails *validation*: the whole batch is refused before any
  request runs, with the line numbers, because running the rest of a batch
  whose author made a systematic mistake wastes the GPU time it was saving.

Output lines (``{"id", "custom_id", "response": {"status_code",
"request_id", "body"}, "error": null}``) go to the output file when the
status is 2xx and to the error file otherwise; a line that never got an
answer (malformed, expired, cancelled) has ``response: null`` and an
``error`` with a code.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import msgspec

from llmgw.gateway.errors import InvalidRequestError
from llmgw.gateway.request import RequestHead
from llmgw.store.base import BatchRow

# Endpoints a batch may target: those whose answer is one JSON object.
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses",
             "/v1/rerank", "/v1/score")
FINAL = frozenset({"completed", "failed", "expired", "cancelled"})
# Validation errors kept on a failed batch; a file with a systematic mistake
# would otherwise carry one per line.
MAX_ERRORS = 100

_encode = msgspec.json.Encoder().encode


class TooLong:
    """A line longer than the limit: its content was skipped, not kept."""

    __slots__ = ("size",)

    def __init__(self, size: int) -> None:
        self.size = size


class LineSplitter:
    """Splits a byte stream into numbered lines (1-based), holding at most one line."""

    def __init__(self, max_line: int) -> None:
        self.max_line = max_line
        self._buf = b""
        self._skipped = 0          # bytes dropped of the current over-long line
        self.number = 0

    def feed(self, chunk: bytes) -> Iterator[tuple[int, bytes | TooLong]]:
        buf = self._buf + chunk if self._buf else chunk
        start = 0
        while (end := buf.find(b"\n", start)) >= 0:
            self.number += 1
            if self._skipped:
                yield self.number, TooLong(self._skipped + end - start)
                self._skipped = 0
            elif end - start > self.max_line:
                yield self.number, TooLong(end - start)
            else:
                yield self.number, buf[start:end]
            start = end + 1
        rest = buf[start:]
        if self._skipped or len(rest) > self.max_line:
            self._skipped += len(rest)
            rest = b""
        self._buf = rest

    def finish(self) -> Iterator[tuple[int, bytes | TooLong]]:
        """The last line, if the stream did not end with a newline."""
        if self._skipped:
            self.number += 1
            yield self.number, TooLong(self._skipped)
        elif self._buf.strip():
            self.number += 1
            yield self.number, self._buf
        self._buf = b""
        self._skipped = 0


class BatchLine(msgspec.Struct):
    custom_id: str
    url: str
    body: msgspec.Raw
    method: str = "POST"


class Request(msgspec.Struct, frozen=True):
    """A line that is a well-formed request: where it goes and what it asks."""

    custom_id: str
    url: str
    method: str
    model: str
    body: bytes


class Malformed(msgspec.Struct, frozen=True):
    custom_id: str | None
    message: str


_line_decoder = msgspec.json.Decoder(BatchLine)
_head_decoder = msgspec.json.Decoder(RequestHead)
_custom_id = msgspec.json.Decoder(dict[str, Any])


def parse_line(number: int, data: bytes | TooLong) -> Request | Malformed | None:
    """A line as a request, a malformed line, or None for a blank line."""
    if isinstance(data, TooLong):
        return Malformed(None, f"line {number} is {data.size} bytes, over the limit of a "
                               "request body (gateway.max_body_size)")
    if not data.strip():
        return None
    try:
        line = _line_decoder.decode(data)
    except msgspec.ValidationError as exc:
        return Malformed(_guess_custom_id(data), f"line {number} is not a batch request: {exc}")
    except msgspec.DecodeError as exc:
        return Malformed(None, f"line {number} is not valid JSON: {exc}")
    body = bytes(line.body)
    try:
        head = _head_decoder.decode(body)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        return Malformed(line.custom_id, f"line {number}: body must be a JSON object with a "
                                         f"string model: {exc}")
    if head.stream:
        return Malformed(line.custom_id, f"line {number}: stream is not available in a batch; "
                                         "remove it")
    return Request(custom_id=line.custom_id, url=line.url, method=line.method.upper(),
                   model=head.model, body=body)


def _guess_custom_id(data: bytes) -> str | None:
    try:
        value = _custom_id.decode(data).get("custom_id")
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None
    return value if isinstance(value, str) else None


def check_endpoint(endpoint: str) -> None:
    if endpoint not in ENDPOINTS:
        raise InvalidRequestError(
            f"endpoint: {endpoint!r} cannot be batched here; use one of {', '.join(ENDPOINTS)}",
            field="endpoint")


# ---------------------------------------------------------------- result lines


def new_request_id() -> str:
    return f"batch_req_{secrets.token_hex(12)}"


def output_line(custom_id: str, status: int, body: bytes) -> bytes:
    """A line for the output file (2xx) or the error file (any other status)."""
    raw: Any = None
    if body:
        try:
            msgspec.json.decode(body)
            raw = msgspec.Raw(body)
        except msgspec.DecodeError:       # an engine's non-JSON answer is kept as text
            raw = body.decode("utf-8", "replace")
    response = {"status_code": status, "request_id": f"req_{secrets.token_hex(12)}",
                "body": raw}
    return _encode({"id": new_request_id(), "custom_id": custom_id, "response": response,
                    "error": None}) + b"\n"


def error_line(custom_id: str | None, code: str, message: str) -> bytes:
    """A line for the error file: a request that got no answer."""
    return _encode({"id": new_request_id(), "custom_id": custom_id, "response": None,
                    "error": {"code": code, "message": message}}) + b"\n"


# ---------------------------------------------------------------- the batch object


class BatchError(msgspec.Struct, frozen=True):
    code: str
    message: str
    line: int | None = None
    param: str | None = None


class BatchRecord(msgspec.Struct, kw_only=True):
    """A batch as the gateway keeps it; ``api`` is the object clients see."""

    id: str
    owner: str                  # the id of the API key that created it (OwnerId)
    endpoint: str
    input_file_id: str
    completion_window: str
    created_at: int
    expires_at: int
    status: str = "validating"
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    total: int = 0
    completed: int = 0
    failed: int = 0
    errors: list[BatchError] = []
    metadata: dict[str, str] | None = None
    # Seconds the output and error files are kept after they are written (None: always).
    output_expires_after: int | None = None
    # Every line up to this one has its result stored; the worker resumes after it.
    done_through: int = 0
    # The state the batch ends in once finalized (completed, cancelled, expired).
    outcome: str | None = None


# The Batch object's fields that are there only once they have a value: OpenAI's
# schema types each a string, an integer or an object, never null, and its clients
# read an absent one as None.
_UNTIL_SET = ("output_file_id", "error_file_id", "in_progress_at", "finalizing_at",
              "completed_at", "failed_at", "expired_at", "cancelling_at", "cancelled_at")


def api(record: BatchRecord) -> dict[str, Any]:
    """The Batch object as OpenAI's schema has it."""
    out: dict[str, Any] = {
        "id": record.id, "object": "batch", "endpoint": record.endpoint,
        "input_file_id": record.input_file_id, "completion_window": record.completion_window,
        "status": record.status, "created_at": record.created_at,
        "expires_at": record.expires_at,
        "request_counts": {"total": record.total, "completed": record.completed,
                           "failed": record.failed},
        "metadata": record.metadata,
    }
    if record.errors:
        out["errors"] = {"object": "list",
                         "data": [msgspec.to_builtins(e) for e in record.errors]}
    for name in _UNTIL_SET:
        value = getattr(record, name)
        if value is not None:
            out[name] = value
    return out


_record_decoder = msgspec.json.Decoder(BatchRecord)


def record_of(row: BatchRow) -> BatchRecord:
    """A stored batch's record; its owner is the row's (the column migrations rewrite)."""
    record = decode_record(row.record)
    record.owner = row.owner
    return record


def decode_record(data: bytes) -> BatchRecord:
    return _record_decoder.decode(data)


def encode_record(record: BatchRecord) -> bytes:
    return _encode(record)
