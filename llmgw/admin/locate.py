"""Where in pasted YAML an error's field is, so the add page can show it there.

Every definition error carries ``field``, a key path such as
``profiles[0].gpus`` or ``source`` — the decoder's, the catalog's and the
source check's alike. The page shows the message beside the line holding that
key. This module turns the path into a line number by walking the YAML's node
tree (which keeps each node's position), and nothing else: it decides no rule,
so the message the page shows stays the one the CLI prints.

Pure functions over text; no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import yaml

from llmgw.nesting import compose

_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")

# Lines of context shown around the flagged one.
CONTEXT = 2


@dataclass(frozen=True)
class Line:
    number: int      # 1-based, as editors count
    text: str
    flagged: bool


def key_path(field: str) -> list[str | int]:
    """``profiles[0].gpus`` -> ``["profiles", 0, "gpus"]``."""
    parts: list[str | int] = []
    for name, index in _PART.findall(field):
        parts.append(int(index) if index else name)
    return parts


def line_of(text: str, field: str | None) -> int | None:
    """The 1-based line of ``field`` in ``text``, of its nearest parent if the key is
    absent (a missing required field), or of a YAML syntax error; None if unknown."""
    try:
        node = compose(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        return mark.line + 1 if mark is not None else None
    if node is None or field is None:
        return None
    line: int | None = node.start_mark.line + 1 if field else None
    for part in key_path(field):
        if isinstance(node, yaml.MappingNode) and isinstance(part, str):
            pair = next(((k, v) for k, v in node.value
                         if isinstance(k, yaml.ScalarNode) and k.value == part), None)
            if pair is None:
                break
            key, node = pair
            line = key.start_mark.line + 1
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if part >= len(node.value):
                break
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line


def excerpt(text: str, line: int, context: int = CONTEXT) -> list[Line]:
    """The lines around ``line``, that one flagged."""
    lines = text.splitlines()
    first = max(1, line - context)
    last = min(len(lines), line + context)
    return [Line(number=n, text=lines[n - 1], flagged=n == line) for n in range(first, last + 1)]
