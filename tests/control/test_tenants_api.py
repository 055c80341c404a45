"""Teams and runtime keys through the control API and `llmgw ctl team|key`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from litestar.testing import AsyncTestClient

from llmgw.api.app import create_app
from llmgw.catalog.model import Model
from llmgw.config import AdminToken, ServerConfig
from llmgw.control.context import AppContext
from llmgw.gateway.keys import KEY_PREFIX, add_key, hash_key
from llmgw.modelsvc import ModelService
from llmgw.store.base import Store, UsageRecord

from .conftest import GPU_CLASSES, RecordingBackend

ADMIN = {"Authorization": "Bearer t0ken-alice"}


@pytest.fixture
async def client(store: Store, backend: RecordingBackend,
                 tmp_path: Path) -> AsyncIterator[AsyncTestClient]:
    keys_file = tmp_path / "keys.json"
    add_key(keys_file, "declared")
    # The allow-lists below name these; an allow-list naming what the catalog does not
    # serve is refused.
    served = [Model(name=n, upstream=["http://10.0.5.9:8000/v1"]) for n in ("m1", "m2")]
    config = ServerConfig(admin_tokens=[AdminToken(name="alice", token="t0ken-alice")],
                          gpu_classes=GPU_CLASSES, keys_file=str(keys_file), models=served)
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
    """A limit out of its range is a 400 naming its key path in the body: under limits in
    a new team, at the top of a team's new limits."""
    r = await client.post("/api/v1/teams", headers=ADMIN, json={"name": "ml", "limits": limits})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == f"limits.{field}"
    assert f"limits.{field}" in r.json()["error"]["message"]
    assert (await client.post("/api/v1/teams", headers=ADMIN, json={"name": "ml"})).is_success
    r = await client.put("/api/v1/teams/ml/limits", headers=ADMIN, json=limits)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == field


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


HOUR = 1_773_500_400          # 2026-03-14T15:00:00Z


def _rec(id_: str, at: float, team: str, key: str, model: str, prompt: int,
         completion: int) -> UsageRecord:
    return UsageRecord(id=id_, at=at, key=key, team=team, model=model, replica="r",
                       gpu_class="", prompt_tokens=prompt, cached_tokens=1,
                       completion_tokens=completion, status=200, latency=0.1, ttft=None)


