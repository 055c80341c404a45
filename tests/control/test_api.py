"""The control API: routes, auth, and one error mapping."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from litestar.testing import AsyncTestClient

from llmgw.api.app import create_app
from llmgw.catalog.decode import convert
from llmgw.catalog.model import Model
from llmgw.config import AdminToken, ServerConfig
from llmgw.control.context import AppContext
from llmgw.modelsvc import ModelService
from llmgw.scheduler.base import Replica
from llmgw.store import open_store
from llmgw.store.base import Store

from .conftest import GPU_CLASSES, RecordingBackend

ADMIN = {"Authorization": "Bearer t0ken-alice"}


def cpu(name: str, **kw: object) -> dict[str, object]:
    body: dict[str, object] = {
        "name": name, "source": f"/models/{name}.gguf", "engine": "llama.cpp",
        "profiles": [{"name": "cpu", "gpus": 0, "cpu_cores": 4, "memory": "8GiB"}],
    }
    body.update(kw)
    return body


DECLARED = convert(cpu("prod-chat", scaling={"min": 2}), Model)


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


async def test_admin_routes_need_an_admin_token(client: AsyncTestClient) -> None:
    """No token and a wrong token are both 401 in OpenAI's error shape."""
    r = await client.get("/api/v1/models")
    assert r.status_code == 401
    assert r.json()["error"]["type"] == "unauthorized"
    r = await client.get("/api/v1/models", headers={"Authorization": "Bearer nope"})
    assert r.status_code == 401


async def test_probes_need_no_token(client: AsyncTestClient) -> None:
    """/healthz and /readyz answer load balancers without credentials."""
    assert (await client.get("/healthz")).json() == {"ok": True}
    r = await client.get("/readyz")
    assert r.status_code == 200
    assert r.json() == {"ok": True, "reason": None}
    r = await client.get("/readyz", headers=ADMIN)
    assert r.json()["models"] == 1


async def test_a_model_shows_its_origin_who_added_it_and_its_scaling_in_force(
        client: AsyncTestClient) -> None:
    """Declared or runtime, added by whom and when, scaling after defaults."""
    r = await client.post("/api/v1/models", json=cpu("trial", scaling={"min": 0}),
                          headers=ADMIN)
    assert r.status_code == 200, r.text
    listed = {m["name"]: m for m in (await client.get("/api/v1/models", headers=ADMIN)).json()}
    assert listed["prod-chat"]["origin"] == "declared"
    assert listed["prod-chat"]["added_by"] is None
    trial = listed["trial"]
    assert trial["origin"] == "runtime"
    assert trial["added_by"] == "alice"
    assert trial["added_at"]
    assert trial["scaling"]["max"] == 1
    shown = (await client.get("/api/v1/models/trial", headers=ADMIN)).json()
    assert shown["definition"]["source"] == "/models/trial.gguf"
    assert shown["fingerprints"]["cpu"].startswith("sha256:")


async def test_a_definition_error_is_400_with_the_reason_and_the_field(
        client: AsyncTestClient, store: Store) -> None:
    """Wrong types, unknown fields and bad names name the field; nothing is written."""
    cases = [
        (cpu("trial", profiles=[{"name": "cpu", "gpus": "two"}]), "profiles[0].gpus"),
        (cpu("trial", colour="blue"), "colour"),
        (cpu("Trial.v2"), "name"),
        (cpu("trial", scaling={"min": 3, "max": 1}), "scaling.max"),
        (cpu("trial", fallbacks=["trial"]), "fallbacks[0]"),
        (cpu("trial", profiles=[{"name": "cpu", "gpus": 0, "cpu_cores": 2}]),
         "profiles[0].memory"),
    ]
    for body, field in cases:
        r = await client.post("/api/v1/models", json=body, headers=ADMIN)
        assert r.status_code == 400, (body, r.text)
        assert r.json()["error"]["param"] == field, r.text
    assert await store.models() == []


async def test_numbers_written_as_strings_are_refused_as_in_yaml(
        client: AsyncTestClient, store: Store) -> None:
    """The API decodes as strictly as server.yaml; "4" is not a core count."""
    body = cpu("trial", profiles=[{"name": "cpu", "gpus": 0, "cpu_cores": "4", "memory": "8GiB"}])
    r = await client.post("/api/v1/models", json=body, headers=ADMIN)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "profiles[0].cpu_cores"
    await client.post("/api/v1/models", json=cpu("trial"), headers=ADMIN)
    r = await client.put("/api/v1/models/trial/scale", json={"min": "2"}, headers=ADMIN)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "min"


