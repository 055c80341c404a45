"""Teams and runtime keys through the control API and `llmgw ctl team|key`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from litestar.testing import AsyncTestClient

from llmgw.api.app import create_app
from llmgw.config import AdminToken, ServerConfig
from llmgw.control.context import AppContext
from llmgw.gateway.keys import KEY_PREFIX, add_key, hash_key
from llmgw.modelsvc import ModelService
from llmgw.store.base import Store

from .conftest import GPU_CLASSES, RecordingBackend

ADMIN = {"Authorization": "Bearer t0ken-alice"}


@pytest.fixture
async def client(store: Store, backend: RecordingBackend,
                 tmp_path: Path) -> AsyncIterator[AsyncTestClient]:
    keys_file = tmp_path / "keys.json"
    add_key(keys_file, "declared")
    config = ServerConfig(admin_tokens=[AdminToken(name="alice", token="t0ken-alice")],
                          gpu_classes=GPU_CLASSES, keys_file=str(keys_file))
    svc = ModelService(config.models, GPU_CLASSES, store)
    await svc.load()
    ctx = AppContext(config=config, models=svc, backend=backend, store=store)
    async with AsyncTestClient(create_app(ctx)) as c:
        yield c


async def test_a_key_is_shown_once_and_stored_as_its_hash(
        client: AsyncTestClient, store: Store) -> None:
    r = await client.post("/api/v1/teams", headers=ADMIN, json={
        "name": "ml", "limits": {"models": ["m1", "m2"], "tokens_per_day": 1000000}})
    assert r.status_code == 201, r.text
    assert r.json()["created_by"] == "alice"
    r = await client.post("/api/v1/keys", headers=ADMIN, json={
        "name": "ml-ci", "team": "ml", "limits": {"models": ["m1"], "priority": "batch"}})
    assert r.status_code == 201, r.text
    key = r.json()["key"]
    assert key.startswith(KEY_PREFIX)
    _, stored = await store.tenants()
    assert [k.sha256 for k in stored] == [hash_key(key)]
    listed = (await client.get("/api/v1/keys", headers=ADMIN)).text
    teams = (await client.get("/api/v1/teams", headers=ADMIN)).json()
    assert key not in listed
    assert hash_key(key) not in listed
    assert teams[0]["keys"] == ["ml-ci"]
    assert teams[0]["limits"] == {"models": ["m1", "m2"], "tokens_per_day": 1000000}


@pytest.mark.parametrize(("limits", "field"), [
    ({"tokens_per_day": 0}, "tokens_per_day"),
    ({"tokens_per_month": -5}, "tokens_per_month"),
    ({"tokens_per_minute": 10**15}, "tokens_per_minute"),
    ({"rpm": 0}, "rpm"),
    ({"models": []}, "models"),
])
async def test_bad_limits_are_refused_naming_the_field(
        client: AsyncTestClient, limits: dict[str, object], field: str) -> None:
    r = await client.post("/api/v1/teams", headers=ADMIN, json={"name": "ml", "limits": limits})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == field
    assert field in r.json()["error"]["message"]


async def test_a_key_may_only_narrow_its_team(client: AsyncTestClient) -> None:
    await client.post("/api/v1/teams", headers=ADMIN,
                      json={"name": "ml", "limits": {"models": ["m1"], "priority": "batch"}})
    r = await client.post("/api/v1/keys", headers=ADMIN,
                          json={"name": "k", "team": "ml", "limits": {"models": ["m2"]}})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "models"
    r = await client.post("/api/v1/keys", headers=ADMIN, json={
        "name": "k", "team": "ml", "limits": {"priority": "interactive"}})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "priority"
    r = await client.post("/api/v1/keys", headers=ADMIN, json={"name": "k", "team": "nobody"})
    assert r.status_code == 404


async def test_the_keys_file_wins_a_name(client: AsyncTestClient) -> None:
    await client.post("/api/v1/teams", headers=ADMIN, json={"name": "ml"})
    r = await client.post("/api/v1/keys", headers=ADMIN, json={"name": "declared", "team": "ml"})
    assert r.status_code == 409
    assert "keys file" in r.json()["error"]["message"]


async def test_limits_change_and_revoking_a_team_takes_its_keys(
        client: AsyncTestClient, store: Store) -> None:
    await client.post("/api/v1/teams", headers=ADMIN, json={"name": "ml"})
    assert (await client.post("/api/v1/teams", headers=ADMIN,
                              json={"name": "ml"})).status_code == 409
    await client.post("/api/v1/keys", headers=ADMIN, json={"name": "k", "team": "ml"})
    r = await client.put("/api/v1/teams/ml/limits", headers=ADMIN, json={"rpm": 60})
    assert r.status_code == 200, r.text
    assert r.json()["limits"] == {"rpm": 60}
    assert (await client.delete("/api/v1/teams/ml", headers=ADMIN)).status_code == 204
    assert await store.tenants() == ([], [])
    assert (await client.delete("/api/v1/keys/k", headers=ADMIN)).status_code == 404
    assert (await client.delete("/api/v1/teams/ml", headers=ADMIN)).status_code == 404


async def test_tenant_routes_need_an_admin_token(client: AsyncTestClient) -> None:
    assert (await client.get("/api/v1/teams")).status_code == 401
    assert (await client.post("/api/v1/keys", json={"name": "k", "team": "t"})).status_code == 401
