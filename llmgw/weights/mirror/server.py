"""``llmgw mirror serve``: the read-only HTTP file server every node fetches from.

**Read-only is stated here, not inherited.** The server answers exactly the
methods in ``METHODS`` — GET and HEAD — and the table is checked against
``SAFE_METHODS`` when this module is imported, so a handler added later for
PUT or DELETE stops the server from starting instead of quietly making the
mirror writable. A mirror writable by the thing reading from it is a way to
replace a model with one every node then fetches without complaint. Every
other method answers 405 with ``Allow: GET, HEAD``. Files are opened in one
place, ``_open_file``, with ``O_RDONLY``; nothing in this module creates,
writes, renames or deletes (a test reads the module to hold it to that).

Request paths become file paths only through ``layout.request_parts``, which
refuses ``..`` in every spelling, encoded separators and absolute paths; the
resolved path must then still lie inside the mirror directory, which catches
symbolic links that point out of it. All of those answer 404, the same as a
missing file, so probing learns nothing.

File bodies go through ``loop.sendfile`` (the kernel copies page cache to
socket), so memory stays flat however large the file and however many
downloads run at once. HTTP parsing, keep-alive and connection handling come
from aiohttp's low-level server, which is already a dependency: a parser of our
own would be the riskiest part of a server exposed to every node. Its
high-level ``FileResponse`` was rejected: it serves one range only and would
own the precondition logic that ``llmgw.weights.mirror.answer`` states and tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import mimetypes
import os
import secrets
import signal
import socket
import stat
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import BinaryIO, Final

import msgspec
from aiohttp import web
from aiohttp.web_request import BaseRequest

from llmgw.weights import layout
from llmgw.weights.mirror.answer import Answer, FileFacts, Slice, http_date, make_etag, plan

log = logging.getLogger("llmgw.weights.mirror")

SAFE_METHODS: Final = frozenset({"GET", "HEAD"})
LISTING_TYPE: Final = "application/json"


class Entry(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One item of a directory listing."""

    name: str
    type: str                     # "file" or "directory"
    size: int | None = None
    modified: str | None = None   # HTTP date of the file's last change


class Listing(msgspec.Struct, kw_only=True):
    """``GET /dir/``: what a directory holds, for tooling (``llmgw fetch`` of a
    directory, the source check)."""

    path: str
    entries: list[Entry]


_encode = msgspec.json.Encoder().encode


class _Opened(msgspec.Struct):
    fd: int
    facts: FileFacts


class _Dir(msgspec.Struct):
    rel: tuple[str, ...]  # below the mirror root; () is the root itself


def _content_type(name: str) -> str:
    if name.endswith(layout.SIDECAR):
        return "text/plain; charset=utf-8"
    guessed, _ = mimetypes.guess_type(name)
    return guessed or "application/octet-stream"