async def test_malformed_json_is_400(client: AsyncTestClient) -> None:
    """A body that is not JSON says so."""
    r = await client.post("/api/v1/models", content=b"{name: ", headers={
        **ADMIN, "Content-Type": "application/json"})
    assert r.status_code == 400
    assert "JSON" in r.json()["error"]["message"]


async def test_a_ten_megabyte_body_is_refused(client: AsyncTestClient, store: Store) -> None:
    """Request bodies are bounded; the refusal says why."""
    body = b'{"name": "x", "description": "' + b"a" * (10 * 1024 * 1024) + b'"}'
    r = await client.post("/api/v1/models", content=body, headers={
        **ADMIN, "Content-Type": "application/json"})
    assert r.status_code == 413
    assert "too large" in r.json()["error"]["message"]
    assert await store.models() == []


async def test_adding_over_a_declared_model_is_400_naming_the_name(
        client: AsyncTestClient) -> None:
    """Every failure adding a model is the definition being wrong: its name, here."""
    r = await client.post("/api/v1/models", json=cpu("prod-chat"), headers=ADMIN)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "name"
    assert r.json()["error"]["type"] == "invalid_definition"
    assert "edit it there" in r.json()["error"]["message"]


async def test_refusals_of_declared_models_are_409(client: AsyncTestClient) -> None:
    """Removing or scaling a declared model is a conflict with the config file."""
    r = await client.delete("/api/v1/models/prod-chat", headers=ADMIN)
    assert r.status_code == 409
    r = await client.put("/api/v1/models/prod-chat/scale", json={"min": 3}, headers=ADMIN)
    assert r.status_code == 409
    assert "reverts on the next restart" in r.json()["error"]["message"]


async def test_unknown_models_are_404(client: AsyncTestClient) -> None:
    """Show, remove and scale of a name that does not exist."""
    for method, path, body in [("GET", "/api/v1/models/ghost", None),
                               ("DELETE", "/api/v1/models/ghost", None),
                               ("PUT", "/api/v1/models/ghost/scale", {"min": 1})]:
        r = await client.request(method, path, json=body, headers=ADMIN)
        assert r.status_code == 404, (method, path, r.text)


async def test_scale_and_resources_answer_what_is_in_force(client: AsyncTestClient) -> None:
    """C9/C10 through HTTP: max filled in; negative counts refused with the field."""
    await client.post("/api/v1/models", json=cpu("trial"), headers=ADMIN)
    r = await client.put("/api/v1/models/trial/scale", json={"min": 2}, headers=ADMIN)
    assert r.json() == {"min": 2, "max": 2, "target": 16, "scale_down_delay": "5m",
                        "idle_timeout": "15m", "wait": "10m"}
    r = await client.put("/api/v1/models/trial/scale", json={"min": -1}, headers=ADMIN)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "min"
    r = await client.put("/api/v1/models/trial/resources",
                         json={"cpu_cores": 6, "memory": "12GiB"}, headers=ADMIN)
    assert r.json() == {"model": "trial", "profile": "cpu", "cpu_cores": 6, "memory": "12GiB"}


async def test_changing_min_keeps_the_max_in_force(client: AsyncTestClient) -> None:
    """A model scaling 1..4 asked for min 2 scales 2..4 (it used to become 2..2, its
    autoscaling ended); a min above the max in force is refused with both numbers and
    changes nothing; a max given with it is taken."""
    body = cpu("trial")
    body["scaling"] = {"min": 1, "max": 4}
    await client.post("/api/v1/models", json=body, headers=ADMIN)
    r = await client.put("/api/v1/models/trial/scale", json={"min": 2}, headers=ADMIN)
    assert (r.json()["min"], r.json()["max"]) == (2, 4)
    r = await client.put("/api/v1/models/trial/scale", json={"min": 6}, headers=ADMIN)
    assert r.status_code == 400
    assert r.json()["error"]["message"] == (
        "model 'trial': min 6 is above its max 4 in force; give max 6 or more with it "
        "(changing min keeps the max)")
    assert r.json()["error"]["param"] == "min"
    r = await client.get("/api/v1/models/trial", headers=ADMIN)
    assert (r.json()["scaling"]["min"], r.json()["scaling"]["max"]) == (2, 4)
    r = await client.put("/api/v1/models/trial/scale", json={"min": 6, "max": 8},
                         headers=ADMIN)
    assert (r.json()["min"], r.json()["max"]) == (6, 8)
    r = await client.put("/api/v1/models/trial/scale", json={"min": 6, "max": 5},
                         headers=ADMIN)
    assert r.status_code == 400
    assert "max 5 is below min 6" in r.json()["error"]["message"]


