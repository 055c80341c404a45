"""The source check: a model's weights exist and can be reached, checked at add time.

One module, used by the API (``POST /api/v1/source-check`` and adding a model,
which is what the admin page does) and by ``llmgw ctl model add`` through it,
so a model added any way is checked: a typo or a mirror that was down
otherwise becomes a replica failing on a node minutes later, with an error
naming the node instead of the source.

It only reads — HEAD and GET against the Hub or the mirror; neither the
gateway nor the API ever writes to the mirror.

What is checked, by the source's form:

- ``hf://org/repo[@revision][/file]`` with a mirror configured: the mirror
  holds it at ``llmgw.weights.layout.mirror_path``, where the Nomad job
  fetches it (the Hub itself is not asked: no node reads from it).
- ``hf://org/repo[@revision][/file]`` without a mirror: the repository and revision exist; the
  named file (or, for a whole repository, ``config.json`` or its first file)
  answers a metadata request — which is where a gated repository refuses a
  server without access, so that is caught now rather than on the node.
- ``http(s)://…`` (the mirror, or any server): HEAD answers with a length. A
  URL ending in '/' names a mirror directory; its JSON listing must answer
  and hold at least one file.
- ``pkg:<distribution>`` (the embedded mode's model shipped in a Python
  package): the distribution is installed where the server runs.
- anything else is a local path (the embedded mode): it exists.

Every failure is a ``DefinitionError`` on field ``source`` naming the source
and the reason: not found, gated or unauthorised, unreachable.

It goes only where a model can come from (``reach``): each connection,
redirect hops included, is to a host ``Reach`` allows, at an address it
allowed (the resolver used is the one that checked), and redirects are
followed here, never by the HTTP client, so a redirect to a denied place goes
nowhere. A failure to connect — refused, timed out, reset, not HTTP, a name
that does not resolve, a host not allowed — is one message, the same for all:
the answer tells a caller nothing about which ports are open on which hosts.
What a server that speaks HTTP answers (404, 401, no length) is reported as
before: that is the server's word, not the network's.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import ipaddress
import os
import socket
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING
from urllib.parse import urljoin, urlsplit

import aiohttp
import msgspec
from aiohttp.abc import AbstractResolver, ResolveResult

from llmgw.catalog.source import HfSource, PathSource, PkgSource, Source, UrlSource
from llmgw.config import ServerConfig
from llmgw.errors import ConfigError, DefinitionError
from llmgw.weights import layout
from llmgw.weights.hub import HfHub, Hub, HubError
from llmgw.weights.reach import Address, Reach, numeric_host

if TYPE_CHECKING:
    from llmgw.catalog.model import Model


def _fail(source: Source, reason: str) -> DefinitionError:
    # ``shown``: these errors reach API clients, the admin page and logs, so a
    # password in a URL is masked.
    return DefinitionError(f"source {source.shown!r}: {reason}", field="source")


# -- Hugging Face -------------------------------------------------------------------------

def _check_hf(src: HfSource, hub: Hub) -> None:
    """Blocking: run in a thread. Raises HubError."""
    info = hub.repo_info(src.repo_id, src.revision)
    filename = src.filename
    if filename is None:
        names = [f.path for f in info.files]
        filename = "config.json" if "config.json" in names else next(iter(names), None)
    if filename is None:
        return  # an empty repository exists; nothing further to reach
    hub.file_size(src.repo_id, filename, info.sha or src.revision)


async def _hf(src: HfSource, hub: Hub, seconds: float) -> None:
    try:
        # Two requests at most, each bounded by the hub's timeout; the thread cannot
        # be cancelled, so the overall bound only stops the wait for it.
        await asyncio.wait_for(asyncio.to_thread(_check_hf, src, hub), seconds * 2 + 1)
    except TimeoutError:
        raise _fail(src, f"the Hugging Face Hub at {hub.endpoint} did not answer within "
                         f"{seconds:g}s; unreachable") from None
    except HubError as exc:
        raise _fail(src, exc.reason) from None


# -- HTTP (the mirror, or any server) -----------------------------------------------------

class _Listing(msgspec.Struct):
    entries: list[dict[str, object]]


MAX_REDIRECTS = 5


class _Blocked(Exception):  # noqa: N818 - a signal inside the check, never raised out
    """A connection the reach does not allow (reported like any other that failed)."""


class _ReachResolver(AbstractResolver):
    """Resolves as the system does, then keeps the connection to the addresses ``reach``
    allows: the addresses checked are the addresses connected to (no rebinding)."""

    def __init__(self, reach: Reach) -> None:
        self.reach = reach

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        infos = await asyncio.get_running_loop().getaddrinfo(
            host, port, type=socket.SOCK_STREAM, family=family)
        found: list[ResolveResult] = []
        addresses: list[Address] = []
        for fam, _, proto, _, sockaddr in infos:
            ip = str(sockaddr[0]).split("%", 1)[0]
            addresses.append(ipaddress.ip_address(ip))
            found.append({"hostname": host, "host": ip, "port": int(sockaddr[1]),
                          "family": fam, "proto": proto, "flags": socket.AI_NUMERICHOST})
        if not self.reach.host_allowed(host, addresses):
            raise _Blocked(host)
        return found

    async def close(self) -> None:
        return None


def _url_allowed(url: str, reach: Reach) -> bool:
    """The part of the check that needs no resolver: an http(s) URL whose host, if it
    is an address in any spelling, is allowed (names are judged when resolved)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return False
    numeric = numeric_host(parts.hostname)
    return numeric is None or reach.host_allowed(parts.hostname, [numeric])


