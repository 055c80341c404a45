"""Retries, ejection, fallbacks, timeouts, broken streams and disconnects."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import msgspec
import pytest

from llmgw.gateway.proxy import StreamUsage
from llmgw.scheduler.base import PROBES_REPORT, ProbeReport
from tests.gateway.conftest import GatewayFactory, GatewayHandle, chat_model, wait_for
from tests.gateway.doubles import FakeBackend

ROOT = Path(__file__).resolve().parents[2]


def _metric(text: str, line_start: str) -> float:
    for line in text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def _metrics(gw: GatewayHandle) -> str:
    return (await gw.client.get("/metrics")).text


def _all_released(gw: GatewayHandle) -> bool:
    return all(s.outstanding == 0 for s in gw.gateway.balancer._state.values())


def _closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


async def test_5xx_is_retried_on_another_replica_which_then_takes_the_traffic(
        make_gateway: GatewayFactory, engines) -> None:
    """A replica answering 500 is invisible to the client and is ejected for eject_for."""
    bad, good = await engines("bad"), await engines("good")
    bad.fail_status = 500
    gw = await make_gateway([chat_model("m", upstream=[bad.url, good.url])], eject_for="60s")
    responses = [await gw.chat("m") for _ in range(6)]
    assert [r.status_code for r in responses] == [200] * 6
    assert all(r.json()["choices"][0]["message"]["content"] == "hello from good"
               for r in responses)
    assert len(bad.requests) == 1
    assert len(good.requests) == 6
    text = await _metrics(gw)
    assert _metric(text, 'llmgw_gateway_upstream_errors_total{model="m",reason="status_5xx"}') \
        == 1
    assert _metric(text, 'llmgw_gateway_retries_total{model="m"}') == 1
    assert _metric(text, 'llmgw_gateway_ejected_replicas{model="m"}') == 1
    assert _all_released(gw)


async def test_refused_connection_is_retried(make_gateway: GatewayFactory, engines) -> None:
    """A replica that refuses connections costs the client nothing."""
    good = await engines("good")
    dead = _closed_port_url()
    gw = await make_gateway([chat_model("m", upstream=[dead, good.url])])
    statuses = [(await gw.chat("m")).status_code for _ in range(4)]
    assert statuses == [200] * 4
    text = await _metrics(gw)
    assert _metric(text, 'llmgw_gateway_upstream_errors_total{model="m",reason="connect"}') == 1


async def test_all_replicas_down_the_fallback_answers_and_the_header_says_so(
        make_gateway: GatewayFactory, engines) -> None:
    """With every replica of a model failing, its fallback answers and x-llmgw-model names it."""
    down1, down2, spare = await engines("d1"), await engines("d2"), await engines("spare")
    down1.fail_status = down2.fail_status = 503
    gw = await make_gateway([
        chat_model("big", upstream=[down1.url, down2.url], fallbacks=["small"]),
        chat_model("small", upstream=[spare.url], served_name="org/small"),
    ])
    for stream in (False, True):
        r = await gw.chat("big", stream=stream)
        assert r.status_code == 200
        assert r.headers["x-llmgw-model"] == "small"
    assert [b["model"] for b in spare.requests] == ["org/small", "org/small"]
    assert len(down1.requests) == 1
    assert len(down2.requests) == 1
    text = await _metrics(gw)
    assert _metric(text, 'llmgw_gateway_fallbacks_total{fallback="small",model="big"}') == 2
    assert _metric(text, 'llmgw_gateway_requests_total{model="big",status="200"}') == 2


async def test_fallbacks_are_tried_in_order(make_gateway: GatewayFactory, engines) -> None:
    """The first fallback that answers is used; later ones are not asked."""
    main, first, second = await engines("main"), await engines("first"), await engines("second")
    main.fail_status = first.fail_status = 500
    gw = await make_gateway([
        chat_model("a", upstream=[main.url], fallbacks=["b", "c"]),
        chat_model("b", upstream=[first.url]),
        chat_model("c", upstream=[second.url]),
    ])
    r = await gw.chat("a")
    assert r.headers["x-llmgw-model"] == "c"
    assert (len(main.requests), len(first.requests), len(second.requests)) == (1, 1, 1)


async def test_a_fallbacks_own_fallbacks_come_before_the_next_one(
        make_gateway: GatewayFactory, engines) -> None:
    """a → [b, d], b → [c]: with a and b down, c answers (depth-first), and d is not asked;
    a model on two branches of the chain is tried once."""
    main, first, deep, last = (await engines("main"), await engines("first"),
                               await engines("deep"), await engines("last"))
    main.fail_status = first.fail_status = 503
    gw = await make_gateway([
        chat_model("a", upstream=[main.url], fallbacks=["b", "d"]),
        chat_model("b", upstream=[first.url], fallbacks=["c", "d"]),
        chat_model("c", upstream=[deep.url]),
        chat_model("d", upstream=[last.url]),
    ])
    r = await gw.chat("a")
    assert r.status_code == 200, r.text
    assert r.headers["x-llmgw-model"] == "c"
    assert (len(main.requests), len(first.requests), len(deep.requests),
            len(last.requests)) == (1, 1, 1, 0)
    deep.fail_status = 503
    r = await gw.chat("a")
    assert r.headers["x-llmgw-model"] == "d"
    assert len(last.requests) == 1


async def test_everything_failing_is_502_naming_each_failure(make_gateway: GatewayFactory,
                                                             engines) -> None:
    """When no replica nor fallback answers, the client gets 502 listing what was tried,
    also once they are all ejected (each still gets one last attempt)."""
    a, b = await engines("a"), await engines("b")
    a.fail_status = b.fail_status = 500
    gw = await make_gateway([chat_model("x", upstream=[a.url], fallbacks=["y"]),
                             chat_model("y", upstream=[b.url])])
    for expected_requests in (1, 2):
        r = await gw.chat("x")
        assert r.status_code == 502
        error = r.json()["error"]
        assert error["code"] == "upstream_error"
        assert error["type"] == "server_error"
        assert a.url in error["message"]
        assert b.url in error["message"]
        assert "HTTP 500" in error["message"]
        assert (len(a.requests), len(b.requests)) == (expected_requests, expected_requests)


async def test_an_ejected_only_replica_still_gets_a_last_attempt(make_gateway: GatewayFactory,
                                                                 engines) -> None:
    """One failure of a model's only replica does not make it answer 503 for eject_for."""
    only = await engines("only")
    only.fail_status, only.fail_times = 500, 1
    gw = await make_gateway([chat_model("m", upstream=[only.url])], eject_for="60s")
    first = await gw.chat("m")
    assert first.status_code == 502
    assert gw.gateway.balancer.is_ejected(only.url, gw.gateway._loop_time())
    second = await gw.chat("m")
    assert second.status_code == 200
    assert second.json()["choices"][0]["message"]["content"] == "hello from only"
    assert not gw.gateway.balancer.is_ejected(only.url, gw.gateway._loop_time())


