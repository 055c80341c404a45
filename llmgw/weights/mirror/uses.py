"""Which catalog entries use which paths on the mirror: the pure decisions of
``llmgw.weights.mirror.usage``, apart from its removal so that a reader (the admin
console's mirror page) can import them without importing what deletes files."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import unquote, urlsplit

import msgspec

from llmgw.catalog.source import HfSource, PathSource, UrlSource, parse_source
from llmgw.weights import layout


class MirrorFile(msgspec.Struct, kw_only=True):
    path: str   # relative to the mirror directory, '/'-separated
    size: int


class Use(msgspec.Struct, frozen=True, kw_only=True):
    """A catalog entry naming a path on the mirror ('' is the whole mirror)."""

    model: str
    source: str
    path: str


def source_path(source: str, root: str | Path, base_url: str | None = None) -> str | None:
    """The mirror-relative path ``source`` names (no trailing '/'), or None when it names
    nothing on it: an http(s) or hf:// source through ``layout.mirror_path`` — the
    mapping the Nomad job fetches by — and a local path inside ``root`` as itself."""
    try:
        parsed = parse_source(source)
    except ValueError:
        return None
    if isinstance(parsed, HfSource | UrlSource):
        path = layout.mirror_path(parsed, base_url)
        return path.rstrip("/") if path is not None else None
    parts = urlsplit(source)
    if isinstance(parsed, PathSource) and source.startswith(("/", "file:")):
        local = os.path.realpath(unquote(parts.path) if parts.scheme == "file" else source)
        real_root = os.path.realpath(root)
        if local == real_root:
            return ""
        if local.startswith(real_root + os.sep):
            return os.path.relpath(local, real_root).replace(os.sep, "/")
    return None


def _overlaps(a: str, b: str) -> bool:
    """One path is the other, or lies inside it."""
    return "" in (a, b) or a == b or a.startswith(b + "/") or b.startswith(a + "/")


def users_of(path: str, uses: list[Use]) -> list[Use]:
    """The entries whose source is ``path``, holds it, or lies inside it. A file's
    ``.sha256`` is used by whoever uses the file: without it ``llmgw fetch`` on the
    nodes falls back to checking the length only."""
    of_file = path.removesuffix(layout.SIDECAR)
    return [u for u in uses if _overlaps(path, u.path) or _overlaps(of_file, u.path)]


def find_unused(files: list[MirrorFile], uses: list[Use]) -> list[MirrorFile]:
    return [f for f in files
            if not any(u.path in ("", f.path) or f.path.startswith(u.path + "/")
                       for u in uses)]
