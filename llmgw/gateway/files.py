"""``/v1/files``: upload (purpose ``batch``), retrieve, download and delete, kept in the store.

An upload is read as it arrives (``multipart``) and its file part written
to the store in chunks of ``store.base.CHUNK_SIZE`` (why the store rather
than a directory: ``llmgw.store.base``), so at most one chunk of it is in
memory. It is bounded by ``gateway.max_file_size`` (413 past it, the chunks
written so far deleted). The file becomes visible when its last chunk is
written; one that was never finished is purged by the batch worker's
housekeeping.

A file belongs to the API key that uploaded it — its immutable id, never its
name (``keys.ApiKey.owner``); another key does not see it. Batch output
and error files belong to the batch's owner.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import time
from typing import Any

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
from llmgw.store.base import CHUNK_SIZE, FileRecord, OwnerId, Store

log = logging.getLogger("llmgw.gateway.files")

PURPOSES = ("batch",)
_encode = msgspec.json.Encoder().encode
# A form's own bytes (boundaries, part headers, the purpose field) on top of the file.
_FORM_OVERHEAD = 64 * 1024


class MissingFileError(NotFoundError):
    code = "file_not_found"


def new_file_id() -> str:
    return f"file-{secrets.token_hex(12)}"


def file_object(record: FileRecord) -> dict[str, Any]:
    return {"id": record.id, "object": "file", "bytes": record.bytes,
            "created_at": record.created_at, "filename": record.filename,
            "purpose": record.purpose, "status": "processed", "expires_at": None,
            "status_details": None}


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
        await self.store.finish_file(self.record.id, self.size)
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
            if method != "POST":
                raise MethodNotAllowedError(f"{method} {path}: use POST to upload a file")
            await self._upload(scope, receive, send)
            return
        id, _, rest = path[len("/v1/files/"):].partition("/")
        if not id or rest not in ("", "content"):
            raise UnknownPathError(f"{method} {path}: not an endpoint of this gateway (it "
                                   "serves /v1/files, /v1/files/{id} and /v1/files/{id}/content)")
        allowed = ("GET",) if rest else ("GET", "DELETE")
        if method not in allowed:
            raise MethodNotAllowedError(f"{method} {path}: use {' or '.join(allowed)}")
        key = self.core.authenticate(scope["headers"])
        store = self.core.state
        if method == "DELETE":
            if not await store.delete_file(id, key.owner):
                raise not_found(id)
            await _send_json(send, _encode({"id": id, "object": "file", "deleted": True}))
            return
        record = await store.get_file(id, key.owner)
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
        else:
            self._field, self._in_file = None, False


def _too_large(size: int, limit: int) -> str:
    return (f"the file ({size} bytes or more) is over this gateway's limit of {limit} bytes "
            "(gateway.max_file_size)")
