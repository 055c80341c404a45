"""Adding a model whose memory reservation is below one replica's need: added, and warned.

End to end through the JSON API: the GGUF file's header is read from a fake
Hub on loopback with Range requests while the model is added.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from litestar.testing import AsyncTestClient

from llmgw.api.app import create_app
from llmgw.config import AdminToken, ServerConfig
from llmgw.control.context import AppContext
from llmgw.control.reservation import reservation_checker
from llmgw.modelsvc import ModelService
from llmgw.store.base import Store
from llmgw.testing.fake_hub import FakeHub, FakeRepo
from llmgw.weights.hub import HfHub
from tests.planner.gguf_headers import gemma_gguf

from .conftest import GPU_CLASSES, RecordingBackend

ADMIN = {"Authorization": "Bearer t0ken-alice"}
GGUF = "hf://ggml-org/gemma-3-270m-GGUF/gemma-3-270m-Q4_K_M.gguf"


def gemma(memory: str, source: str = GGUF) -> dict[str, object]:
    return {"name": "gemma", "source": source, "engine": "llama.cpp",
            "profiles": [{"name": "cpu-2", "gpus": 0, "cpu_cores": 2, "memory": memory,
                          "context": 8192}]}


@pytest.fixture
def fake_hub() -> Iterator[FakeHub]:
    with FakeHub({"ggml-org/gemma-3-270m-GGUF": FakeRepo(
            files={"gemma-3-270m-Q4_K_M.gguf": gemma_gguf()})}) as fake:
        yield fake


async def api(store: Store, hub: HfHub) -> AsyncTestClient:
    """The control API of a Nomad deployment (llama-server), reading the Hub at ``hub``."""
    config = ServerConfig(admin_tokens=[AdminToken(name="alice", token="t0ken-alice")],
                          gpu_classes=GPU_CLASSES)
    backend = RecordingBackend()
    svc = ModelService(config.models, GPU_CLASSES, store, placement_check=backend.check_placement)
    await svc.load()
    ctx = AppContext(config=config, models=svc, backend=backend, store=store,
                     reservation_check=reservation_checker(embedded=False, hub=hub))
    return AsyncTestClient(create_app(ctx))


@pytest.fixture
async def client(store: Store, fake_hub: FakeHub, tmp_path: Path,
                 ) -> AsyncIterator[AsyncTestClient]:
    hub = HfHub(endpoint=fake_hub.url, cache_dir=str(tmp_path / "hf"))
    async with await api(store, hub) as c:
        yield c


async def test_a_reservation_below_the_need_is_added_with_a_warning(
        client: AsyncTestClient, fake_hub: FakeHub) -> None:
    """512 MiB for Gemma 3 270M at 8192 tokens on llama-server: added, and the add answer
    says the need (975.7 MiB), what makes it, and what to raise memory to."""
    r = await client.post("/api/v1/models", json=gemma("512MiB"), headers=ADMIN)
    assert r.status_code == 200, r.text
    assert r.json()["warnings"] == [
        "profile cpu-2 reserves 512.0MiB but one replica needs 975.7MiB of host memory "
        "(weights 405.2MiB, KV cache for 8192 tokens 39.0MiB, runtime 531.5MiB); raise memory "
        "to at least 975.7MiB, or lower context"]
    shown = await client.get("/api/v1/models/gemma", headers=ADMIN)
    assert shown.json()["definition"]["profiles"][0]["memory"] == "512MiB"
    assert "warnings" not in shown.json()
    assert all("Range" in s.headers for s in fake_hub.seen if "/resolve/" in s.path)


async def test_a_reservation_that_covers_the_need_has_no_warning(
        client: AsyncTestClient) -> None:
    """1 GiB covers it: the add answers with no warnings."""
    r = await client.post("/api/v1/models", json=gemma("1GiB"), headers=ADMIN)
    assert r.status_code == 200, r.text
    assert r.json()["warnings"] == []


class Recorded(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def control_log() -> Iterator[Recorded]:
    """What llmgw.control logs (the app's own logging setup keeps it from caplog)."""
    logger = logging.getLogger("llmgw.control")
    handler, level = Recorded(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


async def test_an_unreadable_source_gives_no_warning_and_the_add_succeeds(
        store: Store, tmp_path: Path, control_log: Recorded) -> None:
    """A Hub that does not answer: no warning, the model is added, and the log says why."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    async with await api(store, HfHub(endpoint=closed, cache_dir=str(tmp_path))) as c:
        r = await c.post("/api/v1/models", json=gemma("64MiB"), headers=ADMIN)
        assert r.status_code == 200, r.text
        assert r.json()["warnings"] == []
        assert (await c.get("/api/v1/models/gemma", headers=ADMIN)).status_code == 200
    assert any(line.startswith("model gemma: memory reservations not checked: cannot reach "
                               "the Hugging Face Hub") for line in control_log.lines)
