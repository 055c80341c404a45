"""``/v1/audio/transcriptions`` and ``/translations``: multipart uploads, spooled, then sent on.

The ``model`` is a form field, so the gateway must read into the body to
route it, and it may come after the file (``curl -F file=@a.wav -F
model=x``). The upload is therefore read as it arrives (``multipart``),
bounded by ``gateway.max_upload_size`` (413 past it), and every part but
``model`` is written to a spool file — in memory up to 1 MiB, on disk
beyond, never whole in memory. Each attempt at a replica then sends a form
made of a fresh ``model`` part (the engine's served name) followed by the
spool, streamed from the file in 64 KiB pieces.

Spooling rather than piping the client's bytes straight through costs one
copy on the local disk and buys two things: the model is known wherever it
appears, and a replica that fails is retried with the same upload on the
next (a piped body is gone once sent). It costs the client no latency it
would otherwise save: an engine transcribes only the whole file (vLLM's
handler reads it whole, ``await request.file.read()``, before it starts:
vllm/entrypoints/speech_to_text/transcription/api_router.py).

``/v1/audio/speech`` is a JSON request with a binary answer; it is an
ordinary inference path (``app.INFERENCE_PATHS``) whose audio the forwarder
streams back as it comes.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import AsyncIterator
from typing import IO

from llmgw.catalog.model import Model
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
from llmgw.gateway.exchange import Call, Core
from llmgw.gateway.multipart import (
    MultipartReader,
    PartData,
    PartEnd,
    PartHead,
    boundary_of,
    closing,
    encode_part,
    reencode_head,
)
from llmgw.gateway.proxy import ForwardRequest
from llmgw.gateway.request import header

PATHS = frozenset({"/v1/audio/transcriptions", "/v1/audio/translations"})
# Kept in memory below this; a larger upload goes to a temporary file.
SPOOL_IN_MEMORY = 1024 * 1024
_READ = 64 * 1024
# Short fields (model, language, response_format…) are read whole; a longer
# one is not a form field this endpoint has.
_MAX_FIELD = 4096


class AudioEndpoint:
    def __init__(self, core: Core) -> None:
        self.core = core

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        if path not in PATHS:
            await send_error(send, UnknownPathError(
                f"{scope['method']} {path}: not an endpoint of this gateway (it serves POST "
                "/v1/audio/transcriptions, /v1/audio/translations and /v1/audio/speech)"))
            return
        upload = Upload(self.core, path)
        try:
            await self.core.inference(scope, receive, send, path, upload)
        finally:
            upload.close()


class Upload:
    """One audio upload: admitted by reading and spooling its form."""

    def __init__(self, core: Core, path: str) -> None:
        self.core = core
        self.path = path
        # Closed by close() when the request has ended, not at the end of a block.
        self.spool: IO[bytes] = tempfile.SpooledTemporaryFile(  # noqa: SIM115
            max_size=SPOOL_IN_MEMORY)
        self.size = 0
        self._lock = asyncio.Lock()

    def close(self) -> None:
        self.spool.close()

    async def admit(self, scope: Scope, receive: Receive, send: Send, started: float,
                    call: Call) -> tuple[ForwardRequest, list[Model], Send]:
        if scope["method"] != "POST":
            raise MethodNotAllowedError(scope["method"], self.path, ("POST",))
        key = call.key = self.core.check_key(scope["headers"], started)
        ctype = header(scope["headers"], b"content-type")
        boundary = boundary_of(ctype.decode("latin-1") if ctype else None)
        if boundary is None:
            raise InvalidRequestError(
                f"{self.path} takes multipart/form-data (the audio as the field 'file', and "
                f"'model'); this request's Content-Type is "
                f"{ctype.decode('latin-1') if ctype else 'missing'}")
        fields = await self._read(scope, receive, boundary)
        name = fields.get("model")
        if not name:
            raise InvalidRequestError("model: the form has no 'model' field naming the model",
                                      field="model")
        chain = self.core.chain_for(name, key, self.path, call)
        assert call.metrics is not None
        adapter = self.core.catalog.adapters.get(name)
        served = adapter.name if adapter is not None else None
        call.request = ForwardRequest(
            path=self.path, body=b"", model=name, stream=fields.get("stream") == "true",
            headers=scope["headers"], started=started, metrics=call.metrics,
            priority=key.priority, team=key.team, adapter=adapter,
            variant=lambda model: (self.path, self._body(boundary, model, served)))
        return call.request, chain, send

    async def _read(self, scope: Scope, receive: Receive, boundary: bytes) -> dict[str, str]:
        """Spool every part but the short fields' values, which are returned."""
        limit = int(self.core.config.gateway.max_upload_size)
        declared = header(scope["headers"], b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise BodyTooLargeError(_too_large(int(declared), limit))
        reader = MultipartReader(boundary)
        fields: dict[str, str] = {}
        field: str | None = None           # the short field being read, if any
        value = b""
        pending: list[bytes] = []
        received = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientGone("the client went away while uploading")
            chunk: bytes = message.get("body", b"")
            received += len(chunk)
            if received > limit:
                raise BodyTooLargeError(_too_large(received, limit))
            for event in reader.feed(chunk):
                if isinstance(event, PartHead):
                    if event.filename is None:
                        field, value = event.name, b""
                    else:
                        field = None
                        pending.append(reencode_head(boundary, event))
                elif isinstance(event, PartData):
                    if field is not None:
                        value += event.data
                        if len(value) > _MAX_FIELD:
                            raise InvalidRequestError(
                                f"{field}: a form field of over {_MAX_FIELD} bytes; only the "
                                "audio goes in a file part", field=field)
                    else:
                        pending.append(event.data)
                elif isinstance(event, PartEnd):
                    if field is not None:
                        fields[field] = value.decode("utf-8", "replace")
                        if field != "model":
                            pending.append(encode_part(boundary, field, value))
                        field = None
                    else:
                        pending.append(b"\r\n")
            if sum(map(len, pending)) >= _READ:
                await self._write(pending)
                pending = []
            if not message.get("more_body", False):
                break
        reader.close()
        pending.append(closing(boundary))
        await self._write(pending)
        return fields

    async def _write(self, pieces: list[bytes]) -> None:
        data = b"".join(pieces)
        self.size += len(data)
        if self.size > SPOOL_IN_MEMORY:
            await asyncio.to_thread(self.spool.write, data)   # on disk: off the event loop
        else:
            self.spool.write(data)

    async def _body(self, boundary: bytes, model: Model, served: str | None = None
                    ) -> AsyncIterator[bytes]:
        """The form for ``model``: its served name (``served``: an adapter's) as ``model``,
        then the spooled parts."""
        yield encode_part(boundary, "model", (served or model.engine_model_name).encode())
        async with self._lock:    # attempts are sequential; the lock keeps one reader
            offset = 0
            while offset < self.size:
                piece = await asyncio.to_thread(_read_at, self.spool, offset)
                if not piece:
                    break
                offset += len(piece)
                yield piece


def _read_at(spool: IO[bytes], offset: int) -> bytes:
    spool.seek(offset, os.SEEK_SET)
    return spool.read(_READ)


def _too_large(size: int, limit: int) -> str:
    return (f"the upload ({size} bytes) is over this gateway's limit of {limit} bytes "
            "(gateway.max_upload_size)")
