"""``/v1/batches``: create, retrieve, list and cancel; the work itself is ``batchworker``'s.

Creating a batch checks what can be checked at once (the endpoint can be
batched, the input file exists, belongs to the caller and is a batch file)
and records the batch as ``validating``; the worker — one across all
gateway instances — takes it from there. A batch belongs to the API key
that created it: its immutable id (``keys.ApiKey.owner``), so its lines
are billed to that key and its team, never to a later key of the same name.
``output_expires_after`` makes its output and error files expire that long
after they are written.

Cancelling moves a ``validating`` or ``in_progress`` batch to
``cancelling`` with a compare-and-set in the store, so it cannot be lost to
a state the worker writes at the same moment; the worker stops sending its
lines, lets those in flight finish, writes what was done to the output and
error files, and marks it ``cancelled``.
"""

from __future__ import annotations

import secrets
import time
from typing import Any, Protocol
from urllib.parse import parse_qs

import msgspec

from llmgw.catalog.decode import decode_json
from llmgw.catalog.units import Duration
from llmgw.errors import LlmgwError, NotFoundError, RefusedError, StoreUnavailableError
from llmgw.gateway.batchfile import (
    FINAL,
    BatchRecord,
    api,
    check_endpoint,
    encode_record,
    record_of,
)
from llmgw.gateway.errors import (
    InvalidRequestError,
    MethodNotAllowedError,
    Receive,
    Scope,
    Send,
    UnknownPathError,
    send_error,
)
from llmgw.gateway.exchange import Core
from llmgw.gateway.files import ExpiresAfter, page, page_limit
from llmgw.gateway.files import not_found as file_not_found
from llmgw.gateway.request import read_body
from llmgw.store.base import BatchRow, OwnerId

_encode = msgspec.json.Encoder().encode
MAX_WINDOW = 7 * 86400.0


class _Create(msgspec.Struct, forbid_unknown_fields=True):
    input_file_id: str
    endpoint: str
    completion_window: str = "24h"
    metadata: dict[str, str] | None = None
    output_expires_after: ExpiresAfter | None = None


class BatchNotFoundError(NotFoundError):
    code = "batch_not_found"


def _not_found(id: str) -> BatchNotFoundError:
    return BatchNotFoundError(f"batch {id!r} does not exist (or was created with another API "
                              "key)", field="batch_id")


def new_batch_id() -> str:
    """A unique id that sorts by creation time: batches are listed newest first by
    (created_at, id), and several are created within one second."""
    return f"batch_{time.time_ns():016x}{secrets.token_hex(6)}"


def row_of(record: BatchRecord) -> BatchRow:
    return BatchRow(id=record.id, owner=record.owner, status=record.status,
                    created_at=record.created_at, record=encode_record(record))


async def _send_json(send: Send, body: Any) -> None:
    data = _encode(body)
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})


class Wakeable(Protocol):
    """The batch worker, as this module needs it: told when there is work."""

    def wake(self) -> None: ...


class BatchesEndpoint:
    def __init__(self, core: Core, worker: Wakeable) -> None:
        self.core = core
        self.worker = worker

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._dispatch(scope, receive, send)
        except LlmgwError as err:
            await send_error(send, err)

    async def _dispatch(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        method: str = scope["method"]
        if path == "/v1/batches":
            if method == "POST":
                await self._create(scope, receive, send)
            elif method == "GET":
                await self._list(scope, send)
            else:
                raise MethodNotAllowedError(method, path, ("GET", "POST"))
            return
        id, _, rest = path[len("/v1/batches/"):].partition("/")
        if not id or rest not in ("", "cancel"):
            raise UnknownPathError(f"{method} {path}: not an endpoint of this gateway (it serves "
                                   "/v1/batches, /v1/batches/{id} and /v1/batches/{id}/cancel)")
        wanted = "POST" if rest else "GET"
        if method != wanted:
            raise MethodNotAllowedError(method, path, (wanted,))
        owner = self.core.authenticate(scope["headers"]).owner
        if rest:
            await _send_json(send, api(await self._cancel(id, owner)))
            return
        row = await self.core.state.get_batch(id, owner)
        if row is None:
            raise _not_found(id)
        await _send_json(send, api(record_of(row)))

    async def _create(self, scope: Scope, receive: Receive, send: Send) -> None:
        core = self.core
        key = core.check_key(scope["headers"], core.now())
        body = await read_body(scope["headers"], receive, int(core.config.gateway.max_body_size))
        request = decode_json(body, _Create)
        check_endpoint(request.endpoint)
        try:
            window = Duration.parse(request.completion_window)
        except ValueError as exc:
            raise InvalidRequestError(f"completion_window: {exc}",
                                      field="completion_window") from None
        if not 0 < window <= MAX_WINDOW:
            raise InvalidRequestError("completion_window: give a duration up to 7d (e.g. 24h)",
                                      field="completion_window")
        now = int(time.time())
        keep_for = None
        if request.output_expires_after is not None:
            after = request.output_expires_after
            keep_for = after.expires_at(now, "output_expires_after") - now
        owner = key.owner
        file = await core.state.get_file(request.input_file_id, owner)
        if file is None:
            raise file_not_found(request.input_file_id)
        if file.purpose != "batch":
            raise InvalidRequestError(
                f"input_file_id: file {file.id!r} has purpose {file.purpose!r}; upload the "
                "requests with purpose 'batch'", field="input_file_id")
        record = BatchRecord(
            id=new_batch_id(), owner=owner, endpoint=request.endpoint,
            input_file_id=file.id, completion_window=request.completion_window,
            created_at=now, expires_at=now + int(window), metadata=request.metadata,
            output_expires_after=keep_for)
        await core.state.create_batch(row_of(record))
        self.worker.wake()
        await _send_json(send, api(record))

    async def _list(self, scope: Scope, send: Send) -> None:
        owner = self.core.authenticate(scope["headers"]).owner
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        after = query.get("after", [None])[0] or None
        limit = page_limit(query, default=20, most=100)
        rows = await self.core.state.list_batches(owner, after, limit + 1)
        await _send_json(send, page([api(record_of(r)) for r in rows], limit))

    async def _cancel(self, id: str, owner: OwnerId) -> BatchRecord:
        store = self.core.state
        for _ in range(10):
            row = await store.get_batch(id, owner)
            if row is None:
                raise _not_found(id)
            record = record_of(row)
            if record.status == "cancelling":
                return record
            if record.status in FINAL or record.status == "finalizing":
                raise RefusedError(f"batch {id!r} is {record.status} and can no longer be "
                                   "cancelled")
            record.status = "cancelling"
            record.cancelling_at = int(time.time())
            if await store.update_batch(row_of(record), expect=row.status):
                self.worker.wake()
                return record
        raise StoreUnavailableError(f"batch {id!r} kept changing while it was being cancelled; "
                                    "try again")