async def test_timeout_before_the_first_byte_is_retried(make_gateway: GatewayFactory,
                                                        engines) -> None:
    """A replica that sends nothing within timeouts.first_byte is abandoned for another."""
    stuck, good = await engines("stuck"), await engines("good")
    stuck.hang = True
    gw = await make_gateway([chat_model("m", upstream=[stuck.url, good.url],
                                        timeouts={"first_byte": "2s"})])
    r = await gw.chat("m", stream=True)
    r2 = await gw.chat("m")
    assert r.status_code == 200
    assert r2.status_code == 200
    assert "tok0" in r.text
    await wait_for(lambda: stuck.cancelled == 1, what="the stuck engine to see the abandon")
    text = await _metrics(gw)
    assert _metric(text, 'llmgw_gateway_upstream_errors_total{model="m",reason="timeout"}') == 1


async def test_all_attempts_timing_out_is_504(make_gateway: GatewayFactory, engines) -> None:
    """If every attempt timed out before its first byte, the client gets 504."""
    stuck = await engines("stuck")
    stuck.hang = True
    gw = await make_gateway([chat_model("m", upstream=[stuck.url],
                                        timeouts={"first_byte": "200ms"})])
    r = await gw.chat("m")
    assert r.status_code == 504
    assert "timeouts.first_byte" in r.json()["error"]["message"]


