"""One llmgw process assembled (llmgw.server): start-up with the store away."""

from __future__ import annotations

import socket
from pathlib import Path

from litestar.testing import AsyncTestClient

from llmgw.catalog.model import HealthCheck, Model
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


async def test_readyz_without_a_token_names_no_host_user_or_database() -> None:
    """The public answer is ready or not and a reason class; the details need a token."""
    port = closed_port()
    config = ServerConfig(
        database=f"postgresql://secret_user@127.0.0.1:{port}/secret_db",
        admin_tokens=[AdminToken(name="ops", token="t0ken-ops")],
        models=[Model(name="declared-ext", upstream=["http://127.0.0.1:9"])],
    )
    server = Server(config, backend=RecordingBackend())
    async with AsyncTestClient(server.asgi) as client:  # type: ignore[arg-type]
        r = await client.get("/readyz")
        assert r.status_code == 503
        assert r.json()["error"]["message"] == "not ready: the store cannot be reached"
        for secret in ("secret_user", "secret_db", str(port), "127.0.0.1"):
            assert secret not in r.text
        r = await client.get("/readyz", headers={"Authorization": "Bearer t0ken-ops"})
        assert r.status_code == 503
        assert str(port) in r.json()["error"]["message"]


async def test_metrics_and_docs_need_a_token_when_not_public(tmp_path: Path) -> None:
    """metrics: {public: false}: /metrics and /api/docs answer 401 without an admin token."""
    from llmgw.config import MetricsConfig

    for public in (True, False):
        config = ServerConfig(
            database=f"sqlite:///{tmp_path}/llmgw-{public}.db",
            admin_tokens=[AdminToken(name="ops", token="t0ken-ops")],
            metrics=MetricsConfig(public=public),
            models=[Model(name="declared-ext", upstream=["http://127.0.0.1:9"])],
        )
        server = Server(config, backend=RecordingBackend())
        async with AsyncTestClient(server.asgi) as client:  # type: ignore[arg-type]
            for path in ("/metrics", "/api/docs/openapi.json"):
                r = await client.get(path)
                assert r.status_code == (200 if public else 401), (path, r.text)
                r = await client.get(path, headers={"Authorization": "Bearer t0ken-ops"})
                assert r.status_code == 200, (path, r.text)
            assert (await client.get("/healthz")).status_code == 200


async def test_a_gateway_started_with_the_store_down_answers_503_for_models_it_cannot_know(
) -> None:
    """Not declared, and the runtime models unread: 503 with Retry-After, not 404."""
    config = ServerConfig(
        database=f"postgresql://postgres@127.0.0.1:{closed_port()}/llmgw",
        admin_tokens=[AdminToken(name="ops", token="t0ken-ops")],
        models=[Model(name="declared-ext", upstream=["http://127.0.0.1:9"],
                      health=HealthCheck(path=None))],
    )
    server = Server(config, backend=RecordingBackend())
    async with AsyncTestClient(server.asgi) as client:  # type: ignore[arg-type]
        r = await client.post("/v1/chat/completions", json={
            "model": "added-at-runtime", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "catalog_unavailable"
        assert int(r.headers["retry-after"]) >= 1
        r = await client.get("/v1/models")
        assert [m["id"] for m in r.json()["data"]] == ["declared-ext"]


async def test_an_upstreams_credentials_are_masked_in_the_api_and_the_admin_definition(
) -> None:
    """`ctl model show`, /api/v1/models and the admin page's definition (all built from
    one view) show an upstream's password and secret query values as ***."""
    from llmgw.admin.pages import definition_yaml
    from llmgw.control.views import model_view

    backend = RecordingBackend()
    url = "http://operator:hunter2-pw@127.0.0.1:9/v1?key=sk-query-secret"
    config = ServerConfig(
        database=f"postgresql://postgres@127.0.0.1:{closed_port()}/llmgw",
        admin_tokens=[AdminToken(name="ops", token="t0ken-ops")],
        models=[Model(name="declared-ext", upstream=[url])],
    )
    server = Server(config, backend=backend)
    headers = {"Authorization": "Bearer t0ken-ops"}
    async with AsyncTestClient(server.api) as client:
        listed = await client.get("/api/v1/models", headers=headers)
        shown = await client.get("/api/v1/models/declared-ext", headers=headers)
    for r in (listed, shown):
        assert r.status_code == 200, r.text
        assert "hunter2-pw" not in r.text
        assert "sk-query-secret" not in r.text
    assert shown.json()["definition"]["upstream"] == [
        "http://operator:***@127.0.0.1:9/v1?key=***"]
    view = model_view(server.ctx, server.ctx.models.catalog.models["declared-ext"], [])
    page = definition_yaml(view)
    assert "hunter2-pw" not in page
    assert "operator:***@" in page
