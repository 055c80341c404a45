"""``/v1/files``: upload (purpose ``batch``), list, retrieve, download and delete, in the store.

An upload is read as it arrives (``multipart``) and its file part written
to the store in chunks of ``store.base.CHUNK_SIZE`` (why the store rather
than a directory: ``llmgw.store.base``), so at most one chunk of it is in
memory. It is bounded by ``gateway.max_file_size`` (413 past it, the chunks
written so far deleted). The file becomes visible when its last chunk is
written; one that was never finished is purged by the batch worker's
housekeeping.

A file belongs to the API key that uploaded it — its immutable id, never its
name (``keys.ApiKey.owner``, the one place that says what an owner is);
another key does not see it. Batch output and error files belong to the
batch's owner.

A file may expire: ``expires_after`` on the upload (OpenAI's
``{"anchor": "created_at", "seconds": N}``, N from one hour to 30 days), or
the ``output_expires_after`` of the batch that wrote it. Past ``expires_at``
it is neither found nor listed, and the batch worker's housekeeping deletes
it.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import time
from typing import Any
from urllib.parse import parse_qs

import msgspec

from llmgw.errors import LlmgwError, NotFoundError, StoreUnavailableError
from llmgw.gateway.errors import (
    BodyTooLargeError,
    ClientGone,
    InvalidRequestError,
    MethodNotAllowedError,
    Receive,
    Scope,
    Send,
    UnknownPathError,
    send_error,
)
from llmgw.gateway.exchange import Core
from llmgw.gateway.multipart import MultipartReader, PartData, PartEnd, PartHead, boundary_of
from llmgw.gateway.request import header
from llmgw.gateway.requestid import tagged
from llmgw.store.base import CHUNK_SIZE, FileRecord, OwnerId, Store

log = tagged(logging.getLogger("llmgw.gateway.files"))

PURPOSES = ("batch",)
# OpenAI's bounds on expires_after.seconds (FileExpirationAfter, BatchFileExpirationAfter).
MIN_EXPIRY = 3600
MAX_EXPIRY = 30 * 86400
# GET /v1/files: OpenAI's default and largest page.
MAX_LIST = 10_000
_encode = msgspec.json.Encoder().encode
# A form's own bytes (boundaries, part headers, the purpose field) on top of the file.
_FORM_OVERHEAD = 64 * 1024


class MissingFileError(NotFoundError):
    code = "file_not_found"


def new_file_id() -> str:
    """A unique id that sorts by creation time: files are listed by (created_at, id), and
    several are created within one second."""
    return f"file-{time.time_ns():016x}{secrets.token_hex(6)}"


def file_object(record: FileRecord) -> dict[str, Any]:
    """The File object; ``expires_at`` only when the file expires (OpenAI's schema types it
    an integer, never null)."""
    out: dict[str, Any] = {"id": record.id, "object": "file", "bytes": record.bytes,
                           "created_at": record.created_at, "filename": record.filename,
                           "purpose": record.purpose, "status": "processed"}
    if record.expires_at is not None:
        out["expires_at"] = record.expires_at
    return out


class ExpiresAfter(msgspec.Struct, forbid_unknown_fields=True):
    """OpenAI's ``expires_after``: ``seconds`` after the file's ``created_at``."""

    anchor: str
    seconds: int

    def expires_at(self, created_at: int, field: str) -> int:
        if self.anchor != "created_at":
            raise InvalidRequestError(f"{field}.anchor: must be 'created_at'",
                                      field=f"{field}.anchor")
        if not MIN_EXPIRY <= self.seconds <= MAX_EXPIRY:
            raise InvalidRequestError(
                f"{field}.seconds: must be from {MIN_EXPIRY} (one hour) to {MAX_EXPIRY} "
                "(30 days)", field=f"{field}.seconds")
        return created_at + self.seconds


def not_found(id: str) -> MissingFileError:
    return MissingFileError(f"file {id!r} does not exist (or was uploaded with another "
                              "API key)", field="file_id")


async def _send_json(send: Send, body: bytes) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class FileWriter:
    """Writes a file into the store chunk by chunk; ``abort`` removes what was written."""

    def __init__(self, store: Store, record: FileRecord) -> None:
        self.store = store
        self.record = record
        self.size = 0
        self._buf = bytearray()
        self._seq = 0
        self._created = False

    async def write(self, data: bytes) -> None:
        if not self._created:
            await self.store.create_file(self.record)
            self._created = True
        self._buf += data
        self.size += len(data)
        while len(self._buf) >= CHUNK_SIZE:
            piece = bytes(self._buf[:CHUNK_SIZE])
            await self.store.put_file_chunk(self.record.id, self._seq, piece)
            del self._buf[:CHUNK_SIZE]
            self._seq += 1

    async def finish(self) -> FileRecord:
        if not self._created:
            await self.store.create_file(self.record)
            self._created = True
        if self._buf:
            await self.store.put_file_chunk(self.record.id, self._seq, bytes(self._buf))
            self._buf.clear()
            self._seq += 1
        await self.store.finish_file(self.record.id, self.size, self.record.expires_at)
        return msgspec.structs.replace(self.record, bytes=self.size, status="processed")

    async def abort(self) -> None:
        if self._created:
            with contextlib.suppress(StoreUnavailableError):
                await self.store.delete_file(self.record.id, None)


class FilesEndpoint:
    def __init__(self, core: Core) -> None:
        self.core = core

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._dispatch(scope, receive, send)
        except LlmgwError as err:
            await send_error(send, err)
        except ClientGone:
            pass

    async def _dispatch(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        method: str = scope["method"]
        if path == "/v1/files":
            if method == "POST":
                await self._upload(scope, receive, send)
            elif method == "GET":
                await self._list(scope, send)
            else:
                raise MethodNotAllowedError(method, path, ("GET", "POST"))
            return
        id, _, rest = path[len("/v1/files/"):].partition("/")
        if not id or rest not in ("", "content"):
            raise UnknownPathError(f"{method} {path}: not an endpoint of this gateway (it "
                                   "serves /v1/files, /v1/files/{id} and /v1/files/{id}/content)")
        allowed = ("GET",) if rest else ("GET", "DELETE")
        if method not in allowed:
            raise MethodNotAllowedError(method, path, allowed)
        owner = self.core.authenticate(scope["headers"]).owner
        store = self.core.state
        if method == "DELETE":
            if not await store.delete_file(id, owner):
                raise not_found(id)
            await _send_json(send, _encode({"id": id, "object": "file", "deleted": True}))
            return
        record = await store.get_file(id, owner)
        if record is None:
            raise not_found(id)
        if not rest:
            await _send_json(send, _encode(file_object(record)))
            return
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"application/octet-stream"),
            (b"content-length", str(record.bytes).encode())]})
        seq = 0
        while True:
            chunks = await store.read_file_chunks(id, seq, 2)
            if not chunks:
                break
            seq += len(chunks)
            for chunk in chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    async def _list(self, scope: Scope, send: Send) -> None:
        """The caller's files, a page at a time, as OpenAI lists them: ``purpose``, ``limit``
        (1 to 10,000, all of them by default), ``order`` (``desc`` by default) and ``after``."""
        owner = self.core.authenticate(scope["headers"]).owner
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        limit = page_limit(query, default=MAX_LIST, most=MAX_LIST)
        ascending = page_order(query) == "asc"
        after = query.get("after", [None])[0] or None
        purpose = query.get("purpose", [None])[0] or None
        rows = await self.core.state.list_files(owner, purpose=purpose, after=after,
                                                limit=limit + 1, ascending=ascending)
        await _send_json(send, _encode(page([file_object(r) for r in rows], limit)))

    async def _upload(self, scope: Scope, receive: Receive, send: Send) -> None:
        key = self.core.check_key(scope["headers"], self.core.now())
        ctype = header(scope["headers"], b"content-type")
        boundary = boundary_of(ctype.decode("latin-1") if ctype else None)
        if boundary is None:
            raise InvalidRequestError("POST /v1/files takes multipart/form-data: the file as "
                                      "the field 'file' and its purpose as 'purpose'")
        limit = int(self.core.config.gateway.max_file_size)
        declared = header(scope["headers"], b"content-length")
        if declared is not None and declared.isdigit() and \
                int(declared) > limit + _FORM_OVERHEAD:
            raise BodyTooLargeError(_too_large(int(declared), limit))
        upload = _Upload(self.core.state, key.owner, limit)
        try:
            record = await upload.read(receive, MultipartReader(boundary))
        except BaseException:
            await upload.abort()
            raise
        log.info("file %s (%d bytes) uploaded by key %r", record.id, record.bytes, key.name)
        await _send_json(send, _encode(file_object(record)))


class _Upload:
    """One file upload being read: the form's fields, and the file written as it comes."""

    def __init__(self, store: Store, owner: OwnerId, limit: int) -> None:
        self.store = store
        self.owner = owner
        self.limit = limit
        self.writer: FileWriter | None = None
        self.purpose = b""
        # expires_after[anchor] and expires_after[seconds], as the openai clients send them.
        self.expiry: dict[str, bytes] = {}
        self._field: str | None = None
        self._in_file = False

    async def abort(self) -> None:
        if self.writer is not None:
            await self.writer.abort()

    async def read(self, receive: Receive, reader: MultipartReader) -> FileRecord:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientGone("the client went away while uploading")
            for event in reader.feed(message.get("body", b"")):
                await self._event(event)
            if not message.get("more_body", False):
                break
        reader.close()
        if self.writer is None:
            raise InvalidRequestError("file: the form has no file part named 'file'",
                                      field="file")
        text = self.purpose.decode("utf-8", "replace").strip()
        if text not in PURPOSES:
            raise InvalidRequestError(
                f"purpose: {text!r} is not accepted here; this gateway stores files for "
                f"{', '.join(repr(p) for p in PURPOSES)} only", field="purpose")
        if self.expiry:
            record = self.writer.record
            self.writer.record = msgspec.structs.replace(
                record, expires_at=_form_expiry(self.expiry).expires_at(
                    record.created_at, "expires_after"))
        return await self.writer.finish()

    async def _event(self, event: PartHead | PartData | PartEnd) -> None:
        if isinstance(event, PartHead):
            self._field = event.name
            self._in_file = event.filename is not None and event.name == "file"
            if self._in_file:
                if self.writer is not None:
                    raise InvalidRequestError("file: the form has two files; upload one at a "
                                              "time", field="file")
                self.writer = FileWriter(self.store, FileRecord(
                    id=new_file_id(), owner=self.owner, purpose="batch",
                    filename=event.filename or "upload.jsonl", bytes=0,
                    created_at=int(time.time())))
        elif isinstance(event, PartData):
            if self._in_file and self.writer is not None:
                size = self.writer.size + len(event.data)
                if size > self.limit:
                    raise BodyTooLargeError(_too_large(size, self.limit))
                await self.writer.write(event.data)
            elif self._field == "purpose":
                self.purpose += event.data[:64]
            elif self._field in _EXPIRY_FIELDS:
                name = _EXPIRY_FIELDS[self._field]
                self.expiry[name] = (self.expiry.get(name, b"") + event.data)[:64]
        else:
            self._field, self._in_file = None, False


