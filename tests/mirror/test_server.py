"""``llmgw mirror serve`` over real sockets: ranges, validators, 405s, 404s, listings."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
from pathlib import Path

import aiohttp
import pytest

from llmgw.weights.mirror.server import MirrorServer

from .conftest import SECRET, CliMirror, tree_state

WRITE_METHODS = ["PUT", "POST", "DELETE", "PATCH", "MKCOL", "COPY", "MOVE", "PROPPATCH",
                 "LOCK", "UNLOCK", "OPTIONS", "TRACE"]


async def raw(server: MirrorServer, request: bytes) -> tuple[int, bytes, bytes]:
    """Send bytes exactly as given; the status, the header block and the body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(request)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 30)
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), head, body


def get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n".encode()


async def test_get_and_head_serve_the_file_with_validators(mirror_server: MirrorServer,
                                                           mirror_root: Path) -> None:
    """GET returns the bytes; HEAD the same headers and no body; both carry ETag,
    Last-Modified, Accept-Ranges and the exact length."""
    model = (mirror_root / "qwen/2024-11/model.gguf").read_bytes()
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{mirror_server.url}/qwen/2024-11/model.gguf") as r:
            assert r.status == 200
            assert await r.read() == model
            got = r.headers.copy()
        async with http.head(f"{mirror_server.url}/qwen/2024-11/model.gguf") as r:
            assert r.status == 200
            assert await r.read() == b""
            head = r.headers.copy()
    for h in ("ETag", "Last-Modified", "Content-Length", "Accept-Ranges"):
        assert got[h] == head[h]
    assert got["Content-Length"] == str(len(model))
    assert got["Accept-Ranges"] == "bytes"
    assert got["ETag"].startswith('"')


async def test_single_range_answers_206(mirror_server: MirrorServer, mirror_root: Path) -> None:
    """A range is 206 with Content-Range and exactly those bytes (what resume needs)."""
    model = (mirror_root / "qwen/2024-11/model.gguf").read_bytes()
    async with aiohttp.ClientSession() as http, http.get(
        f"{mirror_server.url}/qwen/2024-11/model.gguf", headers={"Range": "bytes=1000-"}
    ) as r:
        assert r.status == 206
        assert r.headers["Content-Range"] == f"bytes 1000-{len(model) - 1}/{len(model)}"
        assert await r.read() == model[1000:]


async def test_multiple_ranges_answer_multipart(mirror_server: MirrorServer,
                                                mirror_root: Path) -> None:
    """Several ranges come back as multipart/byteranges, each part holding its bytes."""
    model = (mirror_root / "qwen/2024-11/model.gguf").read_bytes()
    async with aiohttp.ClientSession() as http, http.get(
        f"{mirror_server.url}/qwen/2024-11/model.gguf",
        headers={"Range": "bytes=0-99,5000-5099,-10"},
    ) as r:
        assert r.status == 206
        ctype = r.headers["Content-Type"]
        body = await r.read()
        assert int(r.headers["Content-Length"]) == len(body)
    assert ctype.startswith("multipart/byteranges; boundary=")
    boundary = ctype.split("boundary=")[1].encode()
    parts = body.split(b"--" + boundary)[1:-1]
    assert len(parts) == 3
    for part, (start, end) in zip(parts, [(0, 99), (5000, 5099),
                                          (len(model) - 10, len(model) - 1)], strict=True):
        head, _, data = part.partition(b"\r\n\r\n")
        assert f"Content-Range: bytes {start}-{end}/{len(model)}".encode() in head
        assert data.removesuffix(b"\r\n") == model[start:end + 1]


@pytest.mark.parametrize("spec", ["bytes=300000-", "bytes=999999-1000000", "bytes=abc",
                                  "bytes=10-5", "bytes=", "bytes=0-1-2"])
async def test_bad_ranges_answer_416(mirror_server: MirrorServer, spec: str) -> None:
    """Past the end or malformed: 416 with Content-Range bytes */size and a reason."""
    async with aiohttp.ClientSession() as http, http.get(
        f"{mirror_server.url}/qwen/2024-11/model.gguf", headers={"Range": spec}
    ) as r:
        assert r.status == 416
        assert r.headers["Content-Range"] == "bytes */300000"
        assert "range" in (await r.text())


