"""How deeply nested a JSON or YAML document may be, checked before it is decoded.

msgspec, PyYAML's composer and Python's ``json`` all recurse once per level of
nesting. A body of a thousand ``[`` is a few kilobytes and raises
RecursionError deep inside the decoder: a 500 with a traceback for every
request, thousands of log lines, and a command-line tool that crashes instead
of naming the file. So every place JSON or YAML enters llmgw bounds the depth
first and refuses a deeper document as the client's mistake (400, or the CLI's
definition error), naming the file or body it read.

The bound, ``MAX_DEPTH`` (``MAX_YAML_DEPTH`` for YAML), is far beyond
anything a person writes (a model definition is four levels deep; a chat
request with a JSON schema in ``response_format`` rarely passes twenty) and
far below the interpreter's recursion limit, so the decoders never get near
it.

The JSON check costs two ``bytes.count`` calls for an ordinary request: a
document with fewer brackets than the bound cannot nest deeper than it. Only
a body with more brackets is measured exactly, with its strings (where
brackets mean nothing) taken out, all in C loops.
"""

from __future__ import annotations

import operator
import re
from itertools import accumulate, repeat
from typing import Any

import yaml

from llmgw.errors import DefinitionError

MAX_DEPTH = 128
# PyYAML's composer spends four Python frames on each level (the interpreter's
# limit is 1,000 frames, shared with whatever called it), so YAML gets a lower
# bound; a server.yaml is six levels deep.
MAX_YAML_DEPTH = 64

# A JSON string, escapes included (the unrolled form: no backtracking per character).
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
# Opening brackets become 2 and closing ones 0, every other byte is dropped:
# each byte minus one is then the step in depth.
_STEPS = bytes.maketrans(b"[{]}", b"\x02\x02\x00\x00")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[{]}")


def json_depth(data: bytes | str, limit: int = MAX_DEPTH) -> int:
    """How deeply ``data`` nests, exactly when it is more than ``limit``, else at most ``limit``.

    Brackets inside strings do not count. A document that is not JSON is
    measured all the same (its unmatched openers count), so that a decoder
    reading it as far as it goes never recurses deeper than the result.
    """
    raw = data.encode() if isinstance(data, str) else data
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return min(limit, raw.count(b"[") + raw.count(b"{"))
    steps = _STRING.sub(b"", raw).translate(_STEPS, _NOT_BRACKETS)
    depth: int = max(accumulate(map(operator.sub, steps, repeat(1)), initial=0))
    return depth


def check_json_depth(data: bytes | str, *, source: str, limit: int = MAX_DEPTH) -> None:
    """DefinitionError naming ``source`` when ``data`` nests deeper than ``limit``."""
    if json_depth(data, limit) > limit:
        raise DefinitionError(too_deep(source, limit))


def too_deep(source: str, limit: int = MAX_DEPTH) -> str:
    return (f"{source}: nested more than {limit} levels deep (objects and arrays within "
            "each other); no request or definition llmgw reads needs that many")


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a document nested deeper than ``MAX_YAML_DEPTH``.

    The composer builds the node tree recursively, one call per level; the
    count is kept there, so nothing deeper is ever composed or constructed.
    """

    depth_limit = MAX_YAML_DEPTH

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > self.depth_limit:
                event = self.peek_event()  # type: ignore[no-untyped-call]
                raise yaml.composer.ComposerError(
                    None, None,
                    f"nested more than {self.depth_limit} levels deep (mappings and lists "
                    "within each other)", event.start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def safe_load(data: bytes | str) -> Any:
    """``yaml.safe_load`` with the depth bounded; a deeper document is a YAMLError."""
    return yaml.load(data, Loader=_BoundedLoader)  # noqa: S506 - a SafeLoader subclass


def compose(data: bytes | str) -> yaml.Node | None:
    """``yaml.compose`` (the node tree, with line numbers) with the depth bounded."""
    node: yaml.Node | None = yaml.compose(data, Loader=_BoundedLoader)
    return node