async def test_a_slow_first_token_is_not_killed_by_the_idle_timeout(
        make_gateway: GatewayFactory, engines) -> None:
    """The idle timeout starts after the first chunk: a first token slower than it still comes."""
    slow = await engines("slow")
    slow.first_chunk_delay = 3.0
    gw = await make_gateway([chat_model("m", upstream=[slow.url],
                                        timeouts={"idle": "2s", "first_byte": "30s"})])
    r = await gw.chat("m", stream=True)
    assert r.status_code == 200
    assert r.text.count("tok") == 3
    assert "error" not in r.text


async def test_headers_without_a_first_chunk_are_still_retried(make_gateway: GatewayFactory,
                                                               engines) -> None:
    """An engine that sends 200 and dies before its first token is retried on another replica."""
    flaky, good = await engines("flaky"), await engines("good")
    flaky.headers_then_die = True
    gw = await make_gateway([chat_model("m", upstream=[flaky.url, good.url])])
    results = [await gw.chat("m", stream=True) for _ in range(3)]
    assert all(r.status_code == 200 and "tok2" in r.text for r in results)
    assert len(flaky.requests) == 1


async def test_a_stream_broken_after_it_started_ends_with_an_error_event_and_no_retry(
        make_gateway: GatewayFactory, engines) -> None:
    """Once chunks reached the client, a dying engine ends the stream with an OpenAI error
    event, and neither the fallback nor anyone else is asked."""
    dying, other = await engines("dying"), await engines("other")
    dying.chunks = 5
    dying.die_after_chunks = 2
    gw = await make_gateway([chat_model("m", upstream=[dying.url], fallbacks=["spare"]),
                             chat_model("spare", upstream=[other.url])])
    r = await gw.chat("m", stream=True)
    assert r.status_code == 200
    events = [line[len("data: "):] for line in r.text.splitlines() if line.startswith("data: ")]
    assert "tok0" in events[0]
    assert "tok1" in events[1]
    error = json.loads(events[-1])["error"]
    assert error["code"] == "stream_interrupted"
    assert error["type"] == "server_error"
    assert "[DONE]" not in r.text
    assert other.requests == []
    text = await _metrics(gw)
    assert _metric(text, 'llmgw_gateway_upstream_errors_total{model="m",reason="stream_broken"}'
                   ) == 1
    assert _all_released(gw)


async def test_an_idle_stream_ends_with_an_error_event(make_gateway: GatewayFactory,
                                                       engines) -> None:
    """A stream that stalls longer than timeouts.idle after starting is ended with an error."""
    stalling = await engines("stalling")
    stalling.gate = asyncio.Event()  # never opened: stalls after the first chunk
    gw = await make_gateway([chat_model("m", upstream=[stalling.url],
                                        timeouts={"idle": "300ms"})])
    r = await gw.chat("m", stream=True)
    assert "tok0" in r.text
    assert '"code":"stream_interrupted"' in r.text
    assert "timeouts.idle" in r.text
    await wait_for(lambda: stalling.cancelled == 1, what="the engine to be cancelled")


# One probe that times out marks a replica down, the healthy one included: its timeout
# must hold the slowest answer a loaded machine gives on loopback, not only a quiet one's.
PROBES = {"interval": "1s", "timeout": "1s"}


async def test_unhealthy_replica_absent_from_endpoints_gets_no_traffic(
        make_gateway: GatewayFactory, engines) -> None:
    """A replica the scheduler does not report healthy receives no request at all."""
    loading, ready = await engines("loading"), await engines("ready")
    backend = FakeBackend()
    backend.set_endpoints("m", [ready.url])   # 'loading' runs but fails its check
    gw = await make_gateway([chat_model("m")], backend=backend)
    results = await asyncio.gather(*(gw.chat("m") for _ in range(20)))
    assert all(r.status_code == 200 for r in results)
    assert loading.requests == []
    assert len(ready.requests) == 20
    backend.set_endpoints("m", [ready.url, loading.url])   # now healthy
    await asyncio.gather(*(gw.chat("m") for _ in range(20)))
    assert loading.requests


