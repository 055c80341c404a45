"""An incremental ``multipart/form-data`` reader: fed pieces, it reports parts; no I/O.

Uploads (audio for transcription, files for batches) are read as they
arrive and never held whole: the reader keeps at most one part's header
block and the few bytes that might be the start of a boundary; a part's
content is handed on piece by piece. It is a plain state machine over bytes
(RFC 7578 on RFC 2046's framing), so it is tested by feeding it bodies cut
at every position.

``encode_part`` writes a part back out, which is how a form is re-sent to an
engine with one field changed (the ``model``, which the engine knows by its
served name).
"""

from __future__ import annotations

from dataclasses import dataclass
from email.message import Message

from llmgw.gateway.errors import InvalidRequestError

MAX_HEADER_BLOCK = 16 * 1024


@dataclass(frozen=True, slots=True)
class PartHead:
    name: str
    filename: str | None
    content_type: str | None
    raw: bytes                      # the header block as sent, without the blank line


@dataclass(frozen=True, slots=True)
class PartData:
    data: bytes


@dataclass(frozen=True, slots=True)
class PartEnd:
    pass


Event = PartHead | PartData | PartEnd


def boundary_of(content_type: str | None) -> bytes | None:
    """The boundary of a ``multipart/form-data`` Content-Type, or None if it is not one."""
    if not content_type:
        return None
    message = Message()
    message["content-type"] = content_type
    if message.get_content_type() != "multipart/form-data":
        return None
    value = message.get_param("boundary")
    if not isinstance(value, str) or not 1 <= len(value) <= 70:
        return None
    return value.encode("latin-1")


def _malformed(detail: str) -> InvalidRequestError:
    return InvalidRequestError(f"the multipart/form-data body is malformed: {detail}")


def _head(raw: bytes) -> PartHead:
    message = Message()
    for line in raw.split(b"\r\n"):
        field, sep, value = line.partition(b":")
        if not sep:
            raise _malformed(f"part header line {line[:80]!r} has no ':'")
        message[field.decode("latin-1").strip()] = value.decode("utf-8", "replace").strip()
    disposition = message.get("content-disposition")
    if disposition is None:
        raise _malformed("a part has no Content-Disposition header")
    name = message.get_param("name", header="content-disposition")
    if not isinstance(name, str):
        raise _malformed("a part's Content-Disposition has no name")
    filename = message.get_param("filename", header="content-disposition")
    return PartHead(name=name, filename=filename if isinstance(filename, str) else None,
                    content_type=message.get("content-type"), raw=raw)


class MultipartReader:
    """Feed it the body in pieces; it returns the parts' heads, data and ends in order."""

    def __init__(self, boundary: bytes) -> None:
        self._delimiter = b"\r\n--" + boundary
        # The first boundary may open the body without a CRLF before it.
        self._buf = b"\r\n"
        self._state = "preamble"      # preamble, after, headers, data, done
        self.done = False

    def feed(self, chunk: bytes) -> list[Event]:
        self._buf += chunk
        events: list[Event] = []
        delimiter = self._delimiter
        while True:
            state = self._state
            if state in ("preamble", "data"):
                at = self._buf.find(delimiter)
                if at < 0:
                    # Keep what could be the start of a delimiter split across pieces.
                    keep = len(delimiter) - 1
                    if state == "data" and len(self._buf) > keep:
                        events.append(PartData(self._buf[:-keep]))
                        self._buf = self._buf[-keep:]
                    elif state == "preamble" and len(self._buf) > keep:
                        self._buf = self._buf[-keep:]
                    return events
                if state == "data" and at > 0:
                    events.append(PartData(self._buf[:at]))
                if state == "data":
                    events.append(PartEnd())
                self._buf = self._buf[at + len(delimiter):]
                self._state = "after"
            elif state == "after":
                if len(self._buf) < 2:
                    return events
                mark, self._buf = self._buf[:2], self._buf[2:]
                if mark == b"--":
                    self._state = "done"
                    self.done = True
                    self._buf = b""
                    return events
                if mark != b"\r\n":
                    raise _malformed("a boundary is followed by neither CRLF nor '--'")
                self._state = "headers"
            elif state == "headers":
                end = self._buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(self._buf) > MAX_HEADER_BLOCK:
                        raise _malformed(f"a part's headers exceed {MAX_HEADER_BLOCK} bytes")
                    return events
                events.append(_head(self._buf[:end]))
                self._buf = self._buf[end + 4:]
                self._state = "data"
            else:   # done: an epilogue is allowed and ignored
                self._buf = b""
                return events

    def close(self) -> None:
        """The body ended: raise if it ended before the closing boundary."""
        if not self.done:
            raise _malformed("the body ended before the closing boundary")


def encode_part(boundary: bytes, name: str, value: bytes, *, filename: str | None = None,
                content_type: str | None = None) -> bytes:
    """One part, from its opening boundary to the CRLF after its content."""
    disposition = f'form-data; name="{_quote(name)}"'
    if filename is not None:
        disposition += f'; filename="{_quote(filename)}"'
    head = f"Content-Disposition: {disposition}\r\n"
    if content_type:
        head += f"Content-Type: {content_type}\r\n"
    return b"--" + boundary + b"\r\n" + head.encode() + b"\r\n" + value + b"\r\n"


def reencode_head(boundary: bytes, head: PartHead) -> bytes:
    """The opening of ``head``'s part as it was sent: boundary, headers, blank line."""
    return b"--" + boundary + b"\r\n" + head.raw + b"\r\n\r\n"


def closing(boundary: bytes) -> bytes:
    return b"--" + boundary + b"--\r\n"


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')
