"""The shape of a mirror directory, and the rules for naming things inside it.

The layout is ``<name>/<version>/<file>``: a version, once there, is never
replaced, so every node that fetched it holds the same bytes.

``mirror_path`` is the one mapping from a model's source to where it lies on
the mirror. The Nomad job's fetch URL, ``llmgw mirror add``, ``mirror
unused``/``mirror remove`` and the source check all call it, because each of
them computing the path its own way is how a job ends up fetching a directory
``mirror add`` never wrote, or ``mirror remove`` deletes one a job fetches. An
``hf://ORG/REPO[@REVISION][/FILE]`` source lies at
``<org>--<repo>/<revision>/[FILE]``: the organisation stays in the name (two
organisations publish repositories of the same name), ``--`` cannot occur in
a Hub name so the join is unambiguous, and the Hub resolves names without
regard to case, so the name is lower-cased. An unpinned source is the
version ``main``, frozen when it is added like every version; following a
newer commit means pinning the source to it. A revision is kept readable
where it can be (a commit, ``main``, ``v1.0``) and escaped where it cannot
(``refs/pr/3`` is ``refs+2Fpr+2F3``), so the mapping is total and two
revisions never share a directory.

Beside each file
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

import posixpath
import re
from urllib.parse import unquote, urlsplit

from llmgw.catalog.source import HfSource, Source, UrlSource

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


_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
UNPINNED = "main"


def revision_segment(revision: str | None) -> str:
    """The version directory of a Hub revision: itself where every character is plain,
    otherwise each other byte (and a leading '.' or '-') as ``+XX``."""
    if not revision:
        return UNPINNED
    out = []
    for i, ch in enumerate(revision):
        if ch in _PLAIN and not (i == 0 and ch in ".-"):
            out.append(ch)
        else:
            out.extend(f"+{b:02X}" for b in ch.encode("utf-8"))
    return "".join(out)


def hub_name(repo_id: str) -> str:
    """The name directory of a Hub repository: ``org--repo``, lower-cased."""
    org, _, repo = repo_id.partition("/")
    return f"{org}--{repo}".lower()


def clean_path(path: str) -> str:
    """``path`` with percent-encoding, repeated slashes and dot segments resolved, and no
    leading or trailing '/'."""
    collapsed = re.sub(r"/+", "/", "/" + unquote(path))
    return posixpath.normpath(collapsed).strip("/")


def mirror_path(source: Source, base_url: str | None = None) -> str | None:
    """Where ``source`` lies on the mirror, relative to its root; None when it is not there.

    A directory ends in '/'. An http(s) source names a path on the mirror whatever
    host it is written with (``llmgw.weights.mirror.usage`` says why the host is
    ignored), less the path prefix of ``base_url`` (a mirror served below
    ``/models`` behind a proxy).
    """
    match source:
        case HfSource(repo_id, revision, filename):
            return f"{hub_name(repo_id)}/{revision_segment(revision)}/{filename or ''}"
        case UrlSource(url):
            raw = urlsplit(url).path
            path = clean_path(raw)
            prefix = clean_path(urlsplit(base_url).path) if base_url else ""
            if prefix and (path == prefix or path.startswith(prefix + "/")):
                path = path[len(prefix):].strip("/")
            return path + "/" if path and raw.endswith("/") else path
    return None


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
