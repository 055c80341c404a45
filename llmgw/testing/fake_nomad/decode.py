"""Decoding request bodies the way Nomad's agent does — and, in strict mode, stricter.

Nomad decodes bodies with Go's ``encoding/json`` into ``api.*`` structs (``decodeBody``,
command/agent/http.go), so (docs/nomad-api.md, "General wire conventions"):

* a wrongly typed value is a **400** whose body is the decoder's message, e.g.
  ``json: cannot unmarshal number into Go struct field Job.Job.Meta of type string``
  (``Struct.FieldPath``; slice indexes and map keys are not part of the path);
* unknown keys are silently dropped and keys match case-insensitively — a misspelt
  ``"Memory"`` costs you the default 300 MB with no error;
* ``null`` leaves the field at its zero value; data after the first JSON value is ignored.

``strict=False`` reproduces exactly that. ``strict=True`` (the default of the fake)
additionally refuses, with a 400, what Nomad would accept and then misread:

* unknown keys at any depth, and keys whose case differs from Go's field name;
* a duration field holding less than 1 ms: durations are integer nanoseconds, so a
  ``10`` meant as ten seconds is read by Nomad as 10 ns.

The output is a normalised tree: canonical key spelling, ``null`` fields removed.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from llmgw.testing.fake_nomad.schema import OPAQUE, STRUCTS

_INT_RANGES = {
    "int": (-(2**63), 2**63 - 1), "int64": (-(2**63), 2**63 - 1), "int8": (-128, 127),
    "uint8": (0, 255), "uint16": (0, 65535), "uint64": (0, 2**64 - 1),
    "time.Duration": (-(2**63), 2**63 - 1),
}
_MIN_SANE_DURATION = 1_000_000  # 1 ms


class DecodeError(Exception):
    """A body Nomad (or the strict fake) refuses with 400; ``str()`` is the body."""


class _Number(float):
    """A JSON number with a fraction or exponent, keeping its literal for Go's messages."""

    literal: str

    def __new__(cls, text: str) -> _Number:
        obj = super().__new__(cls, text)
        obj.literal = text
        return obj


class _Ctx:
    """Where the decoder is: Go's errorContext plus a readable path for strict errors."""

    def __init__(self, strict: bool) -> None:
        self.strict = strict
        self.struct = ""
        self.fields: list[str] = []
        self.path = ""


def decode(raw: bytes, root: str, *, strict: bool) -> dict[str, Any]:
    """Decode ``raw`` as the Go struct ``root`` (e.g. ``"JobRegisterRequest"``)."""
    if not raw or not raw.strip():
        raise DecodeError("Request body is empty")
    text = raw.decode("utf-8", errors="replace")
    try:
        value, _ = json.JSONDecoder(parse_float=_Number).raw_decode(text.lstrip())
    except json.JSONDecodeError as exc:
        raise DecodeError(_syntax_message(exc)) from None
    out = _walk(value, root, _Ctx(strict))
    return out if isinstance(out, dict) else {}


def _syntax_message(exc: json.JSONDecodeError) -> str:
    if exc.pos >= len(exc.doc.rstrip()) or exc.msg.startswith("Unterminated"):
        return "unexpected EOF"
    char = exc.doc[exc.pos]
    context = {
        "Expecting property name enclosed in double quotes":
            "looking for beginning of object key string",
        "Expecting ':' delimiter": "after object key",
        "Expecting ',' delimiter": "after object key:value pair",
    }.get(exc.msg, "looking for beginning of value")
    return f"invalid character {char!r} {context}"


def _go_name(t: str) -> str:
    """The Go spelling of a type as reflect.Type.String() prints it."""
    if t.startswith("*"):
        return "*" + _go_name(t[1:])
    if t.startswith("[]"):
        return "[]uint8" if t == "[]byte" else "[]" + _go_name(t[2:])
    if t.startswith("map[string]"):
        return "map[string]" + _go_name(t[len("map[string]"):])
    if t == "any":
        return "interface {}"
    if t in STRUCTS or t in OPAQUE:
        return "api." + t
    return t


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, _Number):
        return "number"
    if isinstance(value, int):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _type_error(ctx: _Ctx, value_desc: str, t: str) -> DecodeError:
    # Go dereferences pointers before storing, so the type named is the pointee.
    name = _go_name(t.lstrip("*"))
    if ctx.fields:
        field = ".".join(ctx.fields)
        return DecodeError(f"json: cannot unmarshal {value_desc} into Go struct field "
                           f"{ctx.struct}.{field} of type {name}")
    return DecodeError(f"json: cannot unmarshal {value_desc} into Go value of type {name}")