class MirrorServer:
    """Serves ``root`` read-only. ``start`` binds; ``close`` stops."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(os.path.realpath(root))
        if not self.root.is_dir():
            raise FileNotFoundError(f"mirror directory {root} does not exist or is not a directory")
        self._runner: web.ServerRunner | None = None
        self.port = 0
        self.host = ""

    # -- resolving a request to a file ---------------------------------------------------

    def _inside(self, real: str) -> bool:
        root = str(self.root)
        return real == root or real.startswith(root + os.sep)

    def _resolve(self, parts: tuple[str, ...]) -> tuple[str, os.stat_result] | None:
        real = os.path.realpath(self.root.joinpath(*parts))
        if not self._inside(real):
            return None  # a symbolic link pointing out of the mirror
        rel = os.path.relpath(real, self.root)
        if rel != "." and any(layout.is_hidden(p) for p in rel.split(os.sep)):
            return None  # a link into a version still being added
        try:
            return real, os.stat(real)
        except OSError:
            return None

    def _open_file(self, real: str, name: str) -> _Opened | None:
        """The one place a file is opened: read-only, never following a late link swap,
        never blocking on a FIFO.

        ``real`` was checked to lie inside the mirror, but a directory on the way can
        be swapped for a link between that check and this open, and O_NOFOLLOW guards
        only the last component. So the file is opened from the mirror's own
        descriptor one component at a time, each refusing to follow a link: what is
        opened is what was checked, or nothing."""
        rel = os.path.relpath(real, self.root).split(os.sep)
        if rel[0] in ("", ".", ".."):
            return None
        try:
            fd = _open_beneath(self.root, rel)
        except OSError:
            return None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            return None
        facts = FileFacts(size=st.st_size, mtime=st.st_mtime,
                          etag=make_etag(st.st_ino, st.st_size, st.st_mtime_ns),
                          content_type=_content_type(name))
        return _Opened(fd, facts)

    def _lookup(self, parts: tuple[str, ...]) -> _Opened | _Dir | None:
        found = self._resolve(parts)
        if found is None:
            return None
        real, st = found
        if stat.S_ISDIR(st.st_mode):
            rel = os.path.relpath(real, self.root)
            return _Dir(() if rel == "." else tuple(rel.split(os.sep)))
        if stat.S_ISREG(st.st_mode):
            return self._open_file(real, parts[-1] if parts else "")
        return None

    def _listing(self, rel: tuple[str, ...], url_path: str) -> bytes | None:
        """The JSON listing of ``root/rel``; None when it is no longer a directory there.

        The path was checked by ``_resolve``, but any directory on the way can be
        swapped for a link before it is read. So, as for files, the directory is
        opened from the mirror's own descriptor one component at a time, none
        followed if it is a link, and read and stat'ed through that descriptor:
        what is listed is the directory that was checked, or nothing."""
        try:
            fd = _open_dir_beneath(self.root, rel)
        except OSError:
            return None
        entries: list[Entry] = []
        try:
            with os.scandir(fd) as it:
                names = [item.name for item in it if not layout.is_hidden(item.name)]
            for name in names:
                entry = self._entry(fd, rel, name)
                if entry is not None:
                    entries.append(entry)
        finally:
            os.close(fd)
        entries.sort(key=lambda e: e.name)
        return _encode(Listing(path=url_path, entries=entries))

    def _entry(self, dir_fd: int, rel: tuple[str, ...], name: str) -> Entry | None:
        """One listed item, its facts taken without following a link out of the mirror."""
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            return None  # removed since the directory was read
        if stat.S_ISLNK(st.st_mode):
            # A link is listed only when it leads inside the mirror, with the facts of
            # what it leads to, read from a descriptor opened beneath the root.
            found = self._resolve((*rel, name))
            if found is None:
                return None
            target = os.path.relpath(found[0], self.root)
            if target == ".":
                return Entry(name=name, type="directory")
            st_target = _stat_beneath(self.root, target.split(os.sep))
            if st_target is None:
                return None
            st = st_target
        if stat.S_ISDIR(st.st_mode):
            return Entry(name=name, type="directory")
        if stat.S_ISREG(st.st_mode):
            return Entry(name=name, type="file", size=st.st_size,
                         modified=http_date(st.st_mtime))
        return None

    # -- answering -----------------------------------------------------------------------

    async def _get(self, request: BaseRequest) -> web.StreamResponse:
        return await self._answer(request, send_body=True)

    async def _head(self, request: BaseRequest) -> web.StreamResponse:
        return await self._answer(request, send_body=False)

    async def _answer(self, request: BaseRequest, *, send_body: bool) -> web.StreamResponse:
        parsed = layout.request_parts(request.raw_path)
        if parsed is None:
            return _not_found()
        parts, trailing = parsed
        loop = asyncio.get_running_loop()
        # stat and open may block on a slow disk; keep them off the event loop.
        lookup = loop.run_in_executor(None, self._lookup, parts)
        try:
            target = await asyncio.shield(lookup)
        except asyncio.CancelledError:
            # The client left while the file was being opened: close it when the
            # thread is done, or every abandoned request would leak a descriptor.
            lookup.add_done_callback(_close_abandoned)
            raise
        if target is None:
            return _not_found()
        if isinstance(target, _Dir):
            url_path = "/" + "".join(f"{p}/" for p in parts)
            if not trailing and parts:
                return web.Response(status=301, headers={"Location": url_path})
            body = await loop.run_in_executor(None, self._listing, target.rel, url_path)
            if body is None:
                return _not_found()
            return web.Response(body=body if send_body else None, status=200,
                                headers={"Content-Type": LISTING_TYPE,
                                         "Cache-Control": "no-cache",
                                         "Content-Length": str(len(body))})
        if trailing:
            os.close(target.fd)
            return _not_found()
        headers = {k.lower(): v for k, v in request.headers.items()}
        answer = plan(request.method, headers, target.facts, boundary=secrets.token_hex(16))
        with os.fdopen(target.fd, "rb", buffering=0) as fobj:
            return await _send(request, answer, fobj if send_body else None)

    async def _dispatch(self, request: BaseRequest) -> web.StreamResponse:
        handler = METHODS.get(request.method)
        if handler is None:
            return web.Response(
                status=405, text="the mirror is read-only: only GET and HEAD are answered\n",
                headers={"Allow": ", ".join(sorted(SAFE_METHODS))},
            )
        return await handler(self, request)

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            sock.close()
            raise
        # A thousand nodes starting at once should queue, not be refused.
        sock.listen(4096)
        sock.setblocking(False)
        server = web.Server(self._dispatch, access_log=None, handler_cancellation=True)
        self._runner = web.ServerRunner(server, shutdown_timeout=5.0)
        await self._runner.setup()
        await web.SockSite(self._runner, sock).start()
        self.host, self.port = sock.getsockname()[:2]

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


Handler = Callable[[MirrorServer, BaseRequest], Awaitable[web.StreamResponse]]

# The whole of what the mirror answers. Adding a method here that is not in
# SAFE_METHODS stops this module from importing (see _check_read_only).
METHODS: Final[Mapping[str, Handler]] = MappingProxyType({
    "GET": MirrorServer._get,
    "HEAD": MirrorServer._head,
})


def _check_read_only(methods: Mapping[str, Handler]) -> None:
    unsafe = set(methods) - SAFE_METHODS
    if unsafe:
        raise RuntimeError(
            f"the mirror server must stay read-only but answers {sorted(unsafe)}; "
            "writes to the mirror belong to `llmgw mirror add`, run by a person on the host"
        )


_check_read_only(METHODS)


def _open_beneath(root: Path, rel: list[str]) -> int:
    """Open ``root/rel[0]/…/rel[-1]`` read-only without following any link on the way."""
    dir_flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in rel[:-1]:
            inner = os.open(part, dir_flags, dir_fd=fd)
            os.close(fd)
            fd = inner
        return os.open(rel[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                       dir_fd=fd)
    finally:
        os.close(fd)


def _open_dir_beneath(root: Path, rel: tuple[str, ...]) -> int:
    """Open the directory ``root/rel[0]/…/rel[-1]`` without following any link on the way."""
    dir_flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    for part in rel:
        try:
            inner = os.open(part, dir_flags, dir_fd=fd)
        finally:
            os.close(fd)
        fd = inner
    return fd


def _stat_beneath(root: Path, rel: list[str]) -> os.stat_result | None:
    """The facts of ``root/rel``, opened component by component, no link followed."""
    try:
        fd = _open_beneath(root, rel)
    except OSError:
        return None
    try:
        return os.fstat(fd)
    finally:
        os.close(fd)


def _close_abandoned(lookup: asyncio.Future[_Opened | _Dir | None]) -> None:
    if not lookup.cancelled() and lookup.exception() is None:
        found = lookup.result()
        if isinstance(found, _Opened):
            os.close(found.fd)


def _not_found() -> web.Response:
    return web.Response(status=404, text="not found\n")


async def _send(request: BaseRequest, answer: Answer, fobj: BinaryIO | None) -> web.StreamResponse:
    """Carry out an answer: literal parts written, file slices sent by the kernel."""
    resp = web.StreamResponse(status=answer.status, headers=answer.headers)
    if answer.status != 304:
        resp.content_length = answer.length
    loop = asyncio.get_running_loop()
    transport = request.transport
    try:
        await resp.prepare(request)
        if fobj is not None and request.method != "HEAD" and answer.status != 304:
            for part in answer.body:
                if transport is None or transport.is_closing():
                    raise ConnectionResetError("the client went away")
                if isinstance(part, Slice):
                    # fallback=True: a transport without sendfile (TLS) reads in chunks.
                    await loop.sendfile(transport, fobj, part.offset, part.length)
                else:
                    await resp.write(part)
        await resp.write_eof()
    except ConnectionError:
        # A client leaving mid-answer is ordinary (a node restarted, a fetch was
        # cancelled): drop the connection, since the answer cannot be completed,
        # and let the server forget it without logging a traceback.
        resp.force_close()
        if transport is not None:
            transport.abort()
    return resp


async def serve_forever(root: str | Path, host: str, port: int,
                        ready: Callable[[MirrorServer], None] | None = None) -> None:
    """Run the server until cancelled (Ctrl-C) or sent SIGTERM (a service manager's stop);
    downloads in flight get a few seconds to finish."""
    server = MirrorServer(root)
    await server.start(host, port)
    stop = asyncio.Event()
    with contextlib.suppress(NotImplementedError, RuntimeError):
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    if ready is not None:
        ready(server)
    try:
        await stop.wait()
    finally:
        await server.close()


def raise_file_limit() -> int:
    """Lift the soft open-file limit to the hard one: each download holds a socket and
    a file, and the default 1024 caps the mirror at ~500 concurrent downloads."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return target
        except (ValueError, OSError):
            return soft
    return soft
