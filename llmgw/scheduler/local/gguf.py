"""Reading what llama.cpp needs to know from a GGUF file's header, before starting it.

Two uses. A file that is not GGUF at all (a wrong path, an HTML error page saved
as ``.gguf``) is refused with a sentence instead of a page of engine output.
And the chat format: llama-cpp-python uses the chat template a GGUF carries,
but when a file has none (base models such as the Gemma 3 270M that the README
serves) it falls back to ``llama-2``, whose prompt a Gemma model answers with an
empty message. Knowing the architecture lets ``engines.py`` name the format of
the model's family instead.

The header is parsed from a memory map with ``struct.unpack_from``: the
metadata of a model with a 262k-token vocabulary is several megabytes of
strings, and walking it through ``file.read`` calls would cost seconds.
``parse_header`` is pure over a buffer; ``read_gguf`` opens the file.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

import msgspec

MAGIC = b"GGUF"
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_WANTED = ("general.architecture", "general.name")


class NotGgufError(ValueError):
    """The file is not a GGUF model; the message says what it starts with."""


class GgufInfo(msgspec.Struct, frozen=True, kw_only=True):
    version: int
    architecture: str | None = None
    name: str | None = None
    has_chat_template: bool = False


class _Cursor:
    def __init__(self, buf: bytes | mmap.mmap) -> None:
        self.buf = buf
        self.pos = 0

    def unpack(self, fmt: str) -> object:
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def u32(self) -> int:
        value = self.unpack("<I")
        assert isinstance(value, int)
        return value

    def u64(self) -> int:
        value = self.unpack("<Q")
        assert isinstance(value, int)
        return value

    def string(self) -> bytes:
        n = self.u64()
        end = self.pos + n
        if end > len(self.buf):
            raise struct.error("string runs past the end of the file")
        value = bytes(self.buf[self.pos:end])
        self.pos = end
        return value

    def skip_string(self) -> None:
        n = self.u64()
        self.pos += n

    def skip_value(self, kind: int) -> None:
        if kind in _SCALARS:
            self.pos += struct.calcsize(_SCALARS[kind])
        elif kind == _STRING:
            self.skip_string()
        elif kind == _ARRAY:
            item, count = self.u32(), self.u64()
            if item in _SCALARS:
                self.pos += struct.calcsize(_SCALARS[item]) * count
            else:
                for _ in range(count):
                    self.skip_value(item)
        else:
            raise struct.error(f"unknown metadata value type {kind}")
        if self.pos > len(self.buf):
            raise struct.error("metadata runs past the end of the file")


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


def parse_header(buf: bytes | mmap.mmap) -> GgufInfo | None:
    """The metadata llmgw uses, or None when the header cannot be walked (v1, truncated).

    None is not an error here: the engine reads the file itself and, if it is
    damaged, says so in its own output, which the supervisor reports.
    """
    cur = _Cursor(buf)
    try:
        cur.pos = 4
        version = cur.u32()
        if version < 2:
            return GgufInfo(version=version)
        cur.u64()                       # tensor count
        kv_count = cur.u64()
        found: dict[str, str] = {}
        template = False
        for _ in range(kv_count):
            key = cur.string().decode("utf-8", "replace")
            kind = cur.u32()
            if key in _WANTED and kind == _STRING:
                found[key] = cur.string().decode("utf-8", "replace")
                continue
            if key == "tokenizer.chat_template" or key.startswith("tokenizer.chat_template."):
                template = True
            cur.skip_value(kind)
    except struct.error:
        return None
    return GgufInfo(version=version, architecture=found.get("general.architecture"),
                    name=found.get("general.name"), has_chat_template=template)


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
