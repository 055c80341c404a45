"""The rules the decoder checks are the rules the OpenAPI document states, and a request
that breaks one is refused naming the rule."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from litestar.testing import AsyncTestClient

from llmgw.api.app import create_app
from llmgw.catalog import build_catalog
from llmgw.catalog.decode import convert, decode_json
from llmgw.catalog.model import NAME_PATTERN, Model
from llmgw.config import AdminToken, ServerConfig
from llmgw.control.context import AppContext
from llmgw.errors import DefinitionError
from llmgw.modelsvc import ModelService
from llmgw.store.base import Store
from llmgw.tenancy import KEY_NAME, TEAM_NAME

from .conftest import GPU_CLASSES, RecordingBackend
from .test_api import ADMIN, DECLARED, cpu

DOCUMENT = json.loads((Path(__file__).resolve().parents[2] / "api" / "openapi.json")
                      .read_text())
SCHEMAS = DOCUMENT["components"]["schemas"]


def parameter(path: str, method: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(p for p in DOCUMENT["paths"][path][method]["parameters"]
                                 if p["name"] == name)
    return found


def arm(schema: dict[str, Any], kind: str) -> dict[str, Any]:
    """The arm of an optional (a oneOf with null) that is of type ``kind``."""
    found: dict[str, Any] = next(a for a in schema.get("oneOf", [schema]) if a["type"] == kind)
    return found


@pytest.fixture
async def client(store: Store, backend: RecordingBackend) -> AsyncIterator[AsyncTestClient]:
    config = ServerConfig(admin_tokens=[AdminToken(name="alice", token="t0ken-alice")],
                          gpu_classes=GPU_CLASSES, models=[DECLARED])
    svc = ModelService(config.models, GPU_CLASSES, store,
                       placement_check=backend.check_placement)
    await svc.load()
    ctx = AppContext(config=config, models=svc, backend=backend, store=store)
    async with AsyncTestClient(create_app(ctx)) as c:
        yield c


def test_the_document_states_the_name_rules_where_names_are_given() -> None:
    """A model, team or key name has one pattern, in every body field and every path or
    query parameter that names one."""
    model = SCHEMAS["Model"]["properties"]
    assert model["name"]["pattern"] == NAME_PATTERN
    assert model["fallbacks"]["items"]["pattern"] == NAME_PATTERN
    assert SCHEMAS["TeamRequest"]["properties"]["name"]["pattern"] == TEAM_NAME.pattern
    assert SCHEMAS["KeyRequest"]["properties"]["team"]["pattern"] == TEAM_NAME.pattern
    assert SCHEMAS["KeyRequest"]["properties"]["name"]["pattern"] == KEY_NAME.pattern
    for path in ("/api/v1/models/{name}", "/api/v1/models/{name}/scale",
                 "/api/v1/models/{name}/prefetch"):
        for method in DOCUMENT["paths"][path]:
            assert parameter(path, method, "name")["schema"]["pattern"] == NAME_PATTERN
    assert parameter("/api/v1/teams/{name}/limits", "put", "name")["schema"]["pattern"] == \
        TEAM_NAME.pattern
    assert parameter("/api/v1/keys/{name}", "delete", "name")["schema"]["pattern"] == \
        KEY_NAME.pattern
    # An optional's constraint sits beside its oneOf, where it applies to the string arm.
    assert parameter("/api/v1/replicas", "get", "model")["schema"]["pattern"] == NAME_PATTERN
    assert parameter("/api/v1/keys", "get", "team")["schema"]["pattern"] == TEAM_NAME.pattern


def test_the_document_states_ranges_items_and_exclusions() -> None:
    """The logs' limit is 1 to 1000, a cost is more than 0, an allow-list and a prefetch's
    nodes are non-empty lists of non-empty strings, and a prefetch takes nodes or count."""
    limit = parameter("/api/v1/teams/{name}/logs", "get", "limit")["schema"]
    assert (limit["minimum"], limit["maximum"]) == (1, 1000)
    limits = SCHEMAS["Limits"]["properties"]
    assert limits["cost_per_day"]["exclusiveMinimum"] == 0
    assert (limits["rpm"]["minimum"], limits["log_retention_days"]["maximum"]) == (1, 3650)
    for field in (limits["models"], SCHEMAS["PrefetchRequest"]["properties"]["nodes"]):
        assert field["minItems"] == 1
        assert arm(field, "array")["items"]["minLength"] == 1
    assert SCHEMAS["PrefetchRequest"]["not"]["required"] == ["nodes", "count"]


@pytest.mark.parametrize(("method", "path"), [
    ("get", "/api/v1/models/Prod_Chat"),
    ("delete", "/api/v1/teams/ML"),
    ("delete", "/api/v1/keys/-k"),
    ("get", "/api/v1/replicas?model=a.b"),
])
async def test_a_name_that_breaks_its_rule_is_a_400_saying_the_rule(
        client: AsyncTestClient, method: str, path: str) -> None:
    """A path or query parameter that cannot be a name is refused for that, with the rule in
    words, rather than looked up and answered 404."""
    r = await client.request(method.upper(), path, headers=ADMIN)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert "parameter" in error["message"]
    assert "must be a " in error["message"]
    assert "regex" not in error["message"]


async def test_a_body_name_that_breaks_its_rule_names_the_field_and_the_rule(
        client: AsyncTestClient) -> None:
    """A team, key or model named against its rule is a 400 naming the field and saying the
    rule."""
    r = await client.post("/api/v1/teams", headers=ADMIN, json={"name": "ML Team"})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "name"
    assert f"must be {TEAM_NAME.description}" in r.json()["error"]["message"]
    r = await client.post("/api/v1/keys", headers=ADMIN, json={"name": "k", "team": "-"})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "team"
    r = await client.post("/api/v1/models", headers=ADMIN,
                          json=cpu("trial", fallbacks=["prod_chat"]))
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "fallbacks[0]"
    assert "must be a model name" in r.json()["error"]["message"]


async def test_a_prefetch_onto_an_empty_node_name_or_no_nodes_is_refused(
        client: AsyncTestClient, backend: RecordingBackend) -> None:
    """nodes: [""] and nodes: [] are 400s naming the field; nothing is fetched."""
    for body, field in (({"nodes": [""]}, "nodes[0]"), ({"nodes": []}, "nodes")):
        r = await client.post("/api/v1/models/prod-chat/prefetch", json=body, headers=ADMIN)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == field
    assert backend.prefetches == []


async def test_the_logs_of_a_team_that_is_not_there_are_404(client: AsyncTestClient) -> None:
    """A revoked (or never created) team has no logs to list: 404, as for its limits."""
    assert (await client.post("/api/v1/teams", headers=ADMIN, json={"name": "ml"})).is_success
    assert (await client.get("/api/v1/teams/ml/logs", headers=ADMIN)).status_code == 200
    assert (await client.delete("/api/v1/teams/ml", headers=ADMIN)).status_code == 204
    assert (await client.get("/api/v1/teams/ml/logs", headers=ADMIN)).status_code == 404
    r = await client.get("/api/v1/teams/ml/logs?limit=1001", headers=ADMIN)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "limit"


def test_a_name_with_a_trailing_newline_is_not_a_name() -> None:
    """Python's $ matches before a final newline; the rule does not, in the decoder or in
    the catalog's own check."""
    with pytest.raises(DefinitionError, match="must be a model name"):
        decode_json(json.dumps(cpu("chat\n")), Model)
    built_in_code = msgspec.structs.replace(convert(cpu("chat"), Model), name="chat\n")
    with pytest.raises(DefinitionError, match="contains"):
        build_catalog([built_in_code], GPU_CLASSES)
