"""The pure decision behind every GET and HEAD of a mirror file (no sockets)."""

from __future__ import annotations

import pytest

from llmgw.weights.layout import parse_sidecar, request_parts
from llmgw.weights.mirror.answer import (
    MAX_RANGES,
    FileFacts,
    RangeError,
    Slice,
    http_date,
    parse_range,
    plan,
)

FACTS = FileFacts(size=1000, mtime=1_700_000_000.0, etag='"abc-3e8-1"')


def answer(**headers: str):  # type: ignore[no-untyped-def]
    return plan("GET", {k.replace("_", "-"): v for k, v in headers.items()}, FACTS,
                boundary="B")


def test_whole_file_without_range() -> None:
    """No Range: 200 with the whole file as one slice, and the validators."""
    a = answer()
    assert a.status == 200
    assert a.body == [Slice(0, 1000)]
    assert a.headers["ETag"] == FACTS.etag
    assert a.headers["Last-Modified"] == http_date(FACTS.mtime)
    assert a.headers["Accept-Ranges"] == "bytes"


@pytest.mark.parametrize(("spec", "want"), [
    ("bytes=0-99", (0, 99)),
    ("bytes=900-", (900, 999)),
    ("bytes=-100", (900, 999)),
    ("bytes=990-5000", (990, 999)),     # a last byte past the end is clamped
    ("bytes=-5000", (0, 999)),          # a suffix longer than the file is the file
])
def test_single_ranges(spec: str, want: tuple[int, int]) -> None:
    """Each single-range form answers 206 with the clamped span in Content-Range."""
    a = answer(range=spec)
    assert a.status == 206
    start, end = want
    assert a.body == [Slice(start, end - start + 1)]
    assert a.headers["Content-Range"] == f"bytes {start}-{end}/1000"


@pytest.mark.parametrize("spec", ["bytes=1000-", "bytes=5000-6000", "bytes=-0",
                                  "bytes=1000-,2000-"])
def test_ranges_past_the_end_are_416(spec: str) -> None:
    """A range starting at or past the end is unsatisfiable: 416 with bytes */size."""
    a = answer(range=spec)
    assert a.status == 416
    assert a.headers["Content-Range"] == "bytes */1000"
    assert b"not satisfiable" in a.body[0]  # type: ignore[operator]


@pytest.mark.parametrize("spec", ["bytes=abc", "bytes=5-1", "bytes=--1", "bytes=", "bytes",
                                  "bytes=1-2-3", "bytes=0x10-"])
def test_malformed_ranges_are_416(spec: str) -> None:
    """A malformed bytes range is answered 416 rather than with the whole file."""
    a = answer(range=spec)
    assert a.status == 416
    assert a.headers["Content-Range"] == "bytes */1000"


def test_unknown_range_unit_is_ignored() -> None:
    """A range in a unit the server does not know is ignored, as RFC 9110 requires."""
    assert answer(range="items=0-5").status == 200


def test_multiple_ranges_make_multipart_byteranges() -> None:
    """Two ranges answer multipart/byteranges with a part per range and exact framing."""
    a = answer(range="bytes=0-9,100-109")
    assert a.status == 206
    assert a.headers["Content-Type"] == "multipart/byteranges; boundary=B"
    slices = [p for p in a.body if isinstance(p, Slice)]
    assert slices == [Slice(0, 10), Slice(100, 10)]
    literal = b"".join(p for p in a.body if isinstance(p, bytes))
    assert literal.startswith(b"--B\r\n")
    assert b"Content-Range: bytes 0-9/1000" in literal
    assert b"\r\n--B\r\nContent-Type" in literal
    assert literal.endswith(b"\r\n--B--\r\n")
    assert a.length == sum(len(p) if isinstance(p, bytes) else p.length for p in a.body)


def test_partly_satisfiable_ranges_serve_the_satisfiable_part() -> None:
    """Of several ranges, those past the end are dropped; one left means a plain 206."""
    a = answer(range="bytes=0-9,5000-6000")
    assert a.status == 206
    assert a.body == [Slice(0, 10)]


