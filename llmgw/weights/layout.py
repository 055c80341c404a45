"""The shape of a mirror directory, and the rules for naming things inside it.

The layout is ``<name>/<version>/<file>``: a version, once there, is never
replaced, so every node that fetched it holds the same bytes. Beside each file
lies ``<file>.sha256`` in ``sha256sum`` format (``sha256sum -c`` checks it),
written when the file was added and read by ``llmgw fetch``.

Names starting with a dot are never served or listed: ``mirror add`` builds a
version under a dot-name and renames it into place when complete, so a
half-downloaded version is invisible to the nodes.

``request_parts`` is the one place a request path becomes a path in the
mirror. It refuses, rather than cleans up, anything that could step outside
the directory: a cleaned-up ``..`` is how a traversal slips through a later
refactoring.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

SIDECAR = ".sha256"
_HEX64 = re.compile(r"[0-9a-f]{64}")
# A name or version: no separators, no leading dot, nothing a shell or URL mangles.
_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")


def request_parts(raw_path: str) -> tuple[tuple[str, ...], bool] | None:
    """The path segments a raw request path names, and whether it ends with '/'.

    None (answer 404) for anything that is not a plain path below the root:
    ``..`` or ``.`` in any spelling (``%2e%2e``), an encoded separator
    (``%2f``, ``%5c``), a backslash, a NUL, an empty segment (``//etc`` is an
    absolute path in disguise) or a hidden name.
    """
    path = raw_path.split("?", 1)[0].split("#", 1)[0]
    if not path.startswith("/"):
        return None
    trailing = path.endswith("/") and path != "/"
    inner = path[1:-1] if trailing else path[1:]
    if inner == "":
        return (), True
    parts: list[str] = []
    for raw in inner.split("/"):
        try:
            seg = unquote(raw, errors="strict")
        except UnicodeDecodeError:
            return None
        if (seg in ("", ".", "..") or seg.startswith(".") or "/" in seg or "\\" in seg
                or "\x00" in seg):
            return None
        parts.append(seg)
    return tuple(parts), trailing


def is_hidden(name: str) -> bool:
    return name.startswith(".")


def check_segment(value: str, what: str) -> str:
    """``value`` if it can be a name or version directory; ValueError saying why not."""
    if not _SEGMENT.fullmatch(value):
        raise ValueError(
            f"{what} {value!r} cannot be a mirror directory name: use letters, digits, "
            "'.', '_', '+' and '-', starting with a letter or digit"
        )
    return value


def slug(text: str) -> str:
    """A catalog-style name from a repository or file name: 'Qwen2.5-14B' → 'qwen2-5-14b'."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "model"


def format_sidecar(digest: str, filename: str) -> str:
    """The text of ``<file>.sha256``: ``sha256sum``'s own format."""
    return f"{digest}  {filename}\n"


def parse_sidecar(text: str) -> str | None:
    """The digest in a ``.sha256`` file (sha256sum format or the bare digest)."""
    first = text.strip().split(maxsplit=1)
    if not first:
        return None
    digest = first[0].lower()
    return digest if _HEX64.fullmatch(digest) else None
