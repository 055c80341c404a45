"""What a GET or HEAD of one mirror file answers: status, headers and body layout.

A pure decision over the request's headers and the file's facts (size,
modification time, identity), with no I/O, so every Range and precondition
case is tested without a socket. The server (``llmgw.weights.mirror.server``) only
carries out the plan: literal bytes are written, file slices are handed to
``sendfile``.

Order of evaluation follows RFC 9110 §13.2.2: If-Match, If-Unmodified-Since
(412), If-None-Match, If-Modified-Since (304), then If-Range and Range.

Two choices where the RFC leaves room:

- A Range header in the ``bytes`` unit that does not parse is answered 416
  rather than ignored. The RFC allows either; a client that asked for a
  malformed range has a bug, and answering with the whole (often 100 GB) file
  hides it at great cost. A range in a unit we do not know is ignored, as the
  RFC requires.
- Many ranges, or ranges whose total exceeds the file (overlaps used to
  amplify a small request into a huge answer), are answered with the whole
  file (200). That bounds the work of one request by the file's size.
"""

from __future__ import annotations

import email.utils
from collections.abc import Mapping
from datetime import UTC

import msgspec

# More ranges than this in one request are served as the whole file.
MAX_RANGES = 64


class FileFacts(msgspec.Struct, frozen=True, kw_only=True):
    """What the plan needs to know about a file."""

    size: int
    mtime: float          # seconds since the epoch
    etag: str             # a strong validator, quoted: '"…"'
    content_type: str = "application/octet-stream"


class Slice(msgspec.Struct, frozen=True):
    """``length`` bytes of the file starting at ``offset``."""

    offset: int
    length: int


class Answer(msgspec.Struct, frozen=True, kw_only=True):
    """The response to send. ``body`` alternates literal bytes and file slices."""

    status: int
    headers: dict[str, str]
    body: list[bytes | Slice] = []

    @property
    def length(self) -> int:
        return sum(len(p) if isinstance(p, bytes) else p.length for p in self.body)


def make_etag(inode: int, size: int, mtime_ns: int) -> str:
    """A strong ETag: a mirror file never changes in place, so identity + size + time
    name one content; a replaced file gets a new inode or time."""
    return f'"{inode:x}-{size:x}-{mtime_ns:x}"'


def http_date(ts: float) -> str:
    return email.utils.formatdate(ts, usegmt=True)


def _parse_date(value: str) -> float | None:
    try:
        parsed = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def _etags(value: str) -> list[str]:
    """The entity tags of an If-Match / If-None-Match list ('*' kept as is)."""
    return [t.strip() for t in value.split(",") if t.strip()]


def _weak_match(a: str, b: str) -> bool:
    return a.removeprefix("W/") == b.removeprefix("W/")


def _strong_match(a: str, b: str) -> bool:
    return not a.startswith("W/") and not b.startswith("W/") and a == b


class RangeError(ValueError):
    """The Range header is malformed or unsatisfiable; the message says which."""


def parse_range(value: str, size: int) -> list[tuple[int, int]] | None:
    """The satisfiable byte ranges (inclusive start, end) of a Range header.

    None means the header is to be ignored (an unknown unit). RangeError means
    416: malformed, or no range overlaps the file.
    """
    unit, sep, spec = value.partition("=")
    if not sep:
        raise RangeError(f"malformed Range header {value!r}: expected bytes=FIRST-LAST")
    if unit.strip().lower() != "bytes":
        return None
    out: list[tuple[int, int]] = []
    specs = [s.strip() for s in spec.split(",")]
    if not any(specs):
        raise RangeError(f"malformed Range header {value!r}: no range given")
    for item in specs:
        if not item:
            continue  # RFC 9110 allows empty list elements
        first, dash, last = item.partition("-")
        first, last = first.strip(), last.strip()
        if not dash or not (first.isdigit() or first == "") or not (last.isdigit() or last == ""):
            raise RangeError(f"malformed range {item!r} in {value!r}")
        if first == "":
            if last == "":
                raise RangeError(f"malformed range {item!r} in {value!r}")
            suffix = int(last)
            if suffix == 0 or size == 0:
                continue
            out.append((max(0, size - suffix), size - 1))
            continue
        start = int(first)
        end = int(last) if last else size - 1
        if last and end < start:
            raise RangeError(f"malformed range {item!r} in {value!r}: last before first")
        if start >= size:
            continue  # unsatisfiable on its own; others may still be served
        out.append((start, min(end, size - 1)))
    if not out:
        raise RangeError(f"range {value!r} is not satisfiable: the file has {size} bytes")
    return out