def test_overlapping_ranges_that_amplify_are_served_whole() -> None:
    """Ranges summing to more than the file cannot amplify a request: 200 instead."""
    assert answer(range="bytes=0-999,0-999").status == 200
    many = ",".join(f"{i}-{i}" for i in range(MAX_RANGES + 1))
    assert answer(range=f"bytes={many}").status == 200


def test_if_range_with_matching_etag_keeps_the_range() -> None:
    """If-Range naming the current ETag lets the range through (a resume continues)."""
    assert answer(range="bytes=10-", if_range=FACTS.etag).status == 206


def test_if_range_with_another_etag_sends_the_whole_file() -> None:
    """If-Range naming an old ETag answers 200: a changed file is never spliced."""
    assert answer(range="bytes=10-", if_range='"old"').status == 200
    assert answer(range="bytes=10-", if_range=f"W/{FACTS.etag}").status == 200


def test_if_range_with_a_date() -> None:
    """If-Range with exactly the Last-Modified date holds; another date does not."""
    assert answer(range="bytes=10-", if_range=http_date(FACTS.mtime)).status == 206
    assert answer(range="bytes=10-", if_range=http_date(FACTS.mtime - 60)).status == 200


def test_if_none_match_and_if_modified_since_answer_304() -> None:
    """A client holding the current copy is told 304, by ETag or by date."""
    assert answer(if_none_match=FACTS.etag).status == 304
    assert answer(if_none_match=f'"x", W/{FACTS.etag}').status == 304
    assert answer(if_none_match="*").status == 304
    assert answer(if_none_match='"other"').status == 200
    assert answer(if_modified_since=http_date(FACTS.mtime)).status == 304
    assert answer(if_modified_since=http_date(FACTS.mtime - 60)).status == 200
    assert answer(if_modified_since="not a date").status == 200


def test_if_match_and_if_unmodified_since_answer_412() -> None:
    """Preconditions that fail answer 412; matching ones let the request through."""
    assert answer(if_match='"other"').status == 412
    assert answer(if_match=FACTS.etag).status == 200
    assert answer(if_unmodified_since=http_date(FACTS.mtime - 60)).status == 412
    assert answer(if_unmodified_since=http_date(FACTS.mtime)).status == 200


def test_parse_range_rejects_reversed_spans() -> None:
    """A last byte before the first is malformed, not silently swapped."""
    with pytest.raises(RangeError, match="last before first"):
        parse_range("bytes=9-1", 100)


@pytest.mark.parametrize("raw", [
    "/../etc/passwd", "/a/../../etc/passwd", "/%2e%2e/etc/passwd", "/%2E%2E/x",
    "/a/..%2fb", "/a%2fb", "/a%5cb", "/a\\b", "//etc/passwd", "/a//b", "/.hidden/x",
    "/a/./b", "/a/%00b", "/a/%ff", "etc/passwd",
])
def test_request_parts_refuse_every_traversal_spelling(raw: str) -> None:
    """Dot segments in any spelling, encoded separators, empty segments and hidden
    names are refused outright, never cleaned up."""
    assert request_parts(raw) is None


def test_request_parts_accepts_plain_paths() -> None:
    """A plain path becomes its decoded segments, with the trailing slash noted."""
    assert request_parts("/") == ((), True)
    assert request_parts("/qwen/2024-11/") == (("qwen", "2024-11"), True)
    assert request_parts("/qwen/a%20b.gguf?x=1") == (("qwen", "a b.gguf"), False)


def test_sidecar_parsing() -> None:
    """A .sha256 in sha256sum format or bare yields the digest; junk yields None."""
    digest = "ab" * 32
    assert parse_sidecar(f"{digest}  model.gguf\n") == digest
    assert parse_sidecar(digest.upper()) == digest
    assert parse_sidecar("not a sum") is None
    assert parse_sidecar("") is None
