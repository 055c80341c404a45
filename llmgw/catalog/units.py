"""Human sizes (``24GiB``) and durations (``15m``) as people write them in YAML.

Sizes accept both binary (KiB, MiB, GiB, TiB) and decimal (KB, MB, GB, TB)
units because GPU vendors sell in one and report in the other; a bare number
is bytes. Durations accept ``ms``, ``s``, ``m`` and ``h`` parts (``1h30m``) or a
bare number of seconds.
"""

from __future__ import annotations

import re

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "kib": 1024,
    "m": 1000**2, "mb": 1000**2, "mib": 1024**2,
    "g": 1000**3, "gb": 1000**3, "gib": 1024**3,
    "t": 1000**4, "tb": 1000**4, "tib": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")


def parse_size(value: str | int) -> int:
    """Bytes in ``value``; raises ValueError saying which units are understood."""
    if isinstance(value, bool):
        raise ValueError(f"expected a size such as 24GiB, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a size cannot be negative, got {value}")
        return value
    match = _SIZE_RE.match(value)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _SIZE_UNITS:
        raise ValueError(
            f"{value!r} is not a size; write a number with a unit such as 512MiB, 24GiB or 80GB"
        )
    return int(float(match.group(1)) * _SIZE_UNITS[unit])


def format_size(n: int) -> str:
    """``n`` bytes in the largest binary unit that keeps one decimal meaningful."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    raise AssertionError("unreachable")


def parse_duration(value: str | float) -> float:
    """Seconds in ``value``; ``15m``, ``1h30m``, ``250ms`` or a number of seconds."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as 30s or 15m, got {value!r}")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"a duration cannot be negative, got {value}")
        return float(value)
    text = value.strip()
    pos, total = 0, 0.0
    for part in _DURATION_PART.finditer(text):
        if part.start() != pos:
            break
        number, unit = float(part.group(1)), part.group(2)
        total += number * {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}[unit]
        pos = part.end()
    if pos != len(text) or not text:
        raise ValueError(f"{value!r} is not a duration; write e.g. 30s, 15m, 1h30m or 250ms")
    return total
