"""A replica's engine log through Nomad's logs API, as the admin console's replica page
reads it, and the fake's endpoint against Nomad's rules."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx

from llmgw.scheduler.nomad import render
from llmgw.scheduler.nomad.backend import NomadBackend
from llmgw.testing.fake_nomad import FakeNomad, default_fleet
from llmgw.testing.fake_nomad.records import Alloc

from .conftest import applied, catalog, config, cpu_model, make_backend


@asynccontextmanager
async def one_replica(fake: FakeNomad) -> AsyncIterator[tuple[NomadBackend, Alloc]]:
    """A backend on ``fake`` running one replica of a CPU model, and its allocation."""
    m = cpu_model("embed", cores=4)
    backend = make_backend(fake, cfg=config(fake, [m]))
    await backend.start()
    try:
        await applied(backend, catalog(m))
        fake.settle()
        [a] = fake.allocations("llmgw-embed")
        yield backend, a
    finally:
        await backend.close()


async def test_a_replicas_log_is_the_engine_tasks_stderr_across_rotated_files() -> None:
    """The engine task's stderr, in rotation order, last lines kept; stdout and the
    fetch task's output are not mixed in."""
    with FakeNomad(default_fleet()) as fake:
        async with one_replica(fake) as (backend, a):
            task = render.ENGINE_TASK
            fake.write_alloc_file(a.id, f"alloc/logs/{task}.stderr.0", "INFO loading\n")
            fake.write_alloc_file(a.id, f"alloc/logs/{task}.stderr.1",
                                  "INFO serving on :8000\nERROR out of memory\n")
            fake.write_alloc_file(a.id, f"alloc/logs/{task}.stdout.0", "stdout line\n")
            fake.write_alloc_file(a.id, f"alloc/logs/{render.FETCH_TASK}.stderr.0", "fetch\n")
            assert await backend.replica_log(a.id, 2) == [
                "INFO serving on :8000", "ERROR out of memory"]
            assert await backend.replica_log(a.id, 10) == [
                "INFO loading", "INFO serving on :8000", "ERROR out of memory"]


REFUSALS = [
    ({"type": "stderr"}, 400, "must provide task name"),
    ({"task": "engine", "type": "journal"}, 400, "must provide log type (stdout/stderr)"),
    ({"task": "engine", "type": "stderr", "origin": "middle"}, 400,
     "origin must be start or end"),
    ({"task": "engine", "type": "stdout"}, 500,
     'log entry for task "engine" and log type "stdout" not found'),
]


async def test_the_fake_serves_logs_by_nomads_rules() -> None:
    """command/agent/fs_endpoint.go ``Logs`` and client/fs_endpoint.go ``logs``: what is
    refused and why; origin=end counts offset bytes back from the end; without plain the
    bytes come base64 in a frame naming the file."""
    with FakeNomad(default_fleet()) as fake:
        async with one_replica(fake) as (_, a):
            pass
        fake.write_alloc_file(a.id, "alloc/logs/engine.stderr.0", "abcdef")
        url = f"{fake.address}/v1/client/fs/logs/{a.id}"
        async with httpx.AsyncClient() as http:
            for query, status, said in REFUSALS:
                r = await http.get(url, params={**query, "plain": "true"})
                assert (r.status_code, said in r.text) == (status, True), (query, r.text)
            tail = await http.get(url, params={"task": "engine", "type": "stderr",
                                               "origin": "end", "offset": "2",
                                               "plain": "true"})
            assert tail.text == "ef"
            assert tail.headers["content-type"].startswith("text/plain")
            framed = await http.get(url, params={"task": "engine", "type": "stderr"})
        frame = json.loads(framed.text)
        assert base64.b64decode(frame["Data"]) == b"abcdef"
        assert frame["File"] == "alloc/logs/engine.stderr.0"
