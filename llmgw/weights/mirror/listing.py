"""What a running mirror holds, read over HTTP from its directory listings.

The control plane reaches the mirror as nodes do, by its URL (``mirror:`` in
server.yaml); its directory is on another host. ``walk`` follows the JSON
listings ``llmgw mirror serve`` answers for a directory (``server.Listing``)
breadth first, and stops at ``limit`` directories or ``deadline`` seconds,
saying so, rather than holding a page for a mirror of millions of files.

``holdings`` (pure) groups the files by the directory a source names — a
mirror's layout is ``NAME/VERSION/…`` — with the catalog entries using each,
by the rules of ``usage`` (paths, never spellings; a directory is used when a
source names it, lies inside it, or holds it).
"""

from __future__ import annotations

import time
from collections import deque

import httpx
import msgspec

from llmgw.errors import UnavailableError
from llmgw.weights.mirror.server import Listing
from llmgw.weights.mirror.uses import MirrorFile, Use, users_of

_decode = msgspec.json.Decoder(Listing).decode


class Walk(msgspec.Struct, kw_only=True):
    files: list[MirrorFile]
    complete: bool               # False: stopped at the limit or the deadline


async def walk(base_url: str, *, limit: int = 2000, deadline: float = 10.0,
               client: httpx.AsyncClient | None = None) -> Walk:
    """Every file under ``base_url``'s listings (paths relative to it)."""
    base = base_url.rstrip("/") + "/"
    own = client is None
    http = client or httpx.AsyncClient(timeout=5.0)
    files: list[MirrorFile] = []
    todo: deque[str] = deque([""])
    seen = 0
    until = time.monotonic() + deadline
    try:
        while todo:
            if seen >= limit or time.monotonic() > until:
                return Walk(files=files, complete=False)
            rel = todo.popleft()
            seen += 1
            try:
                r = await http.get(base + rel, headers={"Accept": "application/json"})
            except httpx.HTTPError as exc:
                raise UnavailableError(f"the mirror at {base_url} cannot be read: {exc}; "
                                       "check that `llmgw mirror serve` runs there") from None
            if r.status_code != 200:
                raise UnavailableError(f"the mirror at {base_url} answered {r.status_code} "
                                       f"for {rel or '/'}")
            try:
                listing = _decode(r.content)
            except (msgspec.DecodeError, msgspec.ValidationError):
                raise UnavailableError(f"{base_url} does not answer directory listings; is "
                                       "it an llmgw mirror?") from None
            for e in listing.entries:
                if e.type == "directory":
                    todo.append(f"{rel}{e.name}/")
                elif not e.name.endswith(".sha256"):
                    files.append(MirrorFile(path=f"{rel}{e.name}", size=e.size or 0))
    finally:
        if own:
            await http.aclose()
    return Walk(files=files, complete=True)


class Held(msgspec.Struct, kw_only=True):
    path: str                    # NAME/VERSION (or the file, at the top)
    files: int
    size: int
    users: list[str]             # models whose source names it


class Missing(msgspec.Struct, kw_only=True):
    model: str
    source: str
    path: str


def holdings(files: list[MirrorFile], uses: list[Use], depth: int = 2
             ) -> tuple[list[Held], list[Missing]]:
    """The mirror's directories ``depth`` deep with their size and users, largest unused
    first; and the entries whose source names a path the mirror does not hold."""
    groups: dict[str, list[MirrorFile]] = {}
    for f in files:
        parts = f.path.split("/")
        groups.setdefault("/".join(parts[:depth]) if len(parts) > depth else f.path,
                          []).append(f)
    held = [Held(path=p, files=len(fs), size=sum(f.size for f in fs),
                 users=sorted({u.model for u in users_of(p, uses)}))
            for p, fs in groups.items()]
    held.sort(key=lambda h: (bool(h.users), -h.size, h.path))
    missing = [Missing(model=u.model, source=u.source, path=u.path) for u in uses
               if u.path and not any(f.path == u.path or f.path.startswith(u.path + "/")
                                     for f in files)]
    return held, missing
