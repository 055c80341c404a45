"""Sizes (``24GiB``) and durations (``15m``): parsed once, where text enters.

A person writes ``memory: 24GiB`` or ``wait: 10m``; everything past the
decoder works with a number. ``Size`` is an ``int`` of bytes and ``Duration``
a ``float`` of seconds, so arithmetic and comparisons need no conversion, and
each remembers how it was written. That memory is not decoration: a stored
model is encoded back to exactly the text it was given, the API shows what
the operator wrote, and the profile fingerprint — a hash of the launch
inputs as written — is the same value whether it was computed before these
types existed or after, so no running replica turns "stale" on an upgrade.

The parsers are the classmethods ``Size.parse`` and ``Duration.parse``; the
decoder (``llmgw.catalog.decode``) calls them through its msgspec hooks, and
nothing else in the package needs to, because everything else receives the
typed value.

Sizes accept both binary (KiB, MiB, GiB, TiB) and decimal (KB, MB, GB, TB)
units because GPU vendors sell in one and report in the other; a bare number
is bytes. Durations accept ``ms``, ``s``, ``m`` and ``h`` parts (``1h30m``) or a
bare number of seconds.
"""

from __future__ import annotations

import re
from typing import Any

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "kib": 1024,
    "m": 1000**2, "mb": 1000**2, "mib": 1024**2,
    "g": 1000**3, "gb": 1000**3, "gib": 1024**3,
    "t": 1000**4, "tb": 1000**4, "tib": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


class Size(int):
    """A number of bytes, and the text (or number) it was written as."""

    text: str | int

    def __new__(cls, value: int, text: str | int | None = None) -> Size:
        self = super().__new__(cls, value)
        self.text = int(value) if text is None else text
        return self

    @classmethod
    def parse(cls, value: object) -> Size:
        """``value`` (``24GiB``, ``80GB``, a byte count) as a Size; ValueError saying
        which spellings are understood."""
        if isinstance(value, Size):
            return value
        if isinstance(value, float) and value.is_integer():
            value = int(value)   # JSON's 2048.0 is the whole number 2048
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise ValueError(f"expected a size such as 24GiB, got {value!r}")
        if isinstance(value, int):
            if value < 0:
                raise ValueError(f"a size cannot be negative, got {value}")
            return cls(value, value)
        match = _SIZE_RE.match(value)
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _SIZE_UNITS:
            raise ValueError(
                f"{value!r} is not a size; write a number with a unit such as 512MiB, "
                "24GiB or 80GB")
        return cls(int(float(match.group(1)) * _SIZE_UNITS[unit]), value)

    @classmethod
    def of(cls, n: int) -> Size:
        """``n`` bytes, written as the number (a value llmgw computed, not a person)."""
        return cls(n, n)

    def __repr__(self) -> str:
        return f"Size({self.text!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Size, (int(self), self.text))

    def __str__(self) -> str:
        return str(self.text)

    def __format__(self, spec: str) -> str:
        return format(int(self), spec) if spec else str(self.text)


class Duration(float):
    """A number of seconds, and the text (or number) it was written as."""

    text: str | int | float

    def __new__(cls, value: float, text: str | float | None = None) -> Duration:
        self = super().__new__(cls, value)
        self.text = float(value) if text is None else text
        return self

    @classmethod
    def parse(cls, value: object) -> Duration:
        """``value`` (``15m``, ``1h30m``, ``250ms``, seconds) as a Duration; ValueError
        saying how to write one."""
        if isinstance(value, Duration):
            return value
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise ValueError(f"expected a duration such as 30s or 15m, got {value!r}")
        if isinstance(value, int | float):
            if value < 0:
                raise ValueError(f"a duration cannot be negative, got {value}")
            return cls(float(value), value)
        text = value.strip()
        pos, total = 0, 0.0
        for part in _DURATION_PART.finditer(text):
            if part.start() != pos:
                break
            total += float(part.group(1)) * _DURATION_UNITS[part.group(2)]
            pos = part.end()
        if pos != len(text) or not text:
            raise ValueError(
                f"{value!r} is not a duration; write e.g. 30s, 15m, 1h30m or 250ms")
        return cls(total, value)

    def __repr__(self) -> str:
        return f"Duration({self.text!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Duration, (float(self), self.text))

    def __str__(self) -> str:
        return str(self.text)

    def __format__(self, spec: str) -> str:
        return format(float(self), spec) if spec else str(self.text)


def format_size(n: int) -> str:
    """``n`` bytes in the largest binary unit that keeps one decimal meaningful."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    raise AssertionError("unreachable")
