"""Two real `llmgw serve` processes on one Postgres.

Concurrent adds and scales through both never leave either process
disagreeing with the database, and a change made through one is visible
through the other within a second.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psycopg
import pytest

from .conftest import _postgres_schema_url

TOKEN = "two-proc-token"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def schema_url(postgres_url: str) -> Iterator[str]:
    yield from _postgres_schema_url(postgres_url)


@pytest.fixture
def two_servers(schema_url: str, tmp_path: Path) -> Iterator[list[str]]:
    config = tmp_path / "server.yaml"
    config.write_text("scheduler: {kind: local}\nmodels:\n"
                      "  - name: declared-ext\n    upstream: [http://127.0.0.1:9]\n")
    urls, procs = [], []
    for i in range(2):
        port = _free_port()
        env = {**os.environ, "LLMGW_DATABASE_URL": schema_url,
               "LLMGW_ADMIN_TOKENS": f"proc{i}={TOKEN}"}
        # The child holds its own copy of the descriptor; ours closes at once.
        with open(tmp_path / f"serve{i}.log", "w") as log:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "llmgw.cli", "serve", "--config", str(config),
                 "--listen", f"127.0.0.1:{port}", "--log-level", "warning"],
                env=env, stdout=log, stderr=subprocess.STDOUT))
        urls.append(f"http://127.0.0.1:{port}")
    try:
        for i, (url, proc) in enumerate(zip(urls, procs, strict=True)):
            deadline = time.monotonic() + 60
            while True:
                assert proc.poll() is None, (tmp_path / f"serve{i}.log").read_text()
                try:
                    if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, "llmgw serve did not become ready"
                time.sleep(0.1)
        yield urls
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)


def ext(name: str) -> dict[str, object]:
    return {"name": name, "upstream": ["http://127.0.0.1:9"]}


def catalog_of(url: str) -> dict[str, tuple[int, int]]:
    r = httpx.get(f"{url}/api/v1/models", headers=HEADERS, timeout=10)
    r.raise_for_status()
    return {m["name"]: (m["scaling"]["min"], m["scaling"]["max"]) for m in r.json()}


def database_of(url: str) -> dict[str, tuple[int, int]]:
    import json

    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT name, definition FROM models").fetchall()
    out = {"declared-ext": (1, 1)}
    for name, definition in rows:
        s = json.loads(bytes(definition)).get("scaling", {})
        lo = s.get("min", 1)
        out[name] = (lo, s.get("max") or max(lo, 1))
    return out


@pytest.mark.slow
def test_concurrent_changes_through_two_processes_agree_with_the_database(
        two_servers: list[str], schema_url: str) -> None:
    """Adds and scales racing through two instances leave both equal to the database."""
    a, b = two_servers

    def work(i: int) -> None:
        first, second = (a, b) if i % 2 else (b, a)
        name = f"m{i % 6}"
        httpx.post(f"{first}/api/v1/models?skip_source_check=true", json=ext(name),
                   headers=HEADERS, timeout=30).raise_for_status()
        httpx.put(f"{second}/api/v1/models/{name}/scale", json={"min": i % 4},
                  headers=HEADERS, timeout=30).raise_for_status()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(work, range(40)))
    expected = database_of(schema_url)
    deadline = time.monotonic() + 10
    while catalog_of(a) != expected or catalog_of(b) != expected:
        assert time.monotonic() < deadline, (catalog_of(a), catalog_of(b), expected)
        time.sleep(0.05)


@pytest.mark.slow
def test_a_fallback_and_its_removal_racing_through_two_processes_never_orphan_it(
        two_servers: list[str], schema_url: str) -> None:
    """Without the catalog lock both would validate against a stale catalog and
    commit, leaving a model that falls back to nothing."""
    a, b = two_servers

    def add_dependant(i: int) -> None:
        body = {**ext(f"user-{i}"), "fallbacks": [f"base-{i}"]}
        httpx.post(f"{a}/api/v1/models?skip_source_check=true", json=body, headers=HEADERS,
                   timeout=30)

    def remove_base(i: int) -> None:
        httpx.delete(f"{b}/api/v1/models/base-{i}", headers=HEADERS, timeout=30)

    for i in range(15):
        httpx.post(f"{a}/api/v1/models?skip_source_check=true", json=ext(f"base-{i}"),
                   headers=HEADERS, timeout=30).raise_for_status()
    with ThreadPoolExecutor(8) as pool:
        for i in range(15):
            pool.submit(add_dependant, i)
            pool.submit(remove_base, i)
    import json

    with psycopg.connect(schema_url) as conn:
        rows = dict(conn.execute("SELECT name, definition FROM models").fetchall())
    for name, definition in rows.items():
        for fallback in json.loads(bytes(definition)).get("fallbacks", []):
            assert fallback in rows, f"{name} falls back to {fallback}, which was removed"


@pytest.mark.slow
def test_a_change_through_one_process_is_seen_by_the_other(two_servers: list[str]) -> None:
    """The second instance follows the catalog version without being told
    (bench/catalog_follow.py measures how fast: the promise is within a second)."""
    a, b = two_servers
    for i in range(3):
        name = f"seen-{i}"
        httpx.post(f"{a}/api/v1/models?skip_source_check=true", json=ext(name),
                   headers=HEADERS, timeout=30).raise_for_status()
        start = time.monotonic()
        while name not in catalog_of(b):
            assert time.monotonic() - start < 20, f"{name} never appeared on the second instance"
            time.sleep(0.02)