_EXPIRY_FIELDS = {"expires_after[anchor]": "anchor", "expires_after[seconds]": "seconds"}


def _form_expiry(fields: dict[str, bytes]) -> ExpiresAfter:
    anchor = fields.get("anchor", b"").decode("utf-8", "replace").strip()
    seconds = fields.get("seconds", b"").decode("utf-8", "replace").strip()
    if not seconds.isdigit():
        raise InvalidRequestError("expires_after.seconds: a whole number of seconds is required",
                                  field="expires_after.seconds")
    return ExpiresAfter(anchor=anchor, seconds=int(seconds))


def page_limit(query: dict[str, list[str]], *, default: int, most: int) -> int:
    """A list's ``limit`` query parameter, 1 to ``most``."""
    text = query.get("limit", [None])[0]
    if text is None:
        return default
    if not text.isdigit() or not 1 <= int(text) <= most:
        raise InvalidRequestError(f"limit: must be a whole number from 1 to {most:,}",
                                  field="limit")
    return int(text)


def page_order(query: dict[str, list[str]]) -> str:
    """A list's ``order`` query parameter: ``asc`` or ``desc`` (the default)."""
    order = query.get("order", ["desc"])[0]
    if order not in ("asc", "desc"):
        raise InvalidRequestError("order: must be asc or desc", field="order")
    return order


def page(data: list[dict[str, Any]], limit: int) -> dict[str, Any]:
    """OpenAI's list object for ``data`` fetched with one more than ``limit``.

    ``first_id`` and ``last_id`` are null on an empty page, as OpenAI answers
    (its schema requires them as strings, which no empty page can satisfy).
    """
    shown = data[:limit]
    return {"object": "list", "data": shown,
            "first_id": shown[0]["id"] if shown else None,
            "last_id": shown[-1]["id"] if shown else None,
            "has_more": len(data) > limit}


def _too_large(size: int, limit: int) -> str:
    return (f"the file ({size} bytes or more) is over this gateway's limit of {limit} bytes "
            "(gateway.max_file_size)")
