"""Hostile clients against a real ``llmgw serve`` on loopback: big heads, slow clients,
too many connections, deeply nested bodies.

Each test speaks raw HTTP/1.1 over a socket, because what is tested happens
before any HTTP client library would let it: a head that never ends, a body
that stops, a connection that sends nothing. The server runs with short
deadlines (a few seconds) so the tests end quickly; every wait is bounded by
a generous deadline, never timed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from llmgw.config import GatewayConfig
from llmgw.gateway.keys import add_key

TOKEN = "hostile-t0ken"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
DEADLINE = 60.0


@dataclass
class Served:
    url: str
    port: int
    pid: int
    log: Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def llmgw_serve(tmp_path: Path, gateway: str, keys_file: Path | None = None
                ) -> Iterator[Served]:
    """``llmgw serve`` with ``gateway`` settings, in front of a simulated engine."""
    sim = subprocess.Popen([sys.executable, "-m", "llmgw.testing.simengine"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert sim.stdout is not None
    engine = sim.stdout.readline().decode().strip()
    port = _free_port()
    config = tmp_path / "server.yaml"
    config.write_text(
        f"listen: 127.0.0.1:{port}\ndatabase: sqlite:///{tmp_path}/llmgw.db\n"
        f"admin_tokens: [{TOKEN}]\ngateway: {gateway}\n"
        + (f"keys_file: {keys_file}\n" if keys_file is not None else "") +
        f"models:\n  - name: chat\n    upstream: [{engine}]\n")
    log_path = tmp_path / "serve.log"
    log = open(log_path, "wb")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "llmgw", "serve", "-c", str(config),
                             "--log-level", "warning"], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + DEADLINE
        while True:
            assert proc.poll() is None, log_path.read_text()
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)
        yield Served(url, port, proc.pid, log_path)
    finally:
        proc.terminate()
        try:
            proc.wait(40)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        sim.kill()
        sim.wait()
        sim.stdout.close()
        log.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with llmgw_serve(tmp_path_factory.mktemp("hostile"),
                     "{head_timeout: 2s, body_timeout: 2s, keepalive_timeout: 2s}") as s:
        yield s


def connect(served: Served) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", served.port), timeout=DEADLINE)
    sock.settimeout(DEADLINE)
    return sock


def read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (bounded by DEADLINE)."""
    chunks = []
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def send_all(sock: socket.socket, data: bytes) -> None:
    """Send ``data``; a server that refused it and closed may stop reading part-way."""
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        sock.sendall(data)


def status_of(answer: bytes) -> int:
    assert answer.startswith(b"HTTP/1.1 "), answer[:200]
    return int(answer[9:12])


def chat_head(extra: bytes = b"", length: int = 0) -> bytes:
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: llmgw\r\n"
            b"Content-Type: application/json\r\n" + extra +
            b"Content-Length: " + str(length).encode() + b"\r\n\r\n")


def chat_body(content: str = "hi") -> bytes:
    return httpx.Request("POST", "http://x", json={
        "model": "chat", "max_tokens": 2,
        "messages": [{"role": "user", "content": content}]}).read()


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


# ------------------------------------------------------------------ heads


def test_the_defaults_are_the_documented_limits() -> None:
    """16 KiB a header line, 64 KiB a head, 10 s / 30 s / 5 s deadlines."""
    gw = GatewayConfig()
    assert (int(gw.max_header_size), int(gw.max_head_size)) == (16 * 1024, 64 * 1024)
    assert (float(gw.head_timeout), float(gw.body_timeout),
            float(gw.keepalive_timeout)) == (10, 30, 5)


def test_a_header_line_over_16_kib_is_431_and_the_connection_closes(served: Served) -> None:
    body = chat_body()
    with connect(served) as sock:
        send_all(sock, chat_head(b"X-Big: " + b"a" * (17 * 1024) + b"\r\n", len(body)) + body)
        answer = read_all(sock)
    assert status_of(answer) == 431
    assert b"gateway.max_header_size" in answer
    assert b"connection: close" in answer.lower()