async def test_usage_by_team_per_hour_and_by_model_per_day(
        client: AsyncTestClient, store: Store) -> None:
    await store.record_usage([
        _rec("a", HOUR + 10, "ml", "k1", "m", 100, 10),
        _rec("b", HOUR + 20, "web", "k2", "m", 5, 5),
        _rec("c", HOUR + 3700, "ml", "k1", "n", 1, 1),
    ])
    r = await client.get("/api/v1/usage", headers=ADMIN, params={
        "by": "team", "since": "2026-03-14T15:30:00Z", "until": "2026-03-14T16:10:00Z"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["since"] == "2026-03-14T15:00:00Z"     # whole hours
    assert body["until"] == "2026-03-14T17:00:00Z"
    assert [(b["start"], b["group"], b["requests"], b["total_tokens"])
            for b in body["buckets"]] == [
        ("2026-03-14T15:00:00Z", "ml", 1, 110), ("2026-03-14T15:00:00Z", "web", 1, 10),
        ("2026-03-14T16:00:00Z", "ml", 1, 2)]
    assert [(t["group"], t["total_tokens"], t["cached_tokens"]) for t in body["totals"]] == [
        ("ml", 112, 2), ("web", 10, 1)]
    r = await client.get("/api/v1/usage", headers=ADMIN, params={
        "by": "model", "granularity": "day", "since": "2026-03-14T00:00:00Z",
        "until": "2026-03-15T00:00:00Z"})
    assert [(b["start"], b["group"], b["requests"]) for b in r.json()["buckets"]] == [
        ("2026-03-14T00:00:00Z", "m", 2), ("2026-03-14T00:00:00Z", "n", 1)]


@pytest.mark.parametrize("granularity", ["hour", "day"])
async def test_any_span_is_answered_from_the_data_in_it(
        client: AsyncTestClient, store: Store, granularity: str) -> None:
    """A report over every instant there is (year 1 to 9999) holds the ledger's rows, one
    since 2000 that ends before them is empty rather than refused, and the bounds are shown
    within what a date-time can say."""
    await store.record_usage([_rec("a", HOUR + 10, "ml", "k1", "m", 100, 10)])
    r = await client.get("/api/v1/usage", headers=ADMIN, params={
        "granularity": granularity, "since": "0001-01-01T00:00:00Z",
        "until": "9999-12-31T23:59:59Z"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["since"], body["until"]) == ("0001-01-01T00:00:00Z", "9999-12-31T23:59:59Z")
    assert [(b["group"], b["total_tokens"]) for b in body["buckets"]] == [("ml", 110)]
    r = await client.get("/api/v1/usage", headers=ADMIN, params={
        "granularity": granularity, "since": "2000-01-01T00:00:00Z",
        "until": "2026-03-14T00:00:00Z"})
    assert r.status_code == 200, r.text
    assert r.json()["buckets"] == []
    assert r.json()["totals"] == []


@pytest.mark.parametrize("path", ["/api/v1/usage", "/api/v1/costs"])
async def test_a_span_that_ends_before_it_starts_is_answered_empty(
        client: AsyncTestClient, store: Store, path: str) -> None:
    """[since, until) with until before since holds no bucket: an empty report from since."""
    await store.record_usage([_rec("a", HOUR + 10, "ml", "k1", "m", 100, 10)])
    r = await client.get(path, headers=ADMIN, params={
        "since": "2026-03-15T00:00:00Z", "until": "2026-03-14T00:00:00Z"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["since"] == body["until"] == "2026-03-15T00:00:00Z"
    assert body.get("buckets", []) == []
    assert body.get("teams", []) == []


@pytest.mark.parametrize(("params", "field"), [
    ({"by": "colour"}, "by"),
    ({"granularity": "week"}, "granularity"),
])
async def test_bad_usage_groupings_are_refused(client: AsyncTestClient, params: dict[str, str],
                                               field: str) -> None:
    r = await client.get("/api/v1/usage", headers=ADMIN, params=params)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field


@pytest.mark.parametrize(("params", "field"), [
    # The document says date-time; a number of seconds is not one.
    ({"until": "0.5"}, "until"),
    ({"since": "yesterday"}, "since"),
])
@pytest.mark.parametrize("path", ["/api/v1/usage", "/api/v1/costs"])
async def test_bad_spans_are_refused(client: AsyncTestClient, params: dict[str, str],
                                     field: str, path: str) -> None:
    """An instant that is not an RFC 3339 date-time is a 400 naming the parameter."""
    r = await client.get(path, headers=ADMIN, params=params)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field


async def test_a_teams_request_logs_are_listed_newest_first(
        client: AsyncTestClient, store: Store) -> None:
    import time

    from llmgw.store.base import RequestLog

    r = await client.post("/api/v1/teams", headers=ADMIN, json={
        "name": "ml", "limits": {"log_requests": "bodies", "log_retention_days": 7}})
    assert r.status_code == 201, r.text
    now = time.time()
    await store.put_request_logs([RequestLog(
        id="l1", at=now, expires_at=now + 3600, team="ml", key="k",
        record=b'{"path": "/v1/chat/completions"}', request=b'{"messages": []}',
        response=b'{"choices": []}')])
    r = await client.get("/api/v1/teams/ml/logs", headers=ADMIN)
    assert r.status_code == 200, r.text
    [entry] = r.json()
    assert entry["entry"] == {"path": "/v1/chat/completions"}
    assert entry["request"] == '{"messages": []}'
    r = await client.get("/api/v1/teams/ml/logs", headers=ADMIN, params={"limit": 0})
    assert r.status_code == 400
    r = await client.post("/api/v1/keys", headers=ADMIN, json={
        "name": "k", "team": "ml", "limits": {"log_requests": "off"}})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "limits.log_requests"
    assert "set on the team, for all its keys" in r.json()["error"]["message"]


async def test_a_keys_id_is_shown_and_a_key_made_again_under_its_name_has_another(
        client: AsyncTestClient) -> None:
    """What owns a key's objects (and names it in usage records) is listed; revoking the
    key and creating one of the same name gives a new id, which owns nothing of the old."""
    from llmgw.tenancy import key_id

    assert (await client.post("/api/v1/teams", headers=ADMIN, json={"name": "ml"})
            ).status_code == 201
    first = (await client.post("/api/v1/keys", headers=ADMIN,
                               json={"name": "ka", "team": "ml"})).json()
    assert first["id"] == key_id(hash_key(first["key"]))
    [listed] = (await client.get("/api/v1/keys", headers=ADMIN)).json()
    assert listed["id"] == first["id"]
    assert (await client.delete("/api/v1/keys/ka", headers=ADMIN)).status_code == 204
    again = (await client.post("/api/v1/keys", headers=ADMIN,
                               json={"name": "ka", "team": "ml"})).json()
    assert again["id"] != first["id"]
