"""The source check is no port scanner: it goes only where a model can come from, follows no
redirect elsewhere, reads every spelling of an address, and tells nothing of closed ports or
files outside its local roots."""

from __future__ import annotations

import ipaddress
import os
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from llmgw.catalog.decode import decode_value
from llmgw.catalog.source import Source
from llmgw.config import ServerConfig, SourceCheckConfig
from llmgw.errors import DefinitionError
from llmgw.weights.check import check_source, reach_of
from llmgw.weights.reach import Reach, numeric_host
from tests.mirror.servers import closed_port_url

LOOPBACK = Reach.of(allow_hosts=["127.0.0.1"])


class _Recorder:
    """An HTTP server on ``host`` that answers HEAD with a length, or redirects to
    ``location``; it records every request it gets."""

    def __init__(self, host: str = "127.0.0.1", location: str | None = None) -> None:
        self.seen: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                return None

            def do_HEAD(self) -> None:
                outer.seen.append(self.path)
                if location is not None:
                    self.send_response(302)
                    self.send_header("Location", location)
                    self.send_header("Content-Length", "0")
                else:
                    self.send_response(200)
                    self.send_header("Content-Length", "64")
                self.end_headers()

        self.httpd = ThreadingHTTPServer((host, 0), Handler)
        self.httpd.daemon_threads = True
        self.port = int(self.httpd.server_address[1])
        self.url = f"http://{host}:{self.port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def recorder() -> Iterator[_Recorder]:
    server = _Recorder()
    yield server
    server.stop()


async def _message(source: str, **kw: Any) -> str:
    with pytest.raises(DefinitionError) as err:
        await check_source(decode_value(source, Source, source="source"), **kw)
    assert err.value.field == "source"
    return err.value.message


def test_every_spelling_of_an_address_is_read_as_the_resolver_reads_it() -> None:
    """Hex, decimal, octal and short forms, and IPv4-mapped IPv6, are their address."""
    loopback = ipaddress.ip_address("127.0.0.1")
    for spelling in ("0x7f000001", "2130706433", "0177.0.0.1", "127.1", "0x7f.1",
                     "[::ffff:127.0.0.1]", "127.0.0.1."):
        assert numeric_host(spelling) == loopback, spelling
    assert numeric_host("mirror.internal") is None
    assert numeric_host("256.1.1.1") is None


def test_the_default_reach_allows_public_hosts_and_the_mirror_and_nothing_internal() -> None:
    """Loopback, link-local (metadata), private and shared addresses are denied unless
    they are the mirror or allowed by name or network; a deny beats every allow."""
    reach = Reach.of(mirror_host="10.0.0.5", allow_hosts=["models.lan", "10.9.0.0/16"],
                     deny_hosts=["10.9.9.9"])
    ip = ipaddress.ip_address
    assert reach.host_allowed("203.0.113.7", [ip("203.0.113.7")]) is False  # TEST-NET-3
    assert reach.host_allowed("files.example", [ip("8.8.8.8")])
    for internal in ("127.0.0.1", "169.254.169.254", "192.168.1.1", "172.16.0.1",
                     "100.64.0.1", "0.0.0.0", "::1", "fd00::1"):
        assert not reach.host_allowed(internal, [ip(internal)]), internal
    assert reach.host_allowed("10.0.0.5", [ip("10.0.0.5")])
    assert reach.host_allowed("0x0a000005", [])                     # the mirror, in hex
    assert reach.host_allowed("models.lan", [ip("192.168.7.7")])
    assert reach.host_allowed("a.lan", [ip("10.9.1.1")])
    assert not reach.host_allowed("10.9.9.9", [ip("10.9.9.9")])
    # A name resolving to a public and an internal address is judged by the worst.
    assert not reach.host_allowed("rebind.example", [ip("8.8.8.8"), ip("127.0.0.1")])


async def test_an_open_port_and_a_closed_one_answer_the_same(recorder: _Recorder) -> None:
    """Denied (the default) or allowed, a port that speaks no HTTP, a closed port and a
    name that does not resolve are refused with one message: no open/closed oracle."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        open_port = listener.getsockname()[1]
        closed = closed_port_url()
        for reach in (None, LOOPBACK):
            kw: dict[str, Any] = {"reach": reach, "timeout": 2}
            said_open = await _message(f"http://127.0.0.1:{open_port}/x.gguf", **kw)
            said_closed = await _message(f"{closed}/x.gguf", **kw)
            said_nowhere = await _message("http://no-such-host.invalid/x.gguf", **kw)
            assert said_open.replace(str(open_port), "P") == \
                said_closed.replace(closed.rsplit(":", 1)[1], "P")
            assert said_nowhere.split(": ", 1)[1] == said_open.split(": ", 1)[1]
    # The default reach never connected to loopback at all.
    assert recorder.seen == []


async def test_numeric_spellings_of_loopback_do_not_reach_it(recorder: _Recorder) -> None:
    """http://0x7f000001/ and its kind are loopback, denied without a request sent."""
    for host in ("0x7f000001", "2130706433", "127.1", "0177.0.0.1"):
        await _message(f"http://{host}:{recorder.port}/x.gguf", timeout=2)
    assert recorder.seen == []
    await check_source(decode_value(f"{recorder.url}/x.gguf", Source, source="source"),
                       reach=LOOPBACK)
    assert recorder.seen == ["/x.gguf"]          # allowed by name, it is checked