def test_a_head_over_64_kib_of_small_headers_is_431(served: Served) -> None:
    lines = b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 1000) for i in range(80))
    with connect(served) as sock:
        send_all(sock, chat_head(lines))
        answer = read_all(sock)
    assert status_of(answer) == 431
    assert b"gateway.max_head_size" in answer


def test_huge_headers_are_not_held_in_memory(served: Served) -> None:
    """Four 16 MiB headers at once: each refused after 64 KiB, none buffered."""
    before = rss(served.pid)
    socks = [connect(served) for _ in range(4)]
    try:
        for sock in socks:
            send_all(sock, b"POST /v1/chat/completions HTTP/1.1\r\nX-Big: ")
        chunk = b"a" * (1024 * 1024)
        for _ in range(16):
            for sock in socks:
                send_all(sock, chunk)
        answers = [read_all(sock) for sock in socks]
    finally:
        for sock in socks:
            sock.close()
    assert [status_of(a) for a in answers] == [431] * 4
    assert rss(served.pid) - before < 24 * 1024 * 1024


def test_a_big_body_after_a_head_near_the_limit_is_served(served: Served) -> None:
    """Only the head is counted: a 60 KiB head and a 1 MiB body sent in one write pass."""
    body = httpx.Request("POST", "http://x", json={
        "model": "chat", "max_tokens": 2, "user": "x" * (1024 * 1024),
        "messages": [{"role": "user", "content": "hi"}]}).read()
    head = chat_head(b"X-Pad: " + b"p" * (15 * 1024) + b"\r\n" +
                     b"X-Pad2: " + b"p" * (15 * 1024) + b"\r\n" +
                     b"X-Pad3: " + b"p" * (15 * 1024) + b"\r\n" +
                     b"Connection: close\r\n", len(body))
    with connect(served) as sock:
        send_all(sock, head + body)
        answer = read_all(sock)
    assert status_of(answer) == 200, answer[-300:]


# ------------------------------------------------------------------ slow clients


def test_a_connection_that_sends_nothing_is_closed(served: Served) -> None:
    with connect(served) as sock:
        assert read_all(sock) == b""


def test_a_trickled_head_gets_408_and_the_connection_closes(served: Served) -> None:
    with connect(served) as sock:
        send_all(sock, b"POST /v1/chat/completions HTTP/1.1\r\nHost: llmgw\r\n")
        answer = read_all(sock)
    assert status_of(answer) == 408
    assert b"gateway.head_timeout" in answer


