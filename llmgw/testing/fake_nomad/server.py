"""The HTTP face of the fake: a real server on loopback, speaking Nomad's conventions.

Conventions shared by every endpoint (docs/nomad-api.md "General wire conventions", §4.3, §7):

* errors are **plain text** (``Content-Type: text/plain``) with Nomad's exact wording;
  a wrong method is ``405 Invalid method``; an unknown ``/v1`` path is a bare 404;
* reads carry ``X-Nomad-Index``, ``X-Nomad-KnownLeader`` and ``X-Nomad-LastContact``;
  writes carry ``X-Nomad-Index``;
* blocking queries: ``?index=N&wait=D`` with Go duration syntax, default wait 5m,
  capped at 10m, plus up to wait/16 of jitter; a bad value is ``400 Invalid wait time``
  / ``400 Invalid index``; index 0 never blocks;
* ACLs (when enabled): no token → ``403 Permission denied``; a token it does not know
  → ``403 ACL token not found``; a token whose policies lack the endpoint's capability
  → ``403 Permission denied`` (``acl``); ``/v1/status/*`` needs none. The token comes
  from ``X-Nomad-Token`` or ``Authorization: Bearer``. ``/v1/acl/*`` answer for
  themselves (``acl_routes``). (The check runs before body
  decoding; Nomad decodes first, so a malformed body with a bad token is a 400 there
  and a 403 here.)
* a ``?region=`` other than the fake's region answers ``500 No path to region``.

Each connection gets a thread (``ThreadingHTTPServer``), so a blocking query never
holds up other requests. ``stop()`` closes the listener *and* every open connection,
which is what a client sees when the agent dies; ``start()`` binds the same port again.
"""

from __future__ import annotations

import contextlib
import json
import random
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, unquote_plus

import msgspec

from llmgw.testing.fake_nomad import acl
from llmgw.testing.fake_nomad.cluster import Cluster, NomadError

Json = dict[str, Any]
_MAX_WAIT = 600.0
_DURATION = re.compile(r"([0-9]*(?:\.[0-9]*)?)(ns|us|µs|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


class RecordedRequest(msgspec.Struct, frozen=True):
    """One request as the fake received it; ``body`` is parsed JSON when it parses."""

    method: str
    path: str
    query: dict[str, str]
    body: Any
    headers: dict[str, str]


class Injection(msgspec.Struct, kw_only=True):
    method: str
    path_regex: str
    status: int
    body: Any = ""
    times: int | None = None
    headers: dict[str, str] = {}
    hits: int = 0


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    token: str = ""
    params: dict[str, str] = field(default_factory=dict)
    acl: acl.Acl | None = None

    @property
    def namespace(self) -> str:
        return self.query.get("namespace") or "default"

    def flag(self, name: str) -> bool:
        return self.query.get(name, "").lower() in ("1", "t", "true")


@dataclass
class Response:
    status: int = 200
    body: Any = None
    text: str | bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)


def parse_duration(text: str) -> float:
    """Go's time.ParseDuration, in seconds; ValueError when Go would refuse it."""
    sign, rest = (-1.0, text[1:]) if text.startswith("-") else (1.0, text.lstrip("+"))
    if rest == "0":
        return 0.0
    total, pos = 0.0, 0
    for m in _DURATION.finditer(rest):
        if m.start() != pos or m.group(1) in ("", "."):
            raise ValueError(text)
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos != len(rest) or not rest:
        raise ValueError(text)
    return sign * total


class Api:
    """What route handlers need: the cluster, options, and the blocking-query helper."""

    def __init__(self, cluster: Cluster, *, strict: bool, region: str,
                 acls: acl.Registry | None) -> None:
        self.cluster = cluster
        self.store = cluster.store
        self.strict = strict
        self.region = region
        self.acls = acls
        # Nomad Variables by (namespace, path): ``variables.Variable`` records.
        self.variables: dict[tuple[str, str], Any] = {}
        self.running = False

    def blocking(self, req: Request, index: Callable[[], int],
                 body: Callable[[], Any]) -> Response:
        wait, min_index = 300.0, 0
        if req.query.get("wait"):
            try:
                wait = parse_duration(req.query["wait"])
            except ValueError:
                raise NomadError(400, "Invalid wait time") from None
        if req.query.get("index"):
            if not req.query["index"].isdigit():  # strconv.ParseUint
                raise NomadError(400, "Invalid index")
            min_index = int(req.query["index"])
        wait = min(max(wait, 0.0), _MAX_WAIT)
        wait += random.uniform(0, wait / 16)  # noqa: S311 - jitter, not security
        with self.store.cond:
            self.store.wait(lambda: index() if self.running else 2**63, min_index, wait)
            try:
                # Serialised under the lock: records keep changing once it is released.
                payload = json.dumps(body())
            except NomadError as exc:  # setMeta runs before the handler's 404 (job_endpoint.go)
                exc.headers.update(meta(index()))
                raise
            return Response(text=payload, headers={**meta(index()),
                                                   "Content-Type": "application/json"})


def meta(index: int) -> dict[str, str]:
    return {"X-Nomad-Index": str(index), "X-Nomad-KnownLeader": "true",
            "X-Nomad-LastContact": "0"}