def _preconditions(method: str, headers: Mapping[str, str], facts: FileFacts,
                   base: dict[str, str]) -> Answer | None:
    if (im := headers.get("if-match")) is not None:
        tags = _etags(im)
        if "*" not in tags and not any(_strong_match(t, facts.etag) for t in tags):
            return Answer(status=412, headers=base)
    elif (ius := headers.get("if-unmodified-since")) is not None:
        when = _parse_date(ius)
        if when is not None and int(facts.mtime) > when:
            return Answer(status=412, headers=base)
    if (inm := headers.get("if-none-match")) is not None:
        tags = _etags(inm)
        if "*" in tags or any(_weak_match(t, facts.etag) for t in tags):
            return Answer(status=304, headers=base)
    elif (ims := headers.get("if-modified-since")) is not None and method in ("GET", "HEAD"):
        when = _parse_date(ims)
        if when is not None and int(facts.mtime) <= when:
            return Answer(status=304, headers=base)
    return None


def _if_range_holds(value: str, facts: FileFacts) -> bool:
    value = value.strip()
    if value.startswith(('"', "W/")):
        return _strong_match(value, facts.etag)
    when = _parse_date(value)
    # A date validates only when it is exactly the Last-Modified we would send.
    return when is not None and when == float(int(facts.mtime))


def plan(method: str, headers: Mapping[str, str], facts: FileFacts, *,
         boundary: str) -> Answer:
    """The answer to ``method`` (GET or HEAD) for a file with ``facts``.

    ``headers`` is keyed by lower-case name. ``boundary`` separates the parts
    of a multipart/byteranges answer; the caller draws it at random.
    """
    base = {
        "Accept-Ranges": "bytes",
        "ETag": facts.etag,
        "Last-Modified": http_date(facts.mtime),
    }
    early = _preconditions(method, headers, facts, base)
    if early is not None:
        return early

    ranges: list[tuple[int, int]] | None = None
    if (rng := headers.get("range")) is not None and (
        (if_range := headers.get("if-range")) is None or _if_range_holds(if_range, facts)
    ):
        try:
            ranges = parse_range(rng, facts.size)
        except RangeError as exc:
            return Answer(
                status=416,
                headers={**base, "Content-Range": f"bytes */{facts.size}",
                         "Content-Type": "text/plain; charset=utf-8"},
                body=[f"{exc}\n".encode()],
            )
        if ranges is not None and (
            len(ranges) > MAX_RANGES or sum(e - s + 1 for s, e in ranges) > facts.size
        ):
            ranges = None

    if ranges is None:
        return Answer(status=200, headers={**base, "Content-Type": facts.content_type},
                      body=[Slice(0, facts.size)] if facts.size else [])
    if len(ranges) == 1:
        start, end = ranges[0]
        return Answer(
            status=206,
            headers={**base, "Content-Type": facts.content_type,
                     "Content-Range": f"bytes {start}-{end}/{facts.size}"},
            body=[Slice(start, end - start + 1)],
        )
    body: list[bytes | Slice] = []
    for i, (start, end) in enumerate(ranges):
        lead = "" if i == 0 else "\r\n"
        body.append(
            (f"{lead}--{boundary}\r\n"
             f"Content-Type: {facts.content_type}\r\n"
             f"Content-Range: bytes {start}-{end}/{facts.size}\r\n\r\n").encode()
        )
        body.append(Slice(start, end - start + 1))
    body.append(f"\r\n--{boundary}--\r\n".encode())
    return Answer(
        status=206,
        headers={**base, "Content-Type": f"multipart/byteranges; boundary={boundary}"},
        body=body,
    )
