"""``llmgw mirror unused`` and ``llmgw mirror remove``: which files the catalog still uses.

Both read the catalog in force through the control API (``GET
/api/v1/models``), because only the running llmgw knows what was added at
runtime, and both **refuse to go on when it cannot be read**. An empty
catalog and an unreachable one would otherwise produce the same answer —
every file is unused — and the obvious next step after that list is deletion.

``remove`` refuses while any entry's source names the path (or a directory
holding it, or a file inside it) and says to retire the entry first: a node
that has to refetch a deleted file cannot, and that failure arrives later, on
the node, looking like something else.

Sources are compared by path, never by spelling. ``HTTP://Mirror:8070/a/b/``,
``http://mirror.internal:8070//a/b`` and ``https://10.0.0.5/a/b`` all name
``a/b``: the scheme and host are normalised away entirely, and slashes are
collapsed and stripped. Ignoring the host is deliberate — a mirror is reached
by several names (a DNS name, its address, a load balancer) and none is
authoritative. The cost of that choice is a file kept that could have gone;
the cost of the opposite is a file deleted that nodes still fetch. A base URL
(``--mirror-url``) with a path prefix (a mirror behind a proxy at ``/models``)
has that prefix stripped. An ``hf://`` source names the directory the Nomad
job fetches it from (``llmgw.weights.layout.mirror_path``), so a Hub model
served through the mirror keeps its files too.

The deciding functions (``source_path``, ``users_of``, ``find_unused``) are
pure; the walk of the directory and the API call sit at the edges.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import msgspec

from llmgw.errors import DefinitionError, LlmgwError, NotFoundError, RefusedError, UnavailableError
from llmgw.weights import layout
from llmgw.weights.mirror.uses import MirrorFile, Use, find_unused, source_path, users_of

_REFUSAL = ("an unreachable catalog and an empty one would both make every file look unused, "
            "and the next step after that list is deletion")


class Catalog(msgspec.Struct, kw_only=True):
    uses: list[Use]
    stale: list[str]   # models with replicas started from an older definition


class CatalogReader(Protocol):
    """What is needed of the API client (``llmgw.cli.client.ApiClient``)."""

    def get(self, path: str) -> Any: ...


# -- the edges ------------------------------------------------------------------------------

def read_catalog(client: CatalogReader, root: str | Path, base_url: str | None,
                 doing: str) -> Catalog:
    """The mirror paths the catalog in force uses. Refuses (UnavailableError) when the
    catalog cannot be read; ``doing`` names what is being refused."""
    try:
        models = client.get("/api/v1/models")
    except LlmgwError as exc:
        raise UnavailableError(
            f"cannot read the catalog: {exc.message}. Refusing to {doing}: {_REFUSAL}"
        ) from None
    if not isinstance(models, list) or not all(
        isinstance(m, dict) and isinstance(m.get("name"), str)
        and isinstance(m.get("definition"), dict) for m in models
    ):
        raise UnavailableError(f"the API's model list is not a list of models with a name and "
                               f"a definition; refusing to {doing}: {_REFUSAL}")
    uses: list[Use] = []
    for m in models:
        source = m["definition"].get("source")
        if isinstance(source, str):
            path = source_path(source, root, base_url)
            if path is not None:
                uses.append(Use(model=m["name"], source=source, path=path))
    stale = [m["name"] for m in models if m.get("stale_replicas")]
    return Catalog(uses=uses, stale=stale)


def mirror_files(root: str | Path) -> list[MirrorFile]:
    """Every file a node could fetch: hidden names skipped, and a ``.sha256`` beside
    its file counted with that file rather than on its own."""
    base = Path(root)
    out: list[MirrorFile] = []
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if not layout.is_hidden(d))
        names = set(filenames)
        for name in sorted(filenames):
            if layout.is_hidden(name):
                continue
            if name.endswith(layout.SIDECAR) and name[: -len(layout.SIDECAR)] in names:
                continue
            full = Path(dirpath, name)
            rel = full.relative_to(base).as_posix()
            try:
                out.append(MirrorFile(path=rel, size=full.stat().st_size))
            except OSError:
                continue  # a dangling link fetches nothing
    return out


def unused(root: str | Path, client: CatalogReader, base_url: str | None = None
           ) -> tuple[list[MirrorFile], Catalog]:
    """Files no catalog entry uses, and the catalog read (for its warnings)."""
    _check_root(root)
    catalog = read_catalog(client, root, base_url, "list unused files")
    return find_unused(mirror_files(root), catalog.uses), catalog


def _check_root(root: str | Path) -> None:
    if not Path(root).is_dir():
        raise DefinitionError(f"mirror directory {root} does not exist; give --dir (or "
                              "LLMGW_MIRROR_DIR)", field="dir")


def _target(root: Path, path: str, base_url: str | None) -> str:
    """The mirror-relative path an argument of ``remove`` names."""
    if urlsplit(path).scheme.lower() in ("http", "https", "file"):
        rel = source_path(path, root, base_url)
    elif os.path.isabs(path):
        rel = source_path(path, root)
    elif ".." in Path(path).parts:
        raise DefinitionError(f"{path}: give a path inside the mirror, without '..'",
                              field="path")
    else:
        rel = layout.clean_path(path)
    if rel is None:
        raise DefinitionError(f"{path} is not inside the mirror directory {root}", field="path")
    if rel in ("", ".") or rel.startswith("../") or any(layout.is_hidden(p)
                                                         for p in rel.split("/")):
        raise DefinitionError(f"{path}: give a file or directory inside the mirror, not the "
                              "mirror itself or a hidden name", field="path")
    return rel


def remove(root: str | Path, path: str, client: CatalogReader, base_url: str | None = None
           ) -> list[str]:
    """Delete a file (with its ``.sha256``) or a directory from the mirror, unless a
    catalog entry uses it. Returns what was removed, relative to the mirror."""
    _check_root(root)
    base = Path(os.path.realpath(root))
    rel = _target(base, path, base_url)
    target = base / rel
    if not os.path.lexists(target):
        raise NotFoundError(f"{rel} is not on the mirror at {base}; `llmgw mirror unused` "
                            "lists what is there and unused")
    catalog = read_catalog(client, base, base_url, f"remove {rel}")
    users = users_of(rel, catalog.uses)
    if users:
        names = ", ".join(sorted({u.model for u in users}))
        sources = "; ".join(f"{u.model}: {u.source}" for u in users)
        raise RefusedError(
            f"{rel} is used by {names} ({sources}). Retire the entry first — point it at "
            "another source, or remove it (`llmgw ctl model remove`, or from server.yaml) — "
            "then remove the file: a node that must refetch a deleted file cannot"
        )
    removed: list[str] = []
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
        removed.append(rel + "/")
    else:
        target.unlink()
        removed.append(rel)
        side = target.with_name(target.name + layout.SIDECAR)
        if side.exists():
            side.unlink()
            removed.append(rel + layout.SIDECAR)
    parent = target.parent
    while parent != base and not any(parent.iterdir()):
        parent.rmdir()
        parent = parent.parent
    return removed
