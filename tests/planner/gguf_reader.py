"""A reader of GGUF headers (tensor names, types and sizes), for checking the planner.

Only what the tests need: the GGUF v3 header layout (magic, version, tensor
count, metadata key/values, then per tensor its name, dimensions, ggml type
id and offset). Type ids and block sizes are ggml's (ggml.h, ggml.c).
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, BinaryIO

# ggml type id -> (name, weights per block, bytes per block)
GGML_IDS = {0: ("f32", 1, 4), 1: ("f16", 1, 2), 2: ("q4_0", 32, 18), 3: ("q4_1", 32, 20),
            6: ("q5_0", 32, 22), 7: ("q5_1", 32, 24), 8: ("q8_0", 32, 34),
            12: ("q4_K", 256, 144), 13: ("q5_K", 256, 176), 14: ("q6_K", 256, 210),
            30: ("bf16", 1, 2), 39: ("mxfp4", 32, 17)}
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
            12: "d"}


def _read(f: BinaryIO, fmt: str) -> Any:
    return struct.unpack("<" + fmt, f.read(struct.calcsize(fmt)))[0]


def _string(f: BinaryIO) -> str:
    return f.read(_read(f, "Q")).decode("utf-8", "replace")


def _value(f: BinaryIO, kind: int) -> Any:
    if kind == 8:
        return _string(f)
    if kind == 9:
        item, n = _read(f, "I"), _read(f, "Q")
        return [_value(f, item) for _ in range(n)]
    return _read(f, _SCALARS[kind])


def read_gguf(path: Path) -> tuple[dict[str, Any], dict[str, tuple[str, int]]]:
    """(metadata without token arrays, tensor name -> (ggml type, bytes))."""
    with path.open("rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        _read(f, "I")
        n_tensors, n_kv = _read(f, "Q"), _read(f, "Q")
        meta: dict[str, Any] = {}
        for _ in range(n_kv):
            key, kind = _string(f), _read(f, "I")
            value = _value(f, kind)
            if not key.startswith("tokenizer.ggml."):
                meta[key] = value
        tensors: dict[str, tuple[str, int]] = {}
        for _ in range(n_tensors):
            name = _string(f)
            dims = [_read(f, "Q") for _ in range(_read(f, "I"))]
            type_id = _read(f, "I")
            _read(f, "Q")
            n = 1
            for d in dims:
                n *= d
            type_name, block, size = GGML_IDS[type_id]
            tensors[name] = (type_name, n // block * size)
    return meta, tensors