async def test_if_range_and_if_none_match(mirror_server: MirrorServer) -> None:
    """If-Range with the current ETag keeps the range, with a stale one sends the whole
    file; If-None-Match with the current ETag answers 304."""
    url = f"{mirror_server.url}/qwen/2024-11/model.gguf"
    async with aiohttp.ClientSession() as http:
        async with http.head(url) as r:
            etag, modified = r.headers["ETag"], r.headers["Last-Modified"]
        async with http.get(url, headers={"Range": "bytes=10-", "If-Range": etag}) as r:
            assert r.status == 206
        async with http.get(url, headers={"Range": "bytes=10-", "If-Range": '"stale"'}) as r:
            assert r.status == 200
            assert len(await r.read()) == 300_000
        async with http.get(url, headers={"If-None-Match": etag}) as r:
            assert r.status == 304
            assert await r.read() == b""
        async with http.get(url, headers={"If-Modified-Since": modified}) as r:
            assert r.status == 304


@pytest.mark.parametrize("method", WRITE_METHODS)
async def test_every_write_method_is_405_with_allow(mirror_server: MirrorServer,
                                                    mirror_root: Path, method: str) -> None:
    """Each non-read method answers 405 with Allow: GET, HEAD, on existing files, new
    paths and directories alike, and the mirror directory is left exactly as it was."""
    before = tree_state(mirror_root)
    async with aiohttp.ClientSession() as http:
        for path in ("/qwen/2024-11/model.gguf", "/qwen/2025-02/new.gguf", "/qwen/",
                     "/../escape"):
            async with http.request(method, f"{mirror_server.url}{path}",
                                    data=b"replacement weights") as r:
                assert r.status == 405, (method, path)
                assert r.headers["Allow"] == "GET, HEAD"
    assert tree_state(mirror_root) == before


@pytest.mark.parametrize("request_bytes", [
    get("/../secret.txt"),
    get("/qwen/../../secret.txt"),
    get("/%2e%2e/secret.txt"),
    get("/qwen/%2E%2E/%2E%2E/secret.txt"),
    get("/..%2fsecret.txt"),
    get("/qwen%2f..%2f..%2fsecret.txt"),
    get("/..%5csecret.txt"),
    get("/..\\secret.txt"),
    get("//etc/passwd"),
    get("/%2fetc%2fpasswd"),
    get("/outside-link"),
    get("/dirlink/x"),
    get("/dirlink/"),
    get("/qwen/.2025-01.adding-1-abcd/model.gguf"),
    get("/qwen/%2e2025-01.adding-1-abcd/model.gguf"),
    get("/pipe"),
    get("/qwen/2024-11/model.gguf/"),
    b"GET http://m/../secret.txt HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n",
    b"GET /etc/passwd HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n",
])
async def test_traversal_attempts_answer_404(mirror_server: MirrorServer,
                                             request_bytes: bytes) -> None:
    """Dot segments in any spelling, encoded separators, absolute paths, links out of
    the directory, hidden versions being added and special files all answer 404."""
    status, _, body = await raw(mirror_server, request_bytes)
    assert status == 404, request_bytes
    assert SECRET not in body


async def test_a_link_inside_the_mirror_is_served(mirror_server: MirrorServer,
                                                  mirror_root: Path) -> None:
    """A symbolic link that stays inside the mirror is followed."""
    status, _, body = await raw(mirror_server, get("/inside-link"))
    assert status == 200
    assert body == (mirror_root / "qwen/2024-11/config.json").read_bytes()


async def test_directory_listing_is_json(mirror_server: MirrorServer) -> None:
    """GET of a directory returns a JSON listing for tooling: files with sizes,
    subdirectories, and nothing hidden or pointing outside."""
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{mirror_server.url}/qwen/2024-11/") as r:
            assert r.status == 200
            assert r.headers["Content-Type"] == "application/json"
            listing = json.loads(await r.read())
        async with http.get(f"{mirror_server.url}/") as r:
            root = json.loads(await r.read())
        async with http.get(f"{mirror_server.url}/qwen/") as r:
            qwen = json.loads(await r.read())
    assert listing["path"] == "/qwen/2024-11/"
    by_name = {e["name"]: e for e in listing["entries"]}
    assert sorted(by_name) == ["config.json", "model.gguf", "model.gguf.sha256"]
    assert by_name["model.gguf"]["size"] == 300_000
    assert by_name["model.gguf"]["type"] == "file"
    assert {e["name"] for e in root["entries"]} == {"qwen", "empty", "inside-link"}
    assert [e["name"] for e in qwen["entries"]] == ["2024-11"]


