"""A writer of GGUF headers for tests: metadata and a tensor table, no tensor data.

The layout is GGUF v3's (ggml's docs/gguf.md): magic, version, tensor count,
key/value count, the key/values, then per tensor its name, dimension count,
dimensions, ggml type and offset. Values: ``str`` is a string, ``bool`` a
bool, ``int`` a u32 (a u64 past 2**32 - 1), ``float`` an f32, a list of ``str``
a string array and a list of ``int`` an i32 array.
"""

from __future__ import annotations

import struct

U32_MAX = 2**32 - 1


def _string(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def _value(value: object) -> bytes:
    if isinstance(value, str):
        return struct.pack("<I", 8) + _string(value)
    if isinstance(value, bool):
        return struct.pack("<I?", 7, value)
    if isinstance(value, int):
        if value > U32_MAX:
            return struct.pack("<IQ", 10, value)
        return struct.pack("<II", 4, value)
    if isinstance(value, float):
        return struct.pack("<If", 6, value)
    if isinstance(value, list):
        if all(isinstance(v, str) for v in value):
            return struct.pack("<IIQ", 9, 8, len(value)) + b"".join(_string(v) for v in value)
        if all(isinstance(v, int) for v in value):
            return struct.pack("<IIQ", 9, 5, len(value)) + struct.pack(f"<{len(value)}i",
                                                                       *value)
    raise TypeError(f"no GGUF encoding for {value!r}")


def gguf_bytes(kv: dict[str, object], *, version: int = 3,
               tensors: dict[str, tuple[int, tuple[int, ...]]] | None = None) -> bytes:
    """A GGUF header with ``kv`` metadata and ``tensors`` (name -> (ggml type, shape))."""
    tensors = tensors or {}
    out = bytearray(b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kv)))
    for key, value in kv.items():
        out += _string(key) + _value(value)
    offset = 0
    for name, (kind, shape) in tensors.items():
        out += _string(name) + struct.pack("<I", len(shape))
        out += struct.pack(f"<{len(shape)}Q", *shape) + struct.pack("<IQ", kind, offset)
        offset += 32
    return bytes(out)
