"""One llmgw process assembled (llmgw.server): start-up with the store away."""

from __future__ import annotations

import socket

from litestar.testing import AsyncTestClient

from llmgw.catalog.model import Model
from llmgw.config import AdminToken, ServerConfig
from llmgw.server import Server

from .conftest import RecordingBackend


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_a_server_whose_store_is_down_serves_reads_refuses_writes_and_schedules_nothing(
) -> None:
    """The declared models are listed, writes are 503, and the scheduler is told nothing."""
    backend = RecordingBackend()
    config = ServerConfig(
        database=f"postgresql://postgres@127.0.0.1:{closed_port()}/llmgw",
        admin_tokens=[AdminToken(name="ops", token="t0ken-ops")],
        models=[Model(name="declared-ext", upstream=["http://127.0.0.1:9"])],
    )
    server = Server(config, backend=backend)
    headers = {"Authorization": "Bearer t0ken-ops"}
    async with AsyncTestClient(server.api) as client:
        r = await client.get("/api/v1/models", headers=headers)
        assert [m["name"] for m in r.json()] == ["declared-ext"]
        r = await client.post("/api/v1/models?skip_source_check=true", headers=headers,
                              json={"name": "trial", "upstream": ["http://127.0.0.1:9"]})
        assert r.status_code == 503, r.text
        assert r.json()["error"]["type"] == "store_unavailable"
        r = await client.get("/readyz")
        assert r.status_code == 503
        assert backend.applied == []