async def test_directory_without_slash_redirects(mirror_server: MirrorServer) -> None:
    """A directory named without its trailing slash is redirected to it (301)."""
    status, head, _ = await raw(mirror_server, get("/qwen/2024-11"))
    assert status == 301
    assert b"Location: /qwen/2024-11/" in head


async def test_keep_alive_serves_several_requests_on_one_connection(
        mirror_server: MirrorServer, mirror_root: Path) -> None:
    """Requests after a sendfile body on the same connection are answered correctly."""
    model = (mirror_root / "qwen/2024-11/model.gguf").read_bytes()
    conn = aiohttp.TCPConnector(limit=1)
    async with aiohttp.ClientSession(connector=conn) as http:
        for spec, want in [("bytes=0-9", model[:10]), ("bytes=0-1,3-4", None),
                           ("bytes=-5", model[-5:])]:
            async with http.get(f"{mirror_server.url}/qwen/2024-11/model.gguf",
                                headers={"Range": spec}) as r:
                body = await r.read()
                assert r.status == 206
                if want is not None:
                    assert body == want


async def test_cli_serve_answers_and_stops(cli_mirror: CliMirror, mirror_root: Path) -> None:
    """`llmgw mirror serve DIR --listen 127.0.0.1:0` announces its URL, serves, refuses
    a write, and exits cleanly on Ctrl-C."""
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{cli_mirror.url}/qwen/2024-11/config.json") as r:
            assert r.status == 200
            assert await r.read() == (mirror_root / "qwen/2024-11/config.json").read_bytes()
        async with http.delete(f"{cli_mirror.url}/qwen/2024-11/config.json") as r:
            assert r.status == 405
    assert cli_mirror.stop() == 0


def test_cli_serve_stops_on_sigterm(mirror_root: Path) -> None:
    """A service manager's SIGTERM stops the server cleanly (exit 0)."""
    assert CliMirror(mirror_root).stop(signal.SIGTERM) == 0


async def test_1000_concurrent_range_requests_keep_memory_bounded(
        tmp_path: Path) -> None:
    """A thousand clients asking for 1 MiB ranges at once (1000 MiB in flight) are all
    answered correctly while the server's peak RSS grows by a small fraction of that:
    bodies go through sendfile, never through Python buffers."""
    root = tmp_path / "big"
    root.mkdir()
    size = 64 << 20
    block = os.urandom(1 << 20)
    with (root / "weights.bin").open("wb") as f:
        for i in range(64):
            f.write(bytes([i]) + block[1:])  # each MiB distinguishable by its first byte
    expected = {i: hashlib.sha256(bytes([i]) + block[1:]).hexdigest() for i in range(64)}
    server = CliMirror(root)
    try:
        baseline = server.rss()
        n = 1000

        port = int(server.url.rsplit(":", 1)[1])
        opened: list[int] = []
        ready = asyncio.Event()

        async def one(i: int) -> tuple[int, str]:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            opened.append(i)
            if len(opened) == n:
                ready.set()
            await ready.wait()  # every connection is open before any request is sent
            k = i % 64
            writer.write(f"GET /weights.bin HTTP/1.1\r\nHost: m\r\nRange: bytes={k << 20}-"
                         f"{((k + 1) << 20) - 1}\r\nConnection: close\r\n\r\n".encode())
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            h = hashlib.sha256()
            while chunk := await reader.read(1 << 16):
                h.update(chunk)
            writer.close()
            return int(head.split(b" ")[1]), h.hexdigest()

        tasks = [asyncio.create_task(one(i)) for i in range(n)]
        results = await asyncio.wait_for(asyncio.gather(*tasks), 300)
        assert all(status == 206 for status, _ in results)
        assert all(digest == expected[i % 64] for i, (_, digest) in enumerate(results))
        peak = server.rss("VmHWM")
    finally:
        server.stop()
    growth = peak - baseline
    print(f"server RSS {baseline >> 20} MiB before, peak {peak >> 20} MiB "
          f"(+{growth >> 20} MiB) for {n} concurrent 1 MiB ranges of a {size >> 20} MiB file")
    assert growth < 128 << 20


