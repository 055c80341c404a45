"""Rules on strings that only a regular expression states: the pattern once, with its sentence.

A model name, a team name and a key name are each one pattern, made here with
``rule`` and put in the type that is decoded (``Annotated[str, rule(...)]``):
msgspec checks it when a file, a request body or a stored row is decoded,
Litestar states it in the OpenAPI document (and checks it on a path or query
parameter), and the validation code that names what is wrong compiles the same
string. No second regex exists to drift from the first.

msgspec refuses a mismatch as "Expected `str` matching regex '…'"; ``explain``
puts the rule's sentence in its place, so a person reads the rule, not the regex.
"""

from __future__ import annotations

import re

import msgspec

# What each pattern made by ``rule`` means, by the pattern as msgspec quotes it.
_RULES: dict[str, str] = {}


def rule(pattern: str, says: str) -> msgspec.Meta:
    """The constraint that a string matches ``pattern``, described by ``says``.

    Python's ``$`` also matches before a final newline, so every pattern here
    ends ``$(?!\\n)``: the lookahead makes it mean to msgspec (``re.search``)
    what it means to a JSON Schema validator (ECMA-262, where it is a no-op).
    """
    if not pattern.endswith("$(?!\\n)"):
        raise ValueError(f"pattern {pattern!r} must end $(?!\\n) (see rule's docstring)")
    _RULES[repr(pattern)] = says
    return msgspec.Meta(pattern=pattern, description=says)


_MISMATCH = re.compile(r"^Expected `str` matching regex (?P<pattern>.*)$")


def explain(reason: str) -> str:
    """msgspec's ``reason`` for refusing a value, with a pattern made by ``rule`` put in words."""
    mismatch = _MISMATCH.match(reason)
    says = _RULES.get(mismatch.group("pattern")) if mismatch else None
    return f"must be {says}" if says else reason