async def test_scheduled_model_without_healthy_replica_is_503(make_gateway: GatewayFactory
                                                              ) -> None:
    """A model whose replicas are all still loading answers 503 with Retry-After at once."""
    gw = await make_gateway([chat_model("m")])
    r = await gw.chat("m")
    assert r.status_code == 503
    assert r.headers["retry-after"]


@pytest.fixture
async def process_engines() -> AsyncIterator[list[tuple[asyncio.subprocess.Process, str]]]:
    procs: list[tuple[asyncio.subprocess.Process, str]] = []
    for name in ("p1", "p2"):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.gateway.engine", "--name", name, "--delay", "0.1",
            cwd=ROOT, stdout=asyncio.subprocess.PIPE)
        assert proc.stdout is not None
        url = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode().strip()
        procs.append((proc, url))
    yield procs
    for proc, _ in procs:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


async def test_killing_a_replica_under_load_shows_no_error_to_clients(
        make_gateway: GatewayFactory, process_engines) -> None:
    """SIGKILL of one of two replicas while requests are in flight on it: every client gets
    200, the cut requests having been retried on the survivor."""
    (victim, victim_url), (_, survivor_url) = process_engines
    gw = await make_gateway([chat_model("m", upstream=[victim_url, survivor_url])])
    done: list[int] = []
    gate = asyncio.Semaphore(16)

    async def one() -> int:
        async with gate:
            status = (await gw.chat("m")).status_code
            done.append(status)
            return status

    tasks = [asyncio.create_task(one()) for _ in range(120)]
    await wait_for(lambda: len(done) >= 20, what="load to be under way")
    os.kill(victim.pid, signal.SIGKILL)
    statuses = await asyncio.gather(*tasks)
    assert statuses == [200] * 120
    text = await _metrics(gw)
    cut = sum(_metric(text, f'llmgw_gateway_upstream_errors_total{{model="m",reason="{r}"}}')
              for r in ("broken", "connect"))
    assert cut >= 1, "the kill should have cut requests in flight"
    assert _all_released(gw)