async def test_an_unplaceable_profile_is_400_with_the_reason(client: AsyncTestClient) -> None:
    """N6 through HTTP: the placement reason reaches the caller."""
    body = cpu("huge", engine="vllm", profiles=[
        {"name": "tp16", "gpu_class": "h100-80g", "gpus": 16, "cpu_cores": 8, "memory": "1TiB"}])
    r = await client.post("/api/v1/models", json=body, headers=ADMIN)
    assert r.status_code == 400
    assert "no node has 16 GPUs" in r.json()["error"]["message"]


async def test_stale_replicas_and_memory_warnings_are_shown(
        client: AsyncTestClient, backend: RecordingBackend) -> None:
    """A replica started with another fingerprint is stale; an empty one is unknown, not stale."""
    await client.post("/api/v1/models", json=cpu("trial"), headers=ADMIN)
    gib = 1024**3
    backend.replica_list = [
        Replica(id="a1", model="trial", profile="cpu", fingerprint="sha256:old", node="n1",
                state="running", healthy=True, reserved_memory=8 * gib,
                measured_memory=9 * gib),
        Replica(id="a2", model="trial", profile="cpu", fingerprint="", node="n1",
                state="running", healthy=True),
    ]
    m = (await client.get("/api/v1/models/trial", headers=ADMIN)).json()
    assert m["stale_replicas"] == 1
    assert "exceeds" in m["memory_warnings"][0]
    reps = {r["id"]: r for r in (await client.get("/api/v1/replicas?model=trial",
                                                  headers=ADMIN)).json()}
    assert reps["a1"]["stale"] is True
    assert reps["a2"]["stale"] is False


async def test_reads_keep_serving_when_the_store_goes_away(
        postgres_url: str, backend: RecordingBackend) -> None:
    """With Postgres cut off mid-run, reads answer from the catalog in force, writes are 503."""
    from urllib.parse import urlsplit

    from .conftest import TcpProxy, _postgres_schema_url

    for url in _postgres_schema_url(postgres_url):
        parts = urlsplit(url)
        proxy = TcpProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
        proxied = url.replace(parts.netloc, f"{parts.username}@127.0.0.1:{proxy.port}")
        store = open_store(proxied)
        await store.open()
        config = ServerConfig(admin_tokens=[AdminToken(name="alice", token="t0ken-alice")],
                              models=[DECLARED])
        svc = ModelService(config.models, {}, store)
        await svc.load()
        ctx = AppContext(config=config, models=svc, backend=backend, store=store)
        async with AsyncTestClient(create_app(ctx)) as client:
            r = await client.post("/api/v1/models", json=cpu("trial"), headers=ADMIN)
            assert r.status_code == 200, r.text
            proxy.cut()
            r = await client.get("/api/v1/models", headers=ADMIN)
            assert r.status_code == 200
            assert {m["name"] for m in r.json()} == {"prod-chat", "trial"}
            r = await client.post("/api/v1/models", json=cpu("other"), headers=ADMIN)
            assert r.status_code == 503, r.text
            assert r.json()["error"]["type"] == "store_unavailable"
            assert "other" not in svc.catalog
        await store.close()


def test_the_checked_in_openapi_document_is_current() -> None:
    """api/openapi.json is regenerated with `python -m llmgw.api.openapi`."""
    from llmgw.api.openapi import render

    checked_in = Path(__file__).resolve().parents[2] / "api" / "openapi.json"
    assert checked_in.read_text() == render(), (
        "api/openapi.json is stale: run `python -m llmgw.api.openapi > api/openapi.json`")