def test_a_body_that_stops_arriving_closes_the_connection(served: Served) -> None:
    body = chat_body()
    with connect(served) as sock:
        send_all(sock, chat_head(length=len(body)) + body[:10])
        assert read_all(sock) == b""
    # The server is still serving others.
    r = httpx.post(f"{served.url}/v1/chat/completions", content=chat_body(), timeout=DEADLINE,
                   headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text


# ------------------------------------------------------------------ deep nesting


def test_deeply_nested_json_is_400_on_the_gateway_and_the_api(served: Served) -> None:
    deep = b'{"model": "chat", "messages": ' + b"[" * 1000 + b"]" * 1000 + b"}"
    r = httpx.post(f"{served.url}/v1/chat/completions", content=deep, timeout=DEADLINE,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert "nested more than 128 levels" in r.json()["error"]["message"]
    deep = b'{"name": "x", "source": ' + b"[" * 1000 + b"]" * 1000 + b"}"
    r = httpx.post(f"{served.url}/api/v1/models", content=deep, timeout=DEADLINE,
                   headers={"content-type": "application/json", **ADMIN})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"].startswith("request body: nested more than 128")
    assert "Traceback" not in served.log.read_text()


# ------------------------------------------------------------------ connections


def test_connections_beyond_the_cap_are_answered_503(tmp_path: Path) -> None:
    with llmgw_serve(tmp_path, "{max_connections: 6, keepalive_timeout: 10m}") as s:
        held = [connect(s) for _ in range(6)]
        try:
            with connect(s) as sock:
                send_all(sock, b"GET /v1/models HTTP/1.1\r\nHost: llmgw\r\n\r\n")
                assert status_of(read_all(sock)) == 503
        finally:
            for sock in held:
                sock.close()
        # Once they are gone, requests are served again.
        deadline = time.monotonic() + DEADLINE
        while httpx.get(f"{s.url}/v1/models", timeout=DEADLINE).status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.1)


# ------------------------------------------------------------------ stopping


def test_a_request_on_a_connection_idle_as_the_server_stops_is_answered(tmp_path: Path) -> None:
    """SIGTERM closes the listening socket at once, but a keep-alive connection idle at
    that moment stays open for a while: the request its client sends on it (the client
    cannot know the server is stopping) is answered, with `connection: close`."""
    with llmgw_serve(tmp_path, "{}") as served, httpx.Client(timeout=DEADLINE) as client:
        body = {"model": "chat", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
        assert client.post(f"{served.url}/v1/chat/completions", json=body).status_code == 200
        os.kill(served.pid, signal.SIGTERM)
        deadline = time.monotonic() + DEADLINE
        while True:
            try:
                socket.create_connection(("127.0.0.1", served.port), timeout=1).close()
            except ConnectionRefusedError:
                break
            assert time.monotonic() < deadline, "the server kept accepting connections"
            time.sleep(0.01)
        # The pooled connection from the first request carries the second.
        late = client.post(f"{served.url}/v1/chat/completions", json=body)
        assert late.status_code == 200, late.text
        assert late.headers["connection"] == "close"


# ------------------------------------------------------------------ one client against others


def _closed_by_server(sock: socket.socket, keep_sending: Callable[[], bytes],
                      within: float) -> bool:
    """Send what ``keep_sending`` gives every 0.2 s until the server closes the connection
    (True) or ``within`` seconds pass (False), reading and dropping what it answers."""
    sock.settimeout(0.2)
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            sock.sendall(keep_sending())
        except (BrokenPipeError, ConnectionResetError):
            return True
        try:
            if sock.recv(65536) == b"":
                return True
        except TimeoutError:
            continue
        except ConnectionResetError:
            return True
    return False


@pytest.fixture
def keys_file(tmp_path: Path) -> tuple[Path, str]:
    path = tmp_path / "keys.json"
    return path, add_key(path, "good")


def test_an_early_401_closes_the_connection_while_its_body_still_trickles(
        tmp_path: Path, keys_file: tuple[Path, str]) -> None:
    """A bogus key is answered 401 from the head; the body it trickles afterwards does not
    keep the connection: it is closed after a short linger, long before the body ends."""
    path, _ = keys_file
    with llmgw_serve(tmp_path, "{keepalive_timeout: 10m, body_timeout: 10m}", path) as s, \
            connect(s) as sock:
        send_all(sock, chat_head(b"Authorization: Bearer sk-llmgw-bogus\r\n", 1_000_000))
        sock.settimeout(DEADLINE)
        answer = sock.recv(65536)
        assert status_of(answer) == 401
        # 1 MB at one byte every 0.2 s would take days; the linger is two seconds.
        assert _closed_by_server(sock, lambda: b"x", within=30.0)


def test_a_steadily_trickled_body_is_cut_at_the_whole_request_deadline(tmp_path: Path) -> None:
    """A body that never stops but never ends is closed at gateway.body_deadline, though
    each byte comes well within body_timeout."""
    with llmgw_serve(tmp_path, "{body_deadline: 3s, body_timeout: 2s}") as s, \
            connect(s) as sock:
        send_all(sock, chat_head(length=1_000_000) + b'{"model": "chat", "messages": [')
        assert _closed_by_server(sock, lambda: b" ", within=30.0)


def test_trickling_sockets_with_a_bogus_key_do_not_lock_others_out(
        tmp_path: Path, keys_file: tuple[Path, str]) -> None:
    """300 sockets from one address (127.0.0.2) sending a bogus key and trickling bodies,
    reconnecting as they are closed, at max_connections 300: every request of a client
    with a key from another address (127.0.0.1) is answered 200."""
    path, key = keys_file
    stop = threading.Event()
    with llmgw_serve(tmp_path, "{max_connections: 300, keepalive_timeout: 10m, "
                               "body_timeout: 10m}", path) as s:
        attack = threading.Thread(target=_trickle_with_a_bogus_key, args=(s.port, 300, stop))
        attack.start()
        try:
            deadline = time.monotonic() + DEADLINE
            while _attackers_connected.value < 300 and time.monotonic() < deadline:
                time.sleep(0.05)
            statuses = []
            for _ in range(20):
                with httpx.Client(timeout=DEADLINE) as client:   # a new connection each
                    r = client.post(f"{s.url}/v1/chat/completions", content=chat_body(),
                                    headers={"content-type": "application/json",
                                             "authorization": f"Bearer {key}"})
                    statuses.append(r.status_code)
        finally:
            stop.set()
            attack.join(DEADLINE)
    assert statuses == [200] * 20, statuses


class _Counter:
    value = 0


_attackers_connected = _Counter()


def _trickle_with_a_bogus_key(port: int, count: int, stop: threading.Event) -> None:
    """Keep ``count`` sockets from 127.0.0.2 open, each sending a bogus key and then a
    byte of body every half second; reopen each one the server closes. Bounded by
    ``stop`` and by DEADLINE."""
    head = chat_head(b"Authorization: Bearer sk-llmgw-bogus\r\n", 1_000_000)

    def opened() -> socket.socket | None:
        sock = socket.socket()
        sock.settimeout(2)
        try:
            sock.bind(("127.0.0.2", 0))
            sock.connect(("127.0.0.1", port))
            sock.sendall(head)
        except OSError:
            sock.close()
            return None
        sock.setblocking(False)
        return sock

    socks = [opened() for _ in range(count)]
    _attackers_connected.value = count       # all opened: the others may begin
    deadline = time.monotonic() + DEADLINE
    while not stop.is_set() and time.monotonic() < deadline:
        for i, sock in enumerate(socks):
            alive = sock is not None
            if sock is not None:
                try:
                    with contextlib.suppress(BlockingIOError):
                        while sock.recv(65536):
                            pass
                        alive = False        # the server closed it
                    if alive:
                        sock.send(b"x")
                except OSError:
                    alive = False
            if not alive:
                if sock is not None:
                    sock.close()
                socks[i] = opened()
        stop.wait(0.5)
    for sock in socks:
        if sock is not None:
            sock.close()


def test_the_per_address_cap_counts_only_connections_nobody_authenticated_on(
        tmp_path: Path, keys_file: tuple[Path, str]) -> None:
    """At max_unauthenticated_per_client 2: two idle connections that sent nothing fill the
    address's share and a third is answered 503; two on which a key was accepted do not,
    and a further connection is served."""
    path, key = keys_file
    body = chat_body()
    good = chat_head(f"Authorization: Bearer {key}\r\n".encode(), len(body)) + body
    with llmgw_serve(tmp_path, "{max_unauthenticated_per_client: 2, keepalive_timeout: 10m}",
                     path) as s:
        idle = [connect(s) for _ in range(2)]
        try:
            with connect(s) as sock:
                send_all(sock, good)
                answer = read_all(sock)
                assert status_of(answer) == 503
                assert b"max_unauthenticated_per_client" in answer
        finally:
            for sock in idle:
                sock.close()
        deadline = time.monotonic() + DEADLINE
        served = [connect(s) for _ in range(2)]
        try:
            for sock in served:
                send_all(sock, good)
                assert status_of(sock.recv(65536)) == 200      # kept open (keep-alive)
            while True:   # the closed idle ones may take a moment to be gone
                with connect(s) as sock:
                    send_all(sock, good)
                    status = status_of(sock.recv(65536))
                if status == 200 or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            assert status == 200
        finally:
            for sock in served:
                sock.close()
