"""How Nomad's scheduler compares the two sides of a constraint.

Two comparison worlds exist and the fake keeps them apart as Nomad does:

* node targets (``${attr.*}``, ``${meta.*}``, ``${node.*}``) are plain strings; ordering
  operators compare as integers, then floats, then lexically (scheduler/feasible
  ``checkOrder``), so ``"10" > "9"`` but ``"10a" < "9a"``;
* device targets (``${device.attr.*}``, ``${device.model}``) are typed *attributes*
  with units. A literal right-hand side such as ``"40 GiB"`` is parsed into ``Int 40,
  Unit GiB`` and compared after converting both sides to the base unit, so
  ``81559 MiB >= 40 GiB`` holds while ``81559 MiB >= 80 GiB`` does not — the trap
  docs/nomad-api.md §2 describes for "80GB" cards (plugins/shared/structs/attribute.go).

``version``/``semver`` use one small parser (leading ``v`` allowed, pre-releases sort
before releases); enough for the implied ``${attr.nomad.version} semver >= 1.4.0``
and ``${attr.consul.version} semver >= 1.8.0`` constraints and for operators'.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, NamedTuple

# name -> (base unit, multiplier, multiplier is a divisor) — plugins/shared/structs/units.go
_UNITS: dict[str, tuple[str, int, bool]] = {}
for _i, _u in enumerate(["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"], start=1):
    _UNITS[_u] = ("byte", 1024**_i, False)
    _UNITS[_u + "/s"] = ("byterate", 1024**_i, False)
for _i, _u in enumerate(["kB", "MB", "GB", "TB", "PB", "EB"], start=1):
    _UNITS[_u] = ("byte", 1000**_i, False)
    _UNITS[_u + "/s"] = ("byterate", 1000**_i, False)
_UNITS.update({"KB": ("byte", 1000, False), "KB/s": ("byterate", 1000, False),
               "MHz": ("hertz", 1000**2, False), "GHz": ("hertz", 1000**3, False),
               "mW": ("watt", 1000, True), "W": ("watt", 1, False),
               "kW": ("watt", 1000, False), "MW": ("watt", 1000**2, False),
               "GW": ("watt", 1000**3, False)})
_BY_LENGTH = sorted(_UNITS, key=len, reverse=True)
_GO_BOOLS = {"1": True, "t": True, "T": True, "TRUE": True, "true": True, "True": True,
             "0": False, "f": False, "F": False, "FALSE": False, "false": False, "False": False}
_INT_RE = re.compile(r"^[+-]?\d+$")


class Attr(NamedTuple):
    """A psstructs.Attribute: exactly one of int/float/bool/string, optionally a unit."""

    kind: str  # "int" | "float" | "bool" | "string"
    value: Any
    unit: str = ""


def parse_attribute(text: str) -> Attr:
    """psstructs.ParseAttribute: ``"40 GiB"`` → Int 40 GiB; anything else falls through."""
    if not text:
        return Attr("string", text)
    numeric, unit = text, ""
    if text[-1].isalpha():
        for name in _BY_LENGTH:
            if text.endswith(name):
                unit, numeric = name, text[: -len(name)].strip()
                break
    if _INT_RE.match(numeric):
        return Attr("int", int(numeric), unit)
    try:
        return Attr("float", float(numeric), unit)
    except ValueError:
        pass
    if text in _GO_BOOLS:
        return Attr("bool", _GO_BOOLS[text])
    return Attr("string", text)


def attr_from_wire(wire: Mapping[str, Any]) -> Attr:
    """The node-side JSON form ``{"Int": 81559, "Unit": "MiB"}``."""
    unit = str(wire.get("Unit", ""))
    for key, kind in (("Int", "int"), ("Float", "float"), ("Bool", "bool"), ("String", "string")):
        if wire.get(key) is not None:
            return Attr(kind, wire[key], unit)
    return Attr("string", "", unit)


def _scaled(a: Attr) -> float | int:
    base = _UNITS.get(a.unit)
    if base is None:
        return a.value  # type: ignore[no-any-return]
    _, mult, inverse = base
    if a.kind == "int":
        return a.value // mult if inverse else a.value * mult  # type: ignore[no-any-return]
    return a.value / mult if inverse else a.value * mult  # type: ignore[no-any-return]


def compare(a: Attr, b: Attr) -> int | None:
    """Attribute.Compare: -1/0/1, or None when the two are not comparable."""
    ua, ub = _UNITS.get(a.unit), _UNITS.get(b.unit)
    if (ua is None) != (ub is None) or (ua and ub and ua[0] != ub[0]):
        return None
    if a.kind == "string" and b.kind != "string":
        return None
    if a.kind == "bool":
        return None if b.kind != "bool" else (0 if a.value == b.value else 1)
    if a.kind == "string":
        return (a.value > b.value) - (a.value < b.value)  # type: ignore[no-any-return]
    if b.kind not in ("int", "float"):
        return None
    x, y = _scaled(a), _scaled(b)
    return (x > y) - (x < y)


def check_attribute(op: str, left: Attr | None, right: Attr | None) -> bool:
    """CheckAttributeConstraint (scheduler/feasible/feasible.go) for device targets."""
    if op in ("distinct_hosts", "distinct_property"):
        return True
    if op in ("!=", "not"):
        if left is None and right is None:
            return False
        if (left is None) != (right is None):
            return True
        c = compare(left, right) if left is not None and right is not None else None
        return c is not None and c != 0
    if left is None or right is None:
        return False
    if op in ("=", "==", "is", "<", "<=", ">", ">="):
        c = compare(left, right)
        if c is None:
            return False
        return {"=": c == 0, "==": c == 0, "is": c == 0, "<": c == -1, "<=": c != 1,
                ">": c == 1, ">=": c != -1}[op]
    if op in ("version", "semver"):
        return bool(version_matches(str(left.value), str(right.value)))
    if left.kind != "string" or right.kind != "string":
        return False
    return check_strings(op, left.value, right.value)


def check_strings(op: str, left: str | None, right: str | None) -> bool:
    """CheckConstraint for node targets; ``None`` means the target did not resolve."""
    lfound, rfound = left is not None, right is not None
    lv, rv = left or "", right or ""
    if op in ("distinct_hosts", "distinct_property"):
        return True
    if op in ("=", "==", "is"):
        return lfound and rfound and lv == rv
    if op in ("!=", "not"):
        return lv != rv  # reflect.DeepEqual of the resolved strings; unresolved is ""
    if op in ("<", "<=", ">", ">="):
        return lfound and rfound and _order(op, lv, rv)
    if op == "is_set":
        return lfound
    if op == "is_not_set":
        return not lfound
    if not (lfound and rfound):
        return False
    if op in ("version", "semver"):
        return bool(version_matches(lv, rv))
    if op == "regexp":
        try:
            return re.search(rv, lv) is not None
        except re.error:
            return False
    have = {s.strip() for s in lv.split(",")}
    want = {s.strip() for s in rv.split(",")}
    if op in ("set_contains", "set_contains_all"):
        return want <= have
    if op == "set_contains_any":
        return bool(want & have)
    return False


def _order(op: str, left: str, right: str) -> bool:
    """CheckOrder: as integers if both parse, else as floats, else lexically."""
    c: int
    if _INT_RE.match(left) and _INT_RE.match(right):
        c = (int(left) > int(right)) - (int(left) < int(right))
    else:
        try:
            c = (float(left) > float(right)) - (float(left) < float(right))
        except ValueError:
            c = (left > right) - (left < right)
    return {"<": c < 0, "<=": c <= 0, ">": c > 0, ">=": c >= 0}[op]


_VERSION_RE = re.compile(r"^v?(\d+(?:\.\d+)*)(?:-([0-9A-Za-z.-]+))?(?:\+[0-9A-Za-z.-]+)?$")
_CONSTRAINT_RE = re.compile(r"^\s*(~>|>=|<=|!=|=|>|<)?\s*(\S+)\s*$")


def _version(text: str) -> tuple[tuple[int, ...], str] | None:
    m = _VERSION_RE.match(text.strip())
    if not m:
        return None
    nums = tuple(int(p) for p in m.group(1).split("."))
    return (nums + (0,) * (3 - len(nums)), m.group(2) or "")


def _cmp(a: tuple[tuple[int, ...], str], b: tuple[tuple[int, ...], str]) -> int:
    if a[0] != b[0]:
        return -1 if a[0] < b[0] else 1
    if a[1] == b[1]:
        return 0
    if not a[1] or not b[1]:  # a release sorts after its pre-releases
        return 1 if not a[1] else -1
    return -1 if a[1] < b[1] else 1


def version_matches(version: str, constraints: str) -> bool | None:
    """True/False, or None when the constraint text cannot be parsed."""
    have = _version(version)
    for part in constraints.split(","):
        m = _CONSTRAINT_RE.match(part)
        want = _version(m.group(2)) if m else None
        if m is None or want is None:
            return None
        if have is None:
            return False
        op, c = m.group(1) or "=", _cmp(have, want)
        if op == "~>":
            depth = max(1, len(m.group(2).lstrip("v").split("-")[0].split(".")) - 1)
            ok = c >= 0 and have[0][:depth] == want[0][:depth]
        else:
            ok = {"=": c == 0, "!=": c != 0, ">": c > 0, "<": c < 0,
                  ">=": c >= 0, "<=": c <= 0}[op]
        if not ok:
            return False
    return True