def _walk(value: Any, t: str, ctx: _Ctx) -> Any:
    t = t.lstrip("*")
    if value is None:
        return None
    if t == "[]byte":
        if not isinstance(value, str):
            raise _type_error(ctx, _kind(value), t)
        try:
            base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise DecodeError("illegal base64 data at input byte 0") from None
        return value
    if t.startswith("[]"):
        if not isinstance(value, list):
            raise _type_error(ctx, _kind(value), t)
        items = []
        for i, item in enumerate(value):
            if item is None and ctx.strict:
                raise DecodeError(f"strict: {ctx.path}[{i}] is null; Nomad would store a nil "
                                  "element here — drop it from the list")
            if item is not None:
                saved = ctx.path
                ctx.path = f"{saved}[{i}]"
                items.append(_walk(item, t[2:], ctx))
                ctx.path = saved
        return items
    if t.startswith("map[string]"):
        if not isinstance(value, dict):
            raise _type_error(ctx, _kind(value), t)
        elem = t[len("map[string]"):]
        result = {}
        for key, item in value.items():
            saved = ctx.path
            ctx.path = f"{saved}[{key!r}]"
            result[key] = "" if item is None and elem == "string" else _walk(item, elem, ctx)
            ctx.path = saved
        return result
    if t in STRUCTS:
        return _struct(value, t, ctx)
    if t in OPAQUE:
        if not isinstance(value, dict):
            raise _type_error(ctx, _kind(value), t)
        return _plain(value)
    return _scalar(value, t, ctx)


def _struct(value: Any, t: str, ctx: _Ctx) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _type_error(ctx, _kind(value), t)
    fields = STRUCTS[t]
    folded = {name.lower(): name for name in fields}
    out: dict[str, Any] = {}
    saved_struct, saved_path = ctx.struct, ctx.path
    for key, item in value.items():
        name = key if key in fields else folded.get(key.lower())
        where = f"{saved_path}.{key}" if saved_path else key
        if name is None:
            if ctx.strict:
                raise DecodeError(
                    f"json: unknown field {json.dumps(key)} at {where} (strict fake: Nomad "
                    f"would drop it silently; fields of {t} are {', '.join(fields)})")
            continue
        if name != key and ctx.strict:
            raise DecodeError(
                f"json: unknown field {json.dumps(key)} at {where} (strict fake: Nomad matches "
                f"it case-insensitively to {name!r}; send the exact Go field name)")
        ctx.struct, ctx.path = t, f"{saved_path}.{name}" if saved_path else name
        ctx.fields.append(name)
        decoded = _walk(item, fields[name], ctx)
        ctx.fields.pop()
        ctx.struct, ctx.path = saved_struct, saved_path
        if decoded is not None:
            out[name] = decoded
    return out


def _scalar(value: Any, t: str, ctx: _Ctx) -> Any:
    if t == "any":
        return _plain(value)
    if t == "string":
        if not isinstance(value, str):
            raise _type_error(ctx, _kind(value), t)
        return value
    if t == "bool":
        if not isinstance(value, bool):
            raise _type_error(ctx, _kind(value), t)
        return value
    if t == "float64":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _type_error(ctx, _kind(value), t)
        return float(value)
    if t == "time.Time":
        if not isinstance(value, str):
            raise _type_error(ctx, _kind(value), t)
        return value
    lo, hi = _INT_RANGES.get(t, _INT_RANGES["int"])
    if isinstance(value, _Number):
        raise _type_error(ctx, f"number {value.literal}", t)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _type_error(ctx, _kind(value), t)
    if not lo <= value <= hi:
        raise _type_error(ctx, f"number {value}", t)
    if t == "time.Duration" and ctx.strict and 0 < value < _MIN_SANE_DURATION:
        raise DecodeError(
            f"strict: {ctx.path} = {value} is {value}ns; Nomad durations are integer "
            f"nanoseconds (10 s = 10000000000), so this value is almost certainly seconds "
            f"or milliseconds sent unconverted")
    return value


def _plain(value: Any) -> Any:
    """Free-form JSON (task Config, opaque blocks) with numbers back to plain floats."""
    if isinstance(value, _Number):
        return float(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value
