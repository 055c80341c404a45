"""Gateway benchmark: added latency, throughput and 1,000 concurrent streams (issue G targets).

    .venv/bin/python bench/gateway_bench.py [--server granian|uvicorn] [--duration 10]
                                            [--streams 1000 --chunks 100 --interval 0.1]

Everything runs on loopback on this machine: the upstream (nginx from Debian
returning a canned completion when ``nginx`` is installed, else the Python
upstream in ``gateway_upstream.py``), the gateway alone with ONE worker
process (``gateway_serve.py``), and the load (wrk when installed, else a raw
asyncio client). Each figure is measured direct to the upstream and through
the gateway in the same run; the report gives both and the difference/ratio.

Streams always use the Python upstream, which stamps each event with the
time it was written, so the client measures each chunk's delivery delay;
streams start spread over one chunk interval, as independent clients would.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

BENCH = Path(__file__).resolve().parent
PYTHON = sys.executable
BODY = b'{"model":"bench","messages":[{"role":"user","content":"hello"}],"max_tokens":8}'
CANNED = (b'{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"bench",'
          b'"choices":[{"index":0,"message":{"role":"assistant","content":"hi"},'
          b'"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":1,'
          b'"total_tokens":6}}')
NGINX_CONF = """
daemon off;
worker_processes 1;
error_log {tmp}/nginx-error.log warn;
pid {tmp}/nginx.pid;
events {{ worker_connections 8192; }}
http {{
  access_log off;
  keepalive_requests 10000000;
  keepalive_timeout 60s;
  client_body_temp_path {tmp}/body;
  proxy_temp_path {tmp}/proxy;
  fastcgi_temp_path {tmp}/fastcgi;
  uwsgi_temp_path {tmp}/uwsgi;
  scgi_temp_path {tmp}/scgi;
  server {{
    listen 127.0.0.1:{port};
    location = /v1/chat/completions {{
      default_type application/json;
      return 200 '{canned}';
    }}
    location = /health {{ return 200 ''; }}
  }}
}}
"""
WRK_LUA = """
wrk.method = "POST"
wrk.body = '{body}'
wrk.headers["Content-Type"] = "application/json"
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_listening(port: int, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process {proc.args!r} exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listening on {port} after {timeout} s")


@contextlib.contextmanager
def running(args: list[str], port: int | None = None, env: dict[str, str] | None = None,
            cwd: Path | None = None) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(args, env={**os.environ, **(env or {})}, cwd=cwd,
                            stdout=subprocess.PIPE if port is None else subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        if port is not None:
            wait_listening(port, proc)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def nginx_upstream(tmp: Path) -> Iterator[str]:
    port = free_port()
    conf = tmp / "nginx.conf"
    conf.write_text(NGINX_CONF.format(tmp=tmp, port=port, canned=CANNED.decode()))
    with running([shutil.which("nginx") or "nginx", "-c", str(conf), "-p", str(tmp)], port):
        yield f"http://127.0.0.1:{port}"


@contextlib.contextmanager
def python_upstream(chunks: int, interval: float) -> Iterator[str]:
    port = free_port()
    with running([PYTHON, str(BENCH / "gateway_upstream.py"), "--port", str(port),
                  "--chunks", str(chunks), "--interval", str(interval)], port):
        yield f"http://127.0.0.1:{port}"


@contextlib.contextmanager
def gateway(server: str, models: dict[str, str],
            extra: Sequence[str] = (), env: dict[str, str] | None = None
            ) -> Iterator[tuple[str, int]]:
    """The gateway alone, one worker; yields (base URL, pid of the server process).

    ``extra``: more options for the server's command line; ``env``: more environment."""
    port = free_port()
    spec = ",".join(f"{name}={url}" for name, url in models.items())
    bindir = Path(PYTHON).parent
    if server == "granian":
        args = [str(bindir / "granian"), "--interface", "asgi", "--host", "127.0.0.1", "--port",
                str(port), "--workers", "1", "--backpressure", "8192", "--backlog", "4096",
                "--log-level", "warning", "--working-dir", str(BENCH), "gateway_serve:app"]
    else:
        args = [str(bindir / "uvicorn"), "--host", "127.0.0.1", "--port", str(port),
                "--workers", "1", "--backlog", "4096", "--no-access-log", "--log-level",
                "warning", "--app-dir", str(BENCH), "gateway_serve:app"]
    args += extra
    with running(args, port, env={"LLMGW_BENCH_MODELS": spec, **(env or {})}) as proc:
        yield f"http://127.0.0.1:{port}", proc.pid


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants now (those that exit meanwhile are left out)."""
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{p}/task").iterdir():
                todo.extend(int(c) for c in (task / "children").read_text().split())
            tree.append(p)
    return tree


def rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` and its descendants (granian serves in a child)."""
    total = 0
    for p in process_tree(pid):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
    return total


_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) ``pid`` and its live descendants have used so far."""
    total = 0
    for p in process_tree(pid):
        with contextlib.suppress(OSError):
            # The fields after the command, which is in parentheses and may hold spaces.
            fields = Path(f"/proc/{p}/stat").read_text().rpartition(")")[2].split()
            total += int(fields[11]) + int(fields[12])   # utime, stime
    return total / _TICK


# ---------------------------------------------------------------- load: wrk or Python


class WrkFigures(NamedTuple):
    """What one wrk run measured."""

    rps: float
    p50: float          # ms
    p99: float          # ms
    requests: int
    errors: int         # non-2xx responses, or 1 for any socket error


def wrk(url: str, connections: int, duration: float, tmp: Path,
        key: str | None = None) -> tuple[float, float, int]:
    """(requests/s, median latency in ms, non-2xx responses) from wrk."""
    return wrk_together([url], connections, duration, tmp, key)[0]


def wrk_together(urls: Sequence[str], connections: int, duration: float,
                 tmp: Path, key: str | None = None) -> list[tuple[float, float, int]]:
    """``wrk`` against each of ``urls`` at once (a wrk each), in the same window;
    ``key``: sent as the API key."""
    headers = {"Authorization": f"Bearer {key}"} if key is not None else None
    return [(f.rps, f.p50, f.errors) for f in wrk_runs(urls, connections, duration, tmp,
                                                        headers)]


def wrk_runs(urls: Sequence[str], connections: int, duration: float, tmp: Path,
             headers: Mapping[str, str] | None = None) -> list[WrkFigures]:
    """``wrk`` against each of ``urls`` at once, sending ``headers`` too."""
    lua = tmp / "post.lua"
    lua.write_text(WRK_LUA.format(body=BODY.decode()) + "".join(
        f'wrk.headers["{name}"] = "{value}"\n' for name, value in (headers or {}).items()))
    procs = [subprocess.Popen(
        ["wrk", "-t1", f"-c{connections}", f"-d{duration:g}s", "--latency", "-s", str(lua),
         f"{url}/v1/chat/completions"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        text=True) for url in urls]
    results = []
    for proc in procs:
        out, _ = proc.communicate()
        if proc.returncode:
            raise RuntimeError(f"wrk exited with {proc.returncode}")
        results.append(_wrk_figures(out))
    return results


def _wrk_ms(out: str, percent: str) -> float:
    found = re.search(rf"\s{percent}%\s+([\d.]+)(us|ms|s)", out)
    assert found is not None, out
    value, unit = found.groups()
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def _wrk_figures(out: str) -> WrkFigures:
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    count = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    errors = re.search(r"Socket errors:.*", out)
    return WrkFigures(rps, _wrk_ms(out, "50"), _wrk_ms(out, "99"), count,
                      int(bad.group(1)) if bad else (1 if errors else 0))


class _KeepAliveClient(asyncio.Protocol):
    """Sends the benchmark request over one connection, one at a time, timing each."""

    def __init__(self, request: bytes, until: float, times: list[float],
                 done: asyncio.Future[None]) -> None:
        self.request, self.until, self.times, self.done = request, until, times, done
        self.buf = b""
        self.sent = 0.0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self._send()

    def _send(self) -> None:
        assert self.transport is not None
        self.sent = time.perf_counter()
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        m = re.search(rb"content-length:\s*(\d+)", self.buf[:end].lower())
        length = int(m.group(1)) if m else 0
        if len(self.buf) < end + 4 + length:
            return
        self.buf = self.buf[end + 4 + length:]
        now = time.perf_counter()
        self.times.append(now - self.sent)
        if now < self.until:
            self._send()
        elif not self.done.done():
            self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)


async def _python_load(url: str, connections: int, duration: float,
                       key: str | None = None) -> tuple[float, float, int]:
    host, port = url.removeprefix("http://").split(":")
    auth = f"Authorization: Bearer {key}\r\n" if key is not None else ""
    request = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: "
               f"application/json\r\n{auth}Content-Length: {len(BODY)}\r\n\r\n"
               ).encode() + BODY
    loop = asyncio.get_running_loop()
    times: list[float] = []
    until = time.perf_counter() + duration
    dones = []
    for _ in range(connections):
        done: asyncio.Future[None] = loop.create_future()
        await loop.create_connection(lambda d=done: _KeepAliveClient(request, until, times, d),
                                     host, int(port))
        dones.append(done)
    await asyncio.gather(*dones)
    return len(times) / duration, statistics.median(times) * 1000, 0


def load(url: str, connections: int, duration: float, tmp: Path,
         warm: bool = True, key: str | None = None) -> tuple[float, float, int]:
    """(requests/s, median latency in ms, non-2xx responses), from wrk if there is one.

    ``warm``: a run of up to 2 s first, unmeasured, to warm connections and caches;
    ``key``: sent as the API key."""
    if shutil.which("wrk"):
        if warm:
            wrk(url, connections, min(2.0, duration), tmp, key)
        return wrk(url, connections, duration, tmp, key)
    if warm:
        asyncio.run(_python_load(url, connections, min(2.0, duration), key))
    return asyncio.run(_python_load(url, connections, duration, key))


# ---------------------------------------------------------------- streams


class _StreamClient(asyncio.Protocol):
    """One streaming request; decodes chunked SSE and records each event's delivery delay."""

    def __init__(self, request: bytes, delays: list[int], done: asyncio.Future[int]) -> None:
        self.request, self.delays, self.done = request, delays, done
        self.raw = b""
        self.body = b""
        self.head_done = False
        self.need: int | None = None
        self.events = 0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        now = time.monotonic_ns()
        self.raw += data
        if not self.head_done:
            end = self.raw.find(b"\r\n\r\n")
            if end < 0:
                return
            if b" 200 " not in self.raw[:16]:
                self._finish()
                return
            self.raw = self.raw[end + 4:]
            self.head_done = True
        while True:   # Transfer-Encoding: chunked
            if self.need is None:
                line_end = self.raw.find(b"\r\n")
                if line_end < 0:
                    break
                self.need = int(self.raw[:line_end].split(b";")[0], 16)
                self.raw = self.raw[line_end + 2:]
            if len(self.raw) < self.need + 2:
                break
            self.body += self.raw[:self.need]
            self.raw = self.raw[self.need + 2:]
            self.need = None
        while (end := self.body.find(b"\n\n")) >= 0:
            event, self.body = self.body[:end], self.body[end + 2:]
            if event == b"data: [DONE]":
                self._finish()
                return
            m = re.search(rb'"t":(\d+)', event)
            if m:
                self.delays.append(now - int(m.group(1)))
                self.events += 1

    def _finish(self) -> None:
        if not self.done.done():
            self.done.set_result(self.events)
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(self.events)


async def _streams(url: str, model: str, count: int, interval: float, pid: int | None
                   ) -> tuple[list[int], list[int], int]:
    """(delays ns, events per stream, peak RSS of pid) for ``count`` concurrent streams."""
    host, port = url.removeprefix("http://").split(":")
    body = (b'{"model":"%s","stream":true,"messages":[{"role":"user","content":"hi"}]}'
            % model.encode())
    request = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: "
               f"application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
    loop = asyncio.get_running_loop()
    delays: list[int] = []
    peak = 0

    async def sample() -> None:
        nonlocal peak
        while pid is not None:
            peak = max(peak, rss_bytes(pid))
            await asyncio.sleep(0.2)

    sampler = asyncio.create_task(sample())
    dones: list[asyncio.Future[int]] = []
    for i in range(count):
        done: asyncio.Future[int] = loop.create_future()
        await loop.create_connection(lambda d=done: _StreamClient(request, delays, d),
                                     host, int(port))
        dones.append(done)
        await asyncio.sleep(max(0.0, (i + 1) * interval / count - 0.0))
    events = list(await asyncio.wait_for(asyncio.gather(*dones), 600))
    sampler.cancel()
    if pid is not None:
        peak = max(peak, rss_bytes(pid))
    return delays, events, peak


# ---------------------------------------------------------------- report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", choices=["granian", "uvicorn"], default="uvicorn")
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--chunks", type=int, default=100)
    parser.add_argument("--interval", type=float, default=0.1,
                        help="seconds between two chunks of one stream")
    parser.add_argument("--skip-streams", action="store_true")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="llmgw-gwbench-"))
    use_nginx = shutil.which("nginx") is not None
    loader = "wrk" if shutil.which("wrk") else "python"
    print(f"machine: {os.cpu_count()} cores; gateway: {args.server}, 1 worker; upstream: "
          f"{'nginx' if use_nginx else 'python'}; load: {loader}")
    with contextlib.ExitStack() as stack:
        static = stack.enter_context(nginx_upstream(tmp) if use_nginx else
                                     python_upstream(args.chunks, args.interval))
        streaming = stack.enter_context(python_upstream(args.chunks, args.interval))
        gw_url, gw_pid = stack.enter_context(
            gateway(args.server, {"bench": static, "stream": streaming}))

        _d1_rps, d1_med, _ = load(static, 1, args.duration, tmp)
        _g1_rps, g1_med, g1_bad = load(gw_url, 1, args.duration, tmp)
        print("\nnon-streaming chat completion (small body), concurrency 1")
        print(f"  median latency: direct {d1_med:.3f} ms, via gateway {g1_med:.3f} ms, "
              f"added {g1_med - d1_med:.3f} ms   (target <= 1 ms)")
        d32_rps, d32_med, _ = load(static, 32, args.duration, tmp)
        g32_rps, g32_med, g32_bad = load(gw_url, 32, args.duration, tmp)
        print("non-streaming chat completion (small body), concurrency 32")
        print(f"  throughput: direct {d32_rps:,.0f} req/s, via gateway {g32_rps:,.0f} req/s, "
              f"ratio {g32_rps / d32_rps:.3f}   (target >= 2,500 req/s)")
        print(f"  median latency: direct {d32_med:.3f} ms, via gateway {g32_med:.3f} ms; "
              f"failed responses via gateway: {g1_bad + g32_bad}")
        print(f"  gateway RSS after: {rss_bytes(gw_pid) / 2**20:.0f} MiB")

        if not args.skip_streams:
            n, chunks = args.streams, args.chunks
            print(f"\n{n} concurrent streams x {chunks} chunks, one every "
                  f"{args.interval * 1000:g} ms per stream")
            d_delays, d_events, _ = asyncio.run(_streams(streaming, "stream", n, args.interval,
                                                         None))
            g_delays, g_events, peak = asyncio.run(_streams(gw_url, "stream", n, args.interval,
                                                            gw_pid))
            complete = sum(e == chunks for e in g_events)
            d_med = statistics.median(d_delays) / 1e6
            g_med = statistics.median(g_delays) / 1e6
            g_p99 = sorted(g_delays)[int(len(g_delays) * 0.99)] / 1e6
            print(f"  streams complete via gateway: {complete}/{n} ({sum(g_events):,} chunks; "
                  f"direct: {sum(e == chunks for e in d_events)}/{n})")
            print(f"  per-chunk delay median: direct {d_med:.3f} ms, via gateway {g_med:.3f} ms, "
                  f"added {g_med - d_med:.3f} ms   (target <= 1 ms); gateway p99 {g_p99:.2f} ms")
            print(f"  gateway RSS peak: {peak / 2**20:.0f} MiB   (target <= 300 MB)")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