async def test_a_fleet_the_scheduler_cannot_report_is_503(
        client: AsyncTestClient, backend: RecordingBackend,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A scheduler client's own exception is the scheduler's failure, not llmgw's 500."""
    async def broken() -> None:
        raise ConnectionError("connection reset by peer")

    monkeypatch.setattr(backend, "fleet", broken)
    r = await client.get("/api/v1/fleet", headers=ADMIN)
    assert r.status_code == 503
    assert "ConnectionError" in r.json()["error"]["message"]


async def test_a_rollout_the_scheduler_never_answers_is_503(
        client: AsyncTestClient, backend: RecordingBackend,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A hung scheduler makes a rollout fail with what to check, not hang the caller."""
    import asyncio

    from llmgw.control import actions

    async def hung(model: str) -> str | None:
        await asyncio.Event().wait()
        return None

    monkeypatch.setattr(actions, "ROLLOUT_TIMEOUT", 0.2)
    monkeypatch.setattr(backend, "rollout", hung)
    await client.post("/api/v1/models", json=cpu("trial"), headers=ADMIN)
    r = await client.post("/api/v1/models/trial/rollout", headers=ADMIN)
    assert r.status_code == 503
    assert "llmgw ctl replicas trial" in r.json()["error"]["message"]


async def test_a_prefetch_is_handed_to_the_scheduler_and_its_progress_read_back(
        client: AsyncTestClient, backend: RecordingBackend) -> None:
    """POST /prefetch passes the count (or the nodes) to the scheduler; GET shows the
    latest prefetch node by node."""
    r = await client.post("/api/v1/models/prod-chat/prefetch", json={"count": 2},
                          headers=ADMIN)
    assert r.status_code == 200, r.text
    assert backend.prefetches == [("prod-chat", None, 2)]
    r = await client.post("/api/v1/models/prod-chat/prefetch", json={"nodes": ["gpu-7"]},
                          headers=ADMIN)
    assert backend.prefetches[-1] == ("prod-chat", ["gpu-7"], None)
    got = (await client.get("/api/v1/models/prod-chat/prefetch", headers=ADMIN)).json()
    assert [(n["node"], n["state"], n["percent"]) for n in got["nodes"]] == [
        ("gpu-7", "fetching", 40.0)]
    assert got["warm"] == ["node-9"]


async def test_a_prefetch_naming_nodes_and_a_count_is_refused(
        client: AsyncTestClient, backend: RecordingBackend) -> None:
    """Nodes and a count together, or a count below 1, are 400s naming the field."""
    r = await client.post("/api/v1/models/prod-chat/prefetch",
                          json={"nodes": ["a"], "count": 2}, headers=ADMIN)
    assert r.status_code == 400
    assert "nodes or count, not both" in r.text
    r = await client.post("/api/v1/models/prod-chat/prefetch", json={"count": 0},
                          headers=ADMIN)
    assert r.status_code == 400
    assert "count" in r.text
    assert backend.prefetches == []


async def test_an_empty_body_is_a_400_a_person_understands(client: AsyncTestClient) -> None:
    r = await client.put("/api/v1/models/prod-chat/scale", headers=ADMIN)
    assert r.status_code == 400
    assert r.json()["error"]["message"].startswith(
        "request body: empty; this endpoint takes a JSON object")


async def test_a_whole_number_written_as_a_float_is_that_integer(
        client: AsyncTestClient) -> None:
    """JSON Schema's integer admits 2.0, so the API reads it as 2; "2" stays refused."""
    r = await client.post("/api/v1/models", json=cpu("trial"), headers=ADMIN)
    assert r.status_code == 200, r.text
    r = await client.put("/api/v1/models/trial/scale", json={"min": 2.0, "max": 3.0},
                         headers=ADMIN)
    assert r.status_code == 200, r.text
    assert (r.json()["min"], r.json()["max"]) == (2, 3)
    r = await client.put("/api/v1/models/trial/scale", json={"min": "2"}, headers=ADMIN)
    assert r.status_code == 400
    r = await client.put("/api/v1/models/trial/scale", json={"min": 2.5}, headers=ADMIN)
    assert r.status_code == 400


async def test_options_names_every_method_of_a_path(client: AsyncTestClient) -> None:
    r = await client.options("/api/v1/models", headers=ADMIN)
    assert r.headers["allow"] == "GET, OPTIONS, POST"