Route = Callable[[Api, Request], Response]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, addr: tuple[str, int], handler: type[BaseHTTPRequestHandler],
                 app: HttpApp) -> None:
        self.app = app
        self.connections: set[socket.socket] = set()
        self.lock = threading.Lock()
        super().__init__(addr, handler)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        super().setup()
        with self.server.lock:
            self.server.connections.add(self.connection)

    def finish(self) -> None:
        with self.server.lock:
            self.server.connections.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        """Silence per-request logging; the request log is ``FakeNomad.requests``."""

    def _chunked(self) -> bytes:
        parts = []
        while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
            parts.append(self.rfile.read(size))
            self.rfile.readline()
        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
            pass  # trailers
        return b"".join(parts)

    def _dispatch(self) -> None:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = self._chunked()
        else:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
        path, _, raw_query = self.path.partition("?")
        query: dict[str, str] = {}
        for part in filter(None, raw_query.split("&")):
            key, _, value = part.partition("=")
            query[unquote_plus(key)] = unquote_plus(value)
        req = Request(method=self.command, path=unquote(path), query=query,
                      headers={k.lower(): v for k, v in self.headers.items()}, body=body)
        resp = self.server.app.handle(req)
        if resp.text is not None:
            payload = resp.text.encode() if isinstance(resp.text, str) else resp.text
            ctype = resp.headers.pop("Content-Type", "text/plain")
        else:
            payload = json.dumps(resp.body).encode()
            ctype = "application/json"
        try:
            self.send_response(resp.status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(payload)))
            for key, value in resp.headers.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(payload)
        except OSError:
            self.close_connection = True

    # http.server looks these up by name; the spelling is the stdlib's.
    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = do_OPTIONS = _dispatch  # noqa: N815


class HttpApp:
    """Request log, injected faults, ACLs and routing; then the route's response."""

    def __init__(self, api: Api, routes: list[tuple[re.Pattern[str], dict[str, Route]]]) -> None:
        self.api = api
        self.routes = routes
        self.log: list[RecordedRequest] = []
        self.injections: list[Injection] = []
        self.lock = threading.Lock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    def handle(self, req: Request) -> Response:
        try:
            parsed: Any = json.loads(req.body) if req.body else None
        except ValueError:
            parsed = req.body.decode("utf-8", errors="replace")
        with self.lock:
            self.log.append(RecordedRequest(req.method, req.path, dict(req.query), parsed,
                                            dict(req.headers)))
            injected = self._injected(req)
        if injected is not None:
            return injected
        req.token = self._token(req, parsed)
        try:
            denied = self._acl(req)
            if denied is not None:
                return denied
            if req.query.get("region") and req.query["region"] not in ("global",
                                                                        self.api.region):
                return Response(500, text="No path to region")
            resp = self._route(req)
            if req.acl is not None:
                resp.text = acl.filter_answer(req.acl, req, resp.text)
                resp.body = acl.filter_answer(req.acl, req, resp.body)
            return resp
        except NomadError as exc:
            return Response(exc.status, text=exc.body, headers=dict(exc.headers))

    def _injected(self, req: Request) -> Response | None:
        for inj in self.injections:
            if inj.method not in ("*", req.method) or not re.search(inj.path_regex, req.path):
                continue
            if inj.times is not None and inj.hits >= inj.times:
                continue
            inj.hits += 1
            if isinstance(inj.body, dict | list):
                return Response(inj.status, body=inj.body, headers=dict(inj.headers))
            return Response(inj.status, text=inj.body, headers=dict(inj.headers))
        return None

    @staticmethod
    def _token(req: Request, parsed: Any) -> str:
        if req.headers.get("x-nomad-token", "").strip():
            return req.headers["x-nomad-token"].strip()
        scheme, _, value = req.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip().split(" ")[0]
        if isinstance(parsed, dict) and isinstance(parsed.get("SecretID"), str):
            return str(parsed["SecretID"])
        return ""

    def _acl(self, req: Request) -> Response | None:
        if self.api.acls is None or req.path.startswith(("/v1/status/", "/v1/acl/")):
            return None   # the ACL endpoints judge their caller themselves (acl_routes)
        req.acl = acl.authorize(self.api.acls, req)   # NomadError(403) when refused
        return None

    def _route(self, req: Request) -> Response:
        for pattern, methods in self.routes:
            m = pattern.fullmatch(req.path)
            if m is None:
                continue
            handler = methods.get(req.method)
            if handler is None:
                return Response(405, text="Invalid method")
            req.params = m.groupdict()
            return handler(self.api, req)
        return Response(404, text="")

    # -- lifecycle ---------------------------------------------------------------
    def start(self, host: str, port: int) -> int:
        if self._server is not None:
            return self.port
        deadline = time.monotonic() + 10
        while True:
            try:
                self._server = _Server((host, port), _Handler, self)
                break
            except OSError:
                if port == 0 or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)  # the old socket may still be closing after stop()
        self.port = self._server.server_address[1]
        self.api.running = True
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.05},
                                        name=f"fake-nomad-http-{self.port}", daemon=True)
        self._thread.start()
        return self.port

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        self.api.running = False
        with self.api.store.cond:
            self.api.store.cond.notify_all()  # release blocking queries
        server.shutdown()
        server.server_close()
        with server.lock:
            for conn in list(server.connections):
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=10)
