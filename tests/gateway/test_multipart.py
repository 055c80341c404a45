"""The incremental multipart/form-data reader, fed bodies cut at every position (no server)."""

from __future__ import annotations

import pytest

from llmgw.gateway.errors import InvalidRequestError
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

BOUNDARY = b"----llmgw7MA4YWxkTrZu0gW"
AUDIO = bytes(range(256)) * 9 + b"\r\n--almost a boundary\r\n" + b"\r" * 5


def form() -> bytes:
    return (encode_part(BOUNDARY, "model", b"whisper")
            + encode_part(BOUNDARY, "file", AUDIO, filename="speech.wav",
                          content_type="audio/wav")
            + encode_part(BOUNDARY, "language", b"de") + closing(BOUNDARY))


def read(body: bytes, step: int) -> list[tuple[str, bytes]]:
    reader = MultipartReader(BOUNDARY)
    events = []
    for i in range(0, len(body), step):
        events.extend(reader.feed(body[i:i + step]))
    reader.close()
    parts: list[tuple[str, bytes]] = []
    for event in events:
        if isinstance(event, PartHead):
            parts.append((event.name, b""))
        elif isinstance(event, PartData):
            name, data = parts[-1]
            parts[-1] = (name, data + event.data)
        else:
            assert isinstance(event, PartEnd)
    return parts


@pytest.mark.parametrize("step", [1, 2, 3, 7, 41, 4096, 1 << 20])
def test_every_part_is_read_whole_wherever_the_body_is_cut(step: int) -> None:
    """Fields and a binary file that contains CR, LF and near-boundaries come back exactly."""
    assert read(form(), step) == [("model", b"whisper"), ("file", AUDIO), ("language", b"de")]


def test_a_part_head_gives_name_filename_and_type_and_reencodes_as_sent() -> None:
    """The head is parsed (quoted parameters) and re-encoding it reproduces the bytes sent."""
    body = form()
    reader = MultipartReader(BOUNDARY)
    heads = [e for e in reader.feed(body) if isinstance(e, PartHead)]
    file_head = heads[1]
    assert (file_head.name, file_head.filename, file_head.content_type) == \
        ("file", "speech.wav", "audio/wav")
    opening = reencode_head(BOUNDARY, file_head)
    assert opening in body


def test_a_preamble_and_an_epilogue_are_ignored() -> None:
    """Text before the first boundary and after the last is not part of any field."""
    body = b"ignored preamble\r\n" + form() + b"trailing epilogue"
    assert read(body, 5)[0] == ("model", b"whisper")


@pytest.mark.parametrize(("body", "words"), [
    (encode_part(BOUNDARY, "model", b"x"), "ended before the closing boundary"),
    (b"--" + BOUNDARY + b"\r\nno colon here\r\n\r\nx\r\n" + closing(BOUNDARY), "has no ':'"),
    (b"--" + BOUNDARY + b"\r\nContent-Type: text/plain\r\n\r\nx\r\n" + closing(BOUNDARY),
     "no Content-Disposition"),
    (b"--" + BOUNDARY + b"XX", "neither CRLF nor '--'"),
])
def test_malformed_bodies_are_400s_that_say_what_is_wrong(body: bytes, words: str) -> None:
    """A truncated body, a bad header line or a missing disposition is an InvalidRequestError."""
    def read_all() -> None:
        reader = MultipartReader(BOUNDARY)
        reader.feed(body)
        reader.close()

    with pytest.raises(InvalidRequestError, match=words):
        read_all()


def test_oversized_part_headers_are_refused() -> None:
    """A header block that never ends is refused once it passes 16 KiB, not buffered forever."""
    reader = MultipartReader(BOUNDARY)
    reader.feed(b"--" + BOUNDARY + b"\r\n")
    for _ in range(16):
        reader.feed(b"X-Filler: " + b"a" * 1000 + b"\r\n")
    with pytest.raises(InvalidRequestError, match="headers exceed"):
        reader.feed(b"X-Filler: " + b"a" * 1000 + b"\r\n")


@pytest.mark.parametrize(("header", "expected"), [
    ("multipart/form-data; boundary=abc", b"abc"),
    ('multipart/form-data; boundary="a b:c"', b"a b:c"),
    ("application/json", None), ("multipart/form-data", None), (None, None),
])
def test_the_boundary_comes_from_a_form_data_content_type_only(header: str | None,
                                                                expected: bytes | None) -> None:
    """Only multipart/form-data with a boundary parameter is an upload."""
    assert boundary_of(header) == expected