def _on_mirror(url: str, mirror: str | None) -> bool:
    if not mirror:
        return False
    a, b = urlsplit(url), urlsplit(mirror)
    return (a.hostname or "").lower() == (b.hostname or "").lower() and \
        (a.port or 0) == (b.port or 0)


async def _http(source: Source, url: str, mirror: str | None, seconds: float,
                reach: Reach) -> None:
    label = "the mirror" if _on_mirror(url, mirror) else "the server"
    hint = "; is `llmgw mirror serve` running there?" if label == "the mirror" else ""
    if isinstance(source, HfSource):
        missing = (f"not on the mirror at {layout.mirror_path(source)}, where Nomad jobs "
                   f"fetch it: add it there with `llmgw mirror add {source.text}`")
    else:
        missing = f"not found: {label} answered HTTP 404; check the path"
    # One answer for every way of not reaching a server (see the module).
    unreachable = _fail(source, f"{label} cannot be reached, or is not a place model sources "
                                f"may come from (source_check.allow_hosts); unreachable{hint}")
    connector = aiohttp.TCPConnector(resolver=_ReachResolver(reach), use_dns_cache=False)
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=seconds),
                                         connector=connector) as http:
            final, status, length = await _head(http, url, reach)
            if status == 404:
                raise _fail(source, missing)
            if status in (401, 403):
                raise _fail(source, f"unauthorised: {label} answered HTTP {status}")
            if status >= 400:
                raise _fail(source, f"{label} answered HTTP {status}; unreachable or failing")
            if final.endswith("/"):
                async with http.get(final, headers={"Accept": "application/json"}) as resp:
                    body = await resp.read()
                await asyncio.to_thread(_check_listing, source, body)
                return
    except (TimeoutError, aiohttp.ClientError, OSError, _Blocked):
        raise unreachable from None
    if length is None or not length.isdigit():
        raise _fail(source, f"{label} answers HEAD without a Content-Length, so a node could "
                            "not tell a complete download from a cut one")
    if int(length) == 0:
        raise _fail(source, f"{label} serves an empty file (0 bytes)")


async def _head(http: aiohttp.ClientSession, url: str,
                reach: Reach) -> tuple[str, int, str | None]:
    """HEAD ``url``, following redirects to allowed places only: (final URL, status,
    Content-Length)."""
    for _ in range(MAX_REDIRECTS + 1):
        if not _url_allowed(url, reach):
            raise _Blocked(url)
        async with http.head(url, allow_redirects=False) as resp:
            status = resp.status
            location = resp.headers.get("Location")
            if status in (301, 302, 303, 307, 308) and location:
                url = urljoin(url, location)
                continue
            return str(resp.url), status, resp.headers.get("Content-Length")
    raise _Blocked(url)


def _check_listing(source: Source, body: bytes) -> None:
    try:
        listing = msgspec.json.decode(body, type=_Listing)
    except msgspec.DecodeError:
        raise _fail(source, "a URL ending in '/' must be a directory on an `llmgw mirror "
                            "serve` mirror, and this one has no JSON listing") from None
    if not any(e.get("type") in ("file", "directory") for e in listing.entries):
        raise _fail(source, "the mirror directory is empty; add the model with "
                            "`llmgw mirror add` first")


