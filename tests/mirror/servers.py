"""HTTP servers on loopback for the mirror tests.

``ThreadedMirror`` runs the real ``MirrorServer`` on its own event loop in a
thread, so blocking callers (``llmgw fetch``, CliRunner) can talk to it.
``FileServer`` serves one file with knobs for the ways a server goes wrong:
a transfer cut after N bytes, a Content-Length that lies, a transfer held
half-way until the test lets it go, Range ignored. ``JsonServer`` answers a
fixed JSON document (a stand-in control API). Each records the requests it
saw.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from llmgw.weights.mirror.server import MirrorServer


class ThreadedMirror:
    def __init__(self, root: Path) -> None:
        self.server = MirrorServer(root)
        self.loop = asyncio.new_event_loop()
        started = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.loop.run_until_complete(self.server.start("127.0.0.1", 0))
            started.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert started.wait(30), "mirror server did not start"
        self.url = self.server.url

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.close(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        self.loop.close()


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]


@dataclass
class FileServer:
    """Serves ``content`` at ``/<name>`` (and an optional ``/<name>.sha256``)."""

    content: bytes
    name: str = "model.bin"
    sidecar: str | None = None
    etag: str = '"v1"'
    cut_after: list[int | None] = field(default_factory=list)  # per GET, in order
    lie_extra: int = 0            # added to every promised length
    head_extra: int = 0           # added to the length HEAD promises only
    head_length: bool = True      # False: HEAD answers without a Content-Length
    ignore_range: bool = False
    ignore_if_range: bool = False  # honour Range whatever If-Range says
    hold_at: int | None = None    # pause the first GET after this many bytes…
    release: threading.Event = field(default_factory=threading.Event)  # …until set
    seen: list[Seen] = field(default_factory=list)
    holding: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                return None

            def do_HEAD(self) -> None:
                outer._record(self)
                if self.path != f"/{outer.name}":
                    self.send_error(404)
                    return
                self.send_response(200)
                length = len(outer.content) + outer.lie_extra + outer.head_extra
                if outer.head_length:
                    self.send_header("Content-Length", str(length))
                else:
                    self.send_header("Transfer-Encoding", "chunked")
                self.send_header("ETag", outer.etag)
                self.end_headers()

            def do_GET(self) -> None:
                outer._record(self)
                if outer.sidecar is not None and self.path == f"/{outer.name}.sha256":
                    body = outer.sidecar.encode()
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                if self.path != f"/{outer.name}":
                    self.send_error(404)
                    return
                outer._serve(self)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/{self.name}"
        self._gets = 0
        self._lock = threading.Lock()

    def _record(self, h: BaseHTTPRequestHandler) -> None:
        with self._lock:
            self.seen.append(Seen(h.command, h.path, dict(h.headers.items())))

    def body_gets(self) -> list[Seen]:
        return [s for s in self.seen if s.method == "GET" and s.path == f"/{self.name}"]

    def _serve(self, h: BaseHTTPRequestHandler) -> None:
        with self._lock:
            index = self._gets
            self._gets += 1
        total = len(self.content)
        start = 0
        rng = h.headers.get("Range")
        if_range = h.headers.get("If-Range")
        honour = rng and not self.ignore_range and (if_range is None or if_range == self.etag
                                                          or self.ignore_if_range)
        if honour:
            assert rng is not None
            start = int(rng.removeprefix("bytes=").split("-")[0])
            if start >= total:
                h.send_response(416)
                h.send_header("Content-Range", f"bytes */{total + self.lie_extra}")
                h.send_header("Content-Length", "0")
                h.end_headers()
                return
            h.send_response(206)
            h.send_header("Content-Range",
                          f"bytes {start}-{total - 1 + self.lie_extra}/{total + self.lie_extra}")
        else:
            h.send_response(200)
        h.send_header("ETag", self.etag)
        h.send_header("Content-Length", str(total - start + self.lie_extra))
        h.end_headers()
        body = self.content[start:]
        cut = self.cut_after[index] if index < len(self.cut_after) else None
        if cut is not None:
            body = body[:cut]
        if self.hold_at is not None and index == 0:
            h.wfile.write(body[: self.hold_at])
            h.wfile.flush()
            self.holding.set()
            self.release.wait(60)
            body = body[self.hold_at:]
        h.wfile.write(body)
        h.wfile.flush()
        if cut is not None or self.lie_extra:
            h.close_connection = True
            with contextlib.suppress(OSError):
                h.connection.shutdown(socket.SHUT_RDWR)

    def stop(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


class JsonServer:
    """Answers GET ``path`` with ``document`` (or ``status``); records requests."""

    def __init__(self, routes: dict[str, Any], status: int = 200) -> None:
        outer = self
        self.seen: list[Seen] = []
        self.routes = routes
        self.status = status

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                return None

            def do_GET(self) -> None:
                outer.seen.append(Seen("GET", self.path, dict(self.headers.items())))
                if self.path not in outer.routes:
                    self.send_error(404)
                    return
                body = json.dumps(outer.routes[self.path]).encode()
                self.send_response(outer.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def closed_port_url() -> str:
    """A loopback URL nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@contextlib.contextmanager
def running(factory: Callable[[], Any]) -> Iterator[Any]:
    server = factory()
    try:
        yield server
    finally:
        server.stop()