async def test_a_redirect_to_a_denied_place_is_not_followed() -> None:
    """An allowed server redirecting to an internal one (by address, in hex, or to
    another loopback address) leads nowhere: the target gets no request."""
    target = _Recorder("127.0.0.2")
    hex_target = f"http://0x7f000002:{target.port}/x.gguf"
    try:
        for location in (f"{target.url}/x.gguf", hex_target):
            hop = _Recorder(location=location)
            try:
                said = await _message(f"{hop.url}/x.gguf", reach=LOOPBACK, timeout=2)
                assert "cannot be reached" in said
                assert hop.seen == ["/x.gguf"]
            finally:
                hop.stop()
        assert target.seen == []
        allowed = Reach.of(allow_hosts=["127.0.0.1", "127.0.0.2"])
        hop = _Recorder(location=f"{target.url}/x.gguf")
        try:
            await check_source(decode_value(f"{hop.url}/x.gguf", Source, source="source"),
                               reach=allowed)
        finally:
            hop.stop()
        assert target.seen == ["/x.gguf"]        # an allowed target is followed
    finally:
        target.stop()


async def test_remote_callers_learn_nothing_of_files_outside_the_local_roots(
        tmp_path: Path) -> None:
    """On a server listening beyond loopback, /etc/shadow and a missing file get the same
    answer, ~ is not expanded, and a path under a local root is checked as before."""
    root = tmp_path / "models"
    root.mkdir()
    (root / "m.gguf").write_bytes(b"gguf")
    config = ServerConfig(listen="0.0.0.0:8080",
                          source_check=SourceCheckConfig(local_roots=[str(root)]))
    reach = reach_of(config)
    shadow = await _message("/etc/shadow", reach=reach)
    missing = await _message("/etc/no-such-file-here", reach=reach)
    assert shadow.split(": ", 1)[1] == missing.split(": ", 1)[1]
    home = await _message("~/.ssh/id_rsa", reach=reach)
    assert os.path.expanduser("~") not in home
    escape = await _message(f"{root}/../../../etc/passwd", reach=reach)
    assert "local_roots" in escape
    await check_source(decode_value(str(root / "m.gguf"), Source, source="source"),
                       reach=reach)
    assert "not found" in await _message(str(root / "nope.gguf"), reach=reach)
    # A loopback listener (the embedded mode on a laptop) checks any path, as before.
    assert "not found" in await _message("/etc/no-such-file-here",
                                         reach=reach_of(ServerConfig()))


async def test_the_api_applies_the_reach_of_its_configuration() -> None:
    """POST /api/v1/source-check on a server listening on 0.0.0.0 answers alike for a
    file that exists and one that does not, and refuses a loopback port."""
    async with AsyncTestClient(app=_app_for(ServerConfig(listen="0.0.0.0:8080"))) as client:
        a = await client.post("/api/v1/source-check", json={"source": "/etc/passwd"})
        b = await client.post("/api/v1/source-check", json={"source": "/etc/no-such-file"})
        assert a.status_code == b.status_code == 400
        assert a.json()["error"]["message"].split(": ", 1)[1] == \
            b.json()["error"]["message"].split(": ", 1)[1]
        c = await client.post("/api/v1/source-check",
                              json={"source": "http://127.0.0.1:5432/x.gguf"})
        assert c.status_code == 400
        assert "cannot be reached" in c.json()["error"]["message"]


def _app_for(config: ServerConfig) -> Any:
    from litestar import Litestar, Router
    from litestar.di import Provide

    from llmgw.api import sourcecheck as api
    from llmgw.api.errors import exception_handlers
    from llmgw.api.typed import TYPE_DECODERS, TYPE_ENCODERS
    from llmgw.control.context import AppContext

    ctx = AppContext(config=config, models=None, backend=None,  # type: ignore[arg-type]
                     store=None)  # type: ignore[arg-type]
    return Litestar(
        route_handlers=[Router("/api/v1", route_handlers=api.route_handlers)],
        dependencies={"ctx": Provide(lambda: ctx, sync_to_thread=False)},
        exception_handlers=exception_handlers,
        type_decoders=TYPE_DECODERS, type_encoders=TYPE_ENCODERS,
    )
