"""A GGUF file's header: what a model is, read before any engine loads it.

Three readers need it. The embedded scheduler refuses a file that is not GGUF
at all (a wrong path, an HTML error page saved as ``.gguf``) with a sentence
instead of a page of engine output, and picks a chat format for a base model
whose file carries no template (llama-cpp-python's fallback, ``llama-2``,
makes a Gemma model answer an empty message). The planner reads the shape of
the network (``<arch>.block_count``, the head counts, the window) and the
file type, the only description of a model a GGUF-only repository has. Both
sit above this package and may not import each other, so the reader lives
here, with the rest of what reads weight files.

A header is the magic, a version, the tensor and key counts, the metadata
key/values, then one entry per tensor (name, dimensions, ggml type, offset).
It is walked from a memory map with ``struct.unpack_from``: the tokenizer's
arrays of a model with a 262k-token vocabulary are several megabytes of
strings, and walking them through ``file.read`` calls would cost seconds.
Arrays are skipped and only their lengths kept (the vocabulary size is the
length of ``tokenizer.ggml.tokens``); strings longer than ``MAX_STRING``
(chat templates, licences) are left out of ``metadata`` too.

``parse_header`` is pure over a buffer. Given a buffer that may be only the
head of a file (``whole=False``) it says when it needs more rather than
calling the header damaged, which is how ``read_gguf_head`` reads a remote
file a range at a time and stops as soon as the header is complete, up to a
bound: a header larger than that is not a model header worth a download.
``read_gguf`` opens a local file.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Callable
from pathlib import Path

import msgspec

MAGIC = b"GGUF"
MAX_STRING = 1024
# A remote header is read in ranges from FIRST_READ, doubling what has been read
# each time: the bytes moved stay under twice the header, in few requests (a
# small vocabulary's header fits the first; Gemma 3's 6 MB takes three, Llama
# 3's 9 MB four).
FIRST_READ = 2 << 20
GROWTH = 2
# Gemma 3's 262k-token vocabulary makes a 6 MB header and Llama 3's 128k
# tokens with their 280k merges about 9 MB; nothing a planner reads needs more.
HEADER_LIMIT = 64 << 20

# GGUF value types (ggml's gguf.h, enum gguf_type) -> struct format.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
_SIZES = {kind: struct.calcsize(fmt) for kind, fmt in _SCALARS.items()}
_STRING, _ARRAY = 8, 9
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")

Scalar = int | float | bool | str


class NotGgufError(ValueError):
    """The file is not a GGUF model; the message says what it starts with."""


class HeaderTooLargeError(ValueError):
    """A remote header runs past ``HEADER_LIMIT``; the message says where and how far."""


class _PastEndError(Exception):
    """The buffer ended inside the header."""


class _MalformedError(Exception):
    """The bytes cannot be a GGUF header (an unknown value type)."""


class HeaderIncompleteError(Exception):
    """``parse_header(whole=False)`` needs more of the file than it was given."""


class GgufTensor(msgspec.Struct, frozen=True, array_like=True):
    """One tensor of the file: its ggml type id and its dimensions, innermost first."""

    type: int
    shape: tuple[int, ...]


class GgufInfo(msgspec.Struct, frozen=True, kw_only=True):
    """What a GGUF header says.

    ``metadata`` holds every scalar key and every string of up to
    ``MAX_STRING`` bytes; ``array_lengths`` the length of every array.
    ``tensors`` is empty for a version-1 file, whose header is not walked.
    """

    version: int
    metadata: dict[str, Scalar] = {}
    array_lengths: dict[str, int] = {}
    tensors: dict[str, GgufTensor] = {}
    has_chat_template: bool = False

    @property
    def architecture(self) -> str | None:
        value = self.metadata.get("general.architecture")
        return value if isinstance(value, str) else None

    @property
    def name(self) -> str | None:
        value = self.metadata.get("general.name")
        return value if isinstance(value, str) else None


class _Cursor:
    def __init__(self, buf: bytes | bytearray | mmap.mmap) -> None:
        self.buf = buf
        self.end = len(buf)
        self.pos = 0

    def _need(self, n: int) -> None:
        if self.pos + n > self.end:
            raise _PastEndError

    def u32(self) -> int:
        self._need(4)
        (value,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return int(value)

    def u64(self) -> int:
        self._need(8)
        (value,) = _U64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return int(value)

    def string(self) -> bytes:
        n = self.u64()
        self._need(n)
        value = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return value

    def scalar(self, kind: int) -> int | float | bool:
        size = _SIZES[kind]
        self._need(size)
        (value,) = struct.unpack_from(_SCALARS[kind], self.buf, self.pos)
        self.pos += size
        assert isinstance(value, int | float | bool)
        return value

    def skip_array(self) -> int:
        """Skip an array value; its length."""
        item, count = self.u32(), self.u64()
        if item in _SIZES:
            self._need(_SIZES[item] * count)
            self.pos += _SIZES[item] * count
        elif item == _STRING:
            # The one loop over every token: kept to a bound method and locals.
            unpack, buf, end, pos = _U64.unpack_from, self.buf, self.end, self.pos
            for _ in range(count):
                if pos + 8 > end:
                    raise _PastEndError
                pos += 8 + unpack(buf, pos)[0]
            if pos > end:
                raise _PastEndError
            self.pos = pos
        elif item == _ARRAY:
            for _ in range(count):
                self.skip_array()
        else:
            raise _MalformedError
        return count

    def shape(self) -> tuple[int, ...]:
        dims = self.u32()
        if dims > 8:  # ggml's GGML_MAX_DIMS is 4; anything this large is not a header
            raise _MalformedError
        return tuple(self.u64() for _ in range(dims))

    def value(self, kind: int) -> Scalar | None:
        """A scalar or a short string; None for a long string (skipped)."""
        if kind in _SIZES:
            return self.scalar(kind)
        if kind == _STRING:
            n = self.u64()
            self._need(n)
            start, self.pos = self.pos, self.pos + n
            if n > MAX_STRING:
                return None
            return bytes(self.buf[start:self.pos]).decode("utf-8", "replace")
        raise _MalformedError


def check_magic(head: bytes, where: str) -> None:
    """Raise NotGgufError unless ``head`` (the file's first bytes) starts a GGUF file."""
    if head[:4] == MAGIC:
        return
    if not head:
        raise NotGgufError(f"{where} is empty, not a GGUF model file")
    raise NotGgufError(
        f"{where} is not a GGUF model file: it starts with {head[:8]!r} where a GGUF file "
        f"starts with {MAGIC!r}; check that the source names the .gguf file and that the "
        "download finished"
    )


def parse_header(buf: bytes | bytearray | mmap.mmap, *, whole: bool = True) -> GgufInfo | None:
    """The header of the GGUF file in ``buf``, or None when it cannot be walked.

    None is not an error: the engine reads the file itself and, if it is
    damaged, says so in its own output, which the supervisor reports. A
    version-1 file (no tensor table walked) answers its version alone. With
    ``whole=False`` the buffer is the head of a longer file, and running out
    of it raises HeaderIncompleteError instead.
    """
    cur = _Cursor(buf)
    try:
        cur.pos = 4
        version = cur.u32()
        if version < 2:
            return GgufInfo(version=version)
        n_tensors = cur.u64()
        n_kv = cur.u64()
        metadata: dict[str, Scalar] = {}
        arrays: dict[str, int] = {}
        template = False
        for _ in range(n_kv):
            key = cur.string().decode("utf-8", "replace")
            kind = cur.u32()
            if key == "tokenizer.chat_template" or key.startswith("tokenizer.chat_template."):
                template = True
            if kind == _ARRAY:
                arrays[key] = cur.skip_array()
                continue
            value = cur.value(kind)
            if value is not None:
                metadata[key] = value
        tensors: dict[str, GgufTensor] = {}
        for _ in range(n_tensors):
            name = cur.string().decode("utf-8", "replace")
            shape = cur.shape()
            tensors[name] = GgufTensor(type=cur.u32(), shape=shape)
            cur.u64()  # the tensor's offset in the data section
    except _PastEndError:
        if whole:
            return None
        raise HeaderIncompleteError from None
    except _MalformedError:
        return None
    return GgufInfo(version=version, metadata=metadata, array_lengths=arrays, tensors=tensors,
                    has_chat_template=template)


def read_gguf(path: Path) -> GgufInfo | None:
    """Check ``path`` is GGUF (NotGgufError if not) and read its header (blocking I/O)."""
    with path.open("rb") as handle:
        head = handle.read(8)
        check_magic(head, str(path))
        try:
            with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return parse_header(buf)
        except (ValueError, OSError):
            return None


def read_gguf_head(read: Callable[[int, int], bytes], where: str, *,
                   limit: int = HEADER_LIMIT) -> GgufInfo | None:
    """The header of a remote GGUF file, read a range at a time (blocking I/O).

    ``read(start, length)`` returns up to ``length`` bytes from ``start`` (fewer
    only at the end of the file). Raises NotGgufError for a file that is not
    GGUF and HeaderTooLargeError when ``limit`` bytes do not hold the header.
    """
    buf = bytearray()
    want = min(FIRST_READ, limit)
    while True:
        asked = want - len(buf)
        chunk = read(len(buf), asked)
        buf += chunk[:asked]
        check_magic(bytes(buf[:8]), where)
        try:
            return parse_header(buf, whole=len(chunk) < asked)
        except HeaderIncompleteError:
            if want >= limit:
                raise HeaderTooLargeError(
                    f"{where}: the GGUF header runs past its first {limit // (1 << 20)} MiB; "
                    "a model header is a few MB, so this file was not read further") from None
            want = min(want * GROWTH, limit)