async def _open_raw(url: str, path: str, body: dict[str, object]
                    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    data = json.dumps(body).encode()
    writer.write(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    await writer.drain()
    return reader, writer


async def test_client_disconnect_mid_stream_cancels_the_upstream(make_gateway: GatewayFactory,
                                                                 engines) -> None:
    """A client that goes away after the first chunk makes the engine see the cancellation."""
    engine = await engines()
    engine.chunks = 10
    engine.gate = asyncio.Event()   # holds the stream after its first chunk
    gw = await make_gateway([chat_model("m", upstream=[engine.url])])
    reader, writer = await _open_raw(gw.url, "/v1/chat/completions",
                                     {"model": "m", "messages": [], "stream": True})
    seen = b""
    while b"tok0" not in seen:
        seen += await asyncio.wait_for(reader.read(4096), 30)
    writer.close()
    await asyncio.wait_for(engine.cancel_seen.wait(), 30)
    assert engine.finished == 0
    await wait_for(lambda: _all_released(gw), what="the replica's counter to come back to 0")
    text = await _metrics(gw)
    assert _metric(text, 'llmgw_gateway_requests_total{model="m",status="499"}') == 1
    assert _metric(text, 'llmgw_gateway_in_flight_requests{model="m"}') == 0


async def test_client_disconnect_while_waiting_cancels_the_upstream(
        make_gateway: GatewayFactory, engines) -> None:
    """A client that gives up on a non-streaming request before any answer cancels it upstream."""
    engine = await engines()
    engine.hang = True
    gw = await make_gateway([chat_model("m", upstream=[engine.url])])
    _reader, writer = await _open_raw(gw.url, "/v1/chat/completions", {"model": "m"})
    await wait_for(lambda: engine.in_flight == 1, what="the request to reach the engine")
    writer.close()
    await asyncio.wait_for(engine.cancel_seen.wait(), 30)
    await wait_for(lambda: _all_released(gw), what="the counter to come back to 0")
    # the replica is not blamed for the client's departure
    assert not gw.gateway.balancer.is_ejected(engine.url, gw.gateway._loop_time())


def test_stream_usage_is_found_across_chunk_boundaries() -> None:
    """Usage split over two TCP reads is still found; events without usage are not parsed."""
    scanner = StreamUsage()
    event = b'data: {"choices":[],"usage":{"prompt_tokens":11,"completion_tokens":4}}\n\n'
    scanner.feed(b'data: {"choices":[{"delta":{"content":"x"}}],"usage":null}\n\n')
    assert scanner.usage is None
    scanner.feed(event[:30])
    assert scanner.usage is None
    scanner.feed(event[30:] + b"data: [DONE]\n\n")
    assert scanner.usage is not None
    assert (scanner.usage.prompt_tokens, scanner.usage.completion_tokens) == (11, 4)


async def test_httpx_client_sees_an_openai_error_for_a_broken_stream(
        make_gateway: GatewayFactory, engines) -> None:
    """The error event of a broken stream parses as OpenAI's error object."""
    dying = await engines()
    dying.die_after_chunks = 1
    gw = await make_gateway([chat_model("m", upstream=[dying.url])])
    async with httpx.AsyncClient(base_url=gw.url) as client:
        async with client.stream("POST", "/v1/chat/completions",
                                 json={"model": "m", "stream": True}) as r:
            lines = [line async for line in r.aiter_lines() if line.startswith("data: ")]
    assert set(json.loads(lines[-1][6:])) == {"error"}


async def _open_slow_reader(url: str, body: dict[str, object]
                            ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A raw client with a tiny receive buffer, so the gateway feels it stop reading."""
    parts = urlsplit(url)
    assert parts.hostname is not None
    assert parts.port is not None
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (parts.hostname, parts.port))
    reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 20)
    data = json.dumps(body).encode()
    writer.write(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                 f"Content-Type: application/json\r\nConnection: close\r\n"
                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
    assert head.startswith(b"HTTP/1.1 200"), head
    return reader, writer


# Far more than every buffer between engine and client can hold (kernel
# buffers on loopback autotune to tens of MiB), so a client that stops
# reading stops the stream.
_BIG_CHUNKS, _CHUNK_PADDING = 96, 1 << 20


async def test_a_client_that_pauses_reading_does_not_eject_the_replica(
        make_gateway: GatewayFactory, engines) -> None:
    """A client reading nothing for longer than timeouts.idle still gets the whole stream, and
    the replica is not blamed for the wait."""
    engine = await engines("big")
    engine.chunks, engine.chunk_padding = _BIG_CHUNKS, _CHUNK_PADDING
    gw = await make_gateway([chat_model("m", upstream=[engine.url],
                                        timeouts={"idle": "500ms", "first_byte": "30s"})])
    reader, writer = await _open_slow_reader(gw.url, {"model": "m", "stream": True})
    loop = asyncio.get_running_loop()
    paused = loop.time()
    try:
        await wait_for(lambda: loop.time() - paused > 2.0, what="a pause of 4 x timeouts.idle")
        assert engine.finished == 0, "the stream should have been held up by the paused client"
        assert not gw.gateway.balancer.is_ejected(engine.url, loop.time())
        rest = await asyncio.wait_for(reader.read(), 60)
    finally:
        writer.close()
    assert rest.count(b'"padding"') == _BIG_CHUNKS
    assert b"data: [DONE]" in rest
    assert b"stream_interrupted" not in rest
    assert not gw.gateway.balancer.is_ejected(engine.url, loop.time())


async def test_a_client_that_stops_reading_is_gone_not_the_replica(
        make_gateway: GatewayFactory, engines) -> None:
    """A client that stops reading is dropped after the client send timeout: the upstream is
    cancelled, the replica stays in rotation and the next client is served."""
    engine = await engines("big")
    engine.chunks, engine.chunk_padding = _BIG_CHUNKS, _CHUNK_PADDING
    gw = await make_gateway([chat_model("m", upstream=[engine.url],
                                        timeouts={"idle": "500ms", "first_byte": "30s"})])
    gw.gateway.forwarder.client_send_timeout = 2.0
    _reader, writer = await _open_slow_reader(gw.url, {"model": "m", "stream": True})
    balancer, now = gw.gateway.balancer, gw.gateway._loop_time
    try:
        await wait_for(lambda: engine.cancelled == 1 or balancer.is_ejected(engine.url, now()),
                       what="the gateway to give up on the client")
        assert not balancer.is_ejected(engine.url, now())
        assert engine.finished == 0
        await wait_for(lambda: _all_released(gw), what="the replica's counter to come back to 0")
        text = await _metrics(gw)
        assert _metric(text, 'llmgw_gateway_requests_total{model="m",status="499"}') == 1
        assert _metric(text, 'llmgw_gateway_upstream_errors_total{model="m"') == 0
        engine.chunks, engine.chunk_padding = 3, 0
        r = await gw.chat("m")
        assert r.status_code == 200
        assert not balancer.is_ejected(engine.url, now())
    finally:
        writer.close()


async def test_an_upstream_failing_its_health_probe_gets_no_requests(
        make_gateway: GatewayFactory, engines) -> None:
    """A replica whose /health answers 503 is left out until it passes again."""
    good, sick = await engines("good"), await engines("sick")
    sick.health_status = 503
    gw = await make_gateway([chat_model("m", upstream=[good.url, sick.url],
                                        routing={"policy": "round-robin"},
                                        health=PROBES)])
    await wait_for(lambda: sick.url in gw.gateway.prober.down, what="the failed probe")
    assert [(await gw.chat("m")).status_code for _ in range(6)] == [200] * 6
    assert (len(good.requests), len(sick.requests)) == (6, 0)
    # What the probes found reaches the control plane through the store.
    await gw.gateway.publish_probes()
    [row] = await gw.gateway.store.reports(PROBES_REPORT, 60)
    assert msgspec.json.decode(row.payload, type=ProbeReport) == ProbeReport(
        probed={"m": 2}, down={"m": [sick.url]})
    sick.health_status = 200
    await wait_for(lambda: sick.url not in gw.gateway.prober.down, what="the passed probe")
    assert [(await gw.chat("m")).status_code for _ in range(4)] == [200] * 4
    assert len(sick.requests) == 2


async def test_a_restarted_upstream_gets_requests_without_waiting_out_its_ejection(
        make_gateway: GatewayFactory, engines) -> None:
    """Ejected for ten minutes by a failed request, then down and back up: the probe that
    sees it back returns it to rotation at once."""
    good, flaky = await engines("good"), await engines("flaky")
    gw = await make_gateway([chat_model("m", upstream=[flaky.url, good.url],
                                        routing={"policy": "round-robin"},
                                        health=PROBES)],
                            eject_for="10m", eject_max="10m")
    flaky.fail_status, flaky.fail_times = 500, 1
    for _ in range(2):
        assert (await gw.chat("m")).status_code == 200
    assert gw.gateway.balancer.is_ejected(flaky.url, gw.gateway.now())
    flaky.health_status = 503     # the replica restarts: down, then up
    await wait_for(lambda: flaky.url in gw.gateway.prober.down, what="the failed probe")
    flaky.health_status = 200
    await wait_for(lambda: flaky.url not in gw.gateway.prober.down, what="the passed probe")
    served = len(flaky.requests)
    assert [(await gw.chat("m")).status_code for _ in range(4)] == [200] * 4
    assert len(flaky.requests) == served + 2


def test_a_health_path_must_be_a_path_and_probes_must_fit_their_interval() -> None:
    from llmgw.catalog.build import build_catalog
    from llmgw.errors import DefinitionError

    with pytest.raises(DefinitionError, match="health.path: 'health' must start with /"):
        build_catalog([chat_model("m", upstream=["http://a:1"], health={"path": "health"})])
    with pytest.raises(DefinitionError, match="health.timeout"):
        build_catalog([chat_model("m", upstream=["http://a:1"],
                                  health={"interval": "1s", "timeout": "2s"})])