async def test_clients_that_leave_early_leak_no_descriptors(cli_mirror: CliMirror) -> None:
    """Hundreds of clients that hang up right after asking, or half-way through a body,
    leave the server with no more open descriptors than before."""
    fd_dir = Path(f"/proc/{cli_mirror.pid}/fd")
    port = int(cli_mirror.url.rsplit(":", 1)[1])
    baseline = len(list(fd_dir.iterdir()))

    async def leave(after_bytes: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(get("/qwen/2024-11/model.gguf"))
        await writer.drain()
        if after_bytes:
            await reader.readexactly(after_bytes)
        writer.transport.abort()  # a reset, not a polite close

    await asyncio.gather(*(leave(0 if i % 2 else 1000) for i in range(400)))
    deadline = asyncio.get_running_loop().time() + 30
    while len(list(fd_dir.iterdir())) > baseline:
        if asyncio.get_running_loop().time() > deadline:
            left = sorted(os.readlink(p) for p in fd_dir.iterdir())
            raise AssertionError(f"descriptors were leaked: {baseline} before, now {left}")
        await asyncio.sleep(0.05)


async def test_a_directory_swapped_for_a_link_after_the_check_is_not_followed(
        mirror_server: MirrorServer, mirror_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory replaced by a link out of the mirror between the path check and the
    open answers 404, not the file outside."""
    outside = mirror_root.parent / "secretdir"
    (outside / "model.gguf").write_bytes(SECRET)
    checked = MirrorServer._resolve

    def swap_after_check(self: MirrorServer, parts: tuple[str, ...]
                         ) -> tuple[str, os.stat_result] | None:
        found = checked(self, parts)
        version = mirror_root / "qwen" / "2024-11"
        if version.is_dir() and not version.is_symlink():
            version.rename(mirror_root / "qwen" / "moved")
            version.symlink_to(outside)
        return found

    monkeypatch.setattr(MirrorServer, "_resolve", swap_after_check)
    status, _, body = await raw(mirror_server, get("/qwen/2024-11/model.gguf"))
    assert status == 404
    assert SECRET not in body


async def test_a_directory_swapped_for_a_link_after_the_check_is_not_listed(
        mirror_server: MirrorServer, mirror_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory replaced by a link out of the mirror between the path check and the
    listing answers 404, revealing no name or size from outside."""
    outside = mirror_root.parent / "secretdir"
    (outside / "outside-name.bin").write_bytes(SECRET)
    # A link back into the mirror: following the swapped directory would list its
    # outside name with the size of the file it leads to.
    (outside / "outside-back-in").symlink_to(mirror_root / "inside-link")
    checked = MirrorServer._resolve

    def swap_after_check(self: MirrorServer, parts: tuple[str, ...]
                         ) -> tuple[str, os.stat_result] | None:
        found = checked(self, parts)
        version = mirror_root / "qwen" / "2024-11"
        if parts == ("qwen", "2024-11") and version.is_dir() and not version.is_symlink():
            version.rename(mirror_root / "qwen" / "moved")
            version.symlink_to(outside)
        return found

    monkeypatch.setattr(MirrorServer, "_resolve", swap_after_check)
    status, _, body = await raw(mirror_server, get("/qwen/2024-11/"))
    assert status == 404
    assert b"outside-" not in body
    assert SECRET not in body


async def test_links_in_a_listing_are_listed_only_when_they_stay_inside(
        mirror_server: MirrorServer, mirror_root: Path) -> None:
    """A listed link leading inside the mirror shows its target's facts; links leading
    out of it (to a file or a directory) are left out of the listing."""
    (mirror_root / "qwen" / "2024-11" / "out-file").symlink_to(mirror_root.parent / "secret.txt")
    (mirror_root / "qwen" / "2024-11" / "out-dir").symlink_to(mirror_root.parent / "secretdir")
    (mirror_root / "qwen" / "2024-11" / "in-dir").symlink_to(mirror_root / "empty")
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{mirror_server.url}/qwen/2024-11/") as r:
            listing = json.loads(await r.read())
        async with http.get(f"{mirror_server.url}/") as r:
            root = json.loads(await r.read())
    by_name = {e["name"]: e for e in listing["entries"]}
    assert sorted(by_name) == ["config.json", "in-dir", "model.gguf", "model.gguf.sha256"]
    assert by_name["in-dir"]["type"] == "directory"
    link = {e["name"]: e for e in root["entries"]}["inside-link"]
    config = mirror_root / "qwen" / "2024-11" / "config.json"
    assert link["type"] == "file"
    assert link["size"] == config.stat().st_size