# -- a package, a local path ---------------------------------------------------------------

async def _pkg(source: PkgSource) -> None:
    try:
        await asyncio.to_thread(importlib.metadata.distribution, source.distribution)
    except importlib.metadata.PackageNotFoundError:
        name = source.distribution
        raise _fail(source, f"the Python package {name!r} is not installed where the server "
                            f"runs; install it there (pip install {name})") from None


async def _local(source: PathSource, reach: Reach) -> None:
    if not reach.any_local_path:
        # Judged before anything is looked up, and answered alike for a path that
        # exists and one that does not; ``~`` is not expanded.
        path = source.path
        if not path.startswith("~"):
            path = await asyncio.to_thread(os.path.realpath, path)
        if not reach.path_allowed(path):
            roots = ", ".join(reach.local_roots) or "none configured"
            raise _fail(source, "this server checks local paths only under "
                                f"source_check.local_roots ({roots})")
    path = await asyncio.to_thread(os.path.expanduser, source.path)
    if not await asyncio.to_thread(os.path.exists, path):
        raise _fail(source, f"not found: no file or directory {path!r} on the server's host "
                            f"(relative to {os.getcwd()!r}); a local path serves the "
                            "embedded mode, where the server runs the engine itself")


# -- the one entry point -------------------------------------------------------------------

# `timeout` bounds each request made (and is handed to the HTTP clients), which
# asyncio.timeout around the call could not do for the Hub's blocking client.
async def check_source(source: Source, *, mirror: str | None = None,
                       hf_token: str | None = None, hub: Hub | None = None,
                       timeout: float = 10, reach: Reach | None = None) -> None:  # noqa: ASYNC109
    """Raise DefinitionError(field="source") unless ``source`` exists and is reachable.

    ``mirror`` is the configured mirror's base URL (errors then speak of the
    mirror); ``hub`` defaults to the Hugging Face Hub at ``HF_ENDPOINT`` with
    ``hf_token`` (or HF_TOKEN). ``reach``: where it may go; by default the
    mirror and public addresses, and any local path.
    """
    if reach is None:
        reach = Reach.of(mirror_host=_host(mirror))
    match source:
        case HfSource() if mirror:
            # A node reads a Hub model from the mirror, never from the Hub: the mirror
            # is what must hold it (``layout.mirror_path``, the path the job fetches).
            await _http(source, f"{mirror.rstrip('/')}/{layout.mirror_path(source)}", mirror,
                        timeout, reach)
        case HfSource():
            await _hf(source, hub or HfHub(token=hf_token, timeout=timeout), timeout)
        case UrlSource():
            await _http(source, source.url, mirror, timeout, reach)
        case PkgSource():
            await _pkg(source)
        case PathSource():
            await _local(source, reach)


def _host(url: str | None) -> str | None:
    return urlsplit(url).hostname if url else None


def reach_of(config: ServerConfig) -> Reach:
    """The source check's reach under ``config``: its ``source_check:``, its mirror, and
    whether it listens beyond loopback (then local roots only). ConfigError if bad."""
    sc = config.source_check
    try:
        return Reach.of(allow_hosts=sc.allow_hosts, deny_hosts=sc.deny_hosts,
                        mirror_host=_host(config.mirror), local_roots=sc.local_roots,
                        any_local_path=_loopback_listener(config.listen))
    except ValueError as exc:
        raise ConfigError(str(exc), field="source_check") from None


def _loopback_listener(listen: str) -> bool:
    host = listen.rpartition(":")[0].strip("[]") if ":" in listen else listen
    if host == "localhost":
        return True
    numeric = numeric_host(host)
    return numeric is not None and numeric.is_loopback


def model_source_checker(mirror: str | None = None, hf_token: str | None = None,
                         timeout: float = 10, reach: Reach | None = None,
                         ) -> Callable[[Model], Awaitable[None]]:
    """What ``AppContext.source_check`` expects: check a model's source, if it has one
    (an external model routes to ``upstream`` and has none)."""

    async def check(model: Model) -> None:
        if model.source is not None and not model.external:
            await check_source(model.source, mirror=mirror, hf_token=hf_token,
                               timeout=timeout, reach=reach)

    return check
