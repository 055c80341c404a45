"""Text exactly as Nomad's Go code prints it: multierror lists, durations, quoting.

Nomad's error bodies are Go values formatted with ``%v``; a client that parses them
(or a test that pins them) needs the same bytes, so these helpers reproduce the
formatting rules rather than approximating them:

* ``multi`` is hashicorp/go-multierror's ``ListFormatFunc``: ``"1 error occurred:\\n\\t* …\\n\\n"``.
  Nested multierrors are embedded by ``%v``, which is how Nomad's nested
  "Task group … validation failed: N errors occurred:" bodies arise (docs/nomad-api.md §7).
* ``duration`` is Go's ``time.Duration.String`` (``10ns``, ``1.5s``, ``30m0s``, ``1h0m0s``).
* ``warnings`` is ``helper.MergeMultierrorWarnings`` (``"1 warning:\\n\\n* …"``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

_SECOND = 1_000_000_000


def multi(errors: Sequence[str]) -> str:
    """Go-multierror's default format; an empty list formats as ``""`` (ErrorOrNil is nil)."""
    if not errors:
        return ""
    if len(errors) == 1:
        return f"1 error occurred:\n\t* {errors[0]}\n\n"
    points = "\n\t".join(f"* {e}" for e in errors)
    return f"{len(errors)} errors occurred:\n\t{points}\n\n"


def warnings(items: Sequence[str]) -> str:
    """helper.MergeMultierrorWarnings (hashicorp/nomad helper/warning.go)."""
    if not items:
        return ""
    head = "1 warning:\n" if len(items) == 1 else f"{len(items)} warnings:\n"
    return head + "".join(f"\n* {w}" for w in items)


def _fraction(value: int, unit: int) -> str:
    whole, rest = divmod(value, unit)
    if not rest:
        return str(whole)
    digits = len(str(unit)) - 1
    return f"{whole}.{rest:0{digits}d}".rstrip("0")


def duration(ns: int) -> str:
    """Go's time.Duration.String()."""
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    u = abs(ns)
    if u < 1_000:
        return f"{sign}{u}ns"
    if u < 1_000_000:
        return f"{sign}{_fraction(u, 1_000)}µs"
    if u < _SECOND:
        return f"{sign}{_fraction(u, 1_000_000)}ms"
    secs, frac = divmod(u, _SECOND)
    hours, rem = divmod(secs, 3600)
    minutes, seconds = divmod(rem, 60)
    sec = _fraction(seconds * _SECOND + frac, _SECOND)
    if hours:
        return f"{sign}{hours}h{minutes}m{sec}s"
    if minutes:
        return f"{sign}{minutes}m{sec}s"
    return f"{sign}{sec}s"


def quote(text: str) -> str:
    """Go's ``%q`` for the strings Nomad quotes in its messages (printable UTF-8 kept)."""
    return json.dumps(text, ensure_ascii=False)


def seconds(n: float) -> int:
    """Nanoseconds in ``n`` seconds, for defaults written the way Go writes them."""
    return int(n * _SECOND)
