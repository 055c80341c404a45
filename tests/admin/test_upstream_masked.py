"""The admin console shows an external model's upstream without its credentials."""

from __future__ import annotations

from pathlib import Path

from litestar.testing import AsyncTestClient

from llmgw.catalog.model import Model
from llmgw.config import AdminToken, ServerConfig

from .conftest import ADMIN_TOKEN, GPU_CLASSES, FleetBackend, make_app, sign_in

SECRET_URL = "https://operator:hunter2-admin@api.example.test/v1?api_key=sk-admin-query"


async def test_the_model_pages_mask_an_upstreams_password_and_secret_query(
        tmp_path: Path) -> None:
    """The models list, the model's page and its definition YAML show *** where the URL
    holds a password or a secret-named query parameter (the views mask it; the
    templates are the console's own)."""
    config = ServerConfig(admin_tokens=[AdminToken(name="alice", token=ADMIN_TOKEN)],
                          gpu_classes=GPU_CLASSES,
                          models=[Model(name="ext", upstream=[SECRET_URL])])
    app, _ = make_app(tmp_path / "llmgw.db", FleetBackend(), config)
    async with AsyncTestClient(app) as client:
        await sign_in(client)
        for path in ("/admin/models", "/admin/models/ext"):
            page = await client.get(path)
            assert page.status_code == 200, page.text
            assert "hunter2-admin" not in page.text
            assert "sk-admin-query" not in page.text
        page = await client.get("/admin/models/ext")
        assert "operator:***@api.example.test" in page.text
