"""The Nomad mode end to end: the control API and `llmgw ctl` over NomadBackend and the fake.

Each test serves the real app on loopback (uvicorn, on the test's event loop,
where the backend's watchers run) with the real model service and SQLite
store, and talks to it over HTTP; only Nomad is the fake.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import uvicorn
from click.testing import CliRunner

from llmgw.api.app import create_app
from llmgw.catalog.model import GpuClass
from llmgw.catalog.units import Size
from llmgw.cli import main
from llmgw.config import AdminToken
from llmgw.control.context import AppContext
from llmgw.modelsvc import ModelService
from llmgw.scheduler.nomad.backend import NomadBackend
from llmgw.store import open_store
from llmgw.store.base import Store
from llmgw.testing.fake_nomad import FakeNomad

from .conftest import MIRROR, config, eventually, make_backend

TOKEN = "t0ken-ops"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
GIB = 1024**3


def cpu_body(name: str, context: int = 8192, cores: int = 8) -> dict[str, Any]:
    return {"name": name, "engine": "llama.cpp", "source": f"{MIRROR}/{name}/q8_0/{name}.gguf",
            "profiles": [{"name": "cpu", "gpus": 0, "cpu_cores": cores, "memory": "4GiB",
                          "context": context}]}


def gpu_body(name: str, gpus: int, fabric: str = "ib-a") -> dict[str, Any]:
    return {"name": name, "engine": "vllm", "source": f"{MIRROR}/{name}/v1/",
            "profiles": [{"name": "h100", "gpu_class": "h100-80g", "gpus": gpus,
                          "fabric": fabric, "cpu_cores": 16, "memory": "128GiB"}]}


@dataclass
class Instance:
    client: httpx.AsyncClient
    backend: NomadBackend
    models: ModelService
    url: str


@contextlib.asynccontextmanager
async def serving(ctx: AppContext) -> AsyncIterator[str]:
    server = uvicorn.Server(uvicorn.Config(create_app(ctx), host="127.0.0.1", port=0,
                                           lifespan="off", log_level="warning"))
    task = asyncio.create_task(server.serve())
    await eventually(lambda: server.started, what="uvicorn to start")
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


@contextlib.asynccontextmanager
async def instance(fake: FakeNomad, store: Store, holder: str,
                   gpu_classes: dict[str, GpuClass] | None = None,
                   **nomad: Any) -> AsyncIterator[Instance]:
    """One llmgw API process, wired as llmgw.server does (without the gateway)."""
    cfg = config(fake, server={"admin_tokens": [AdminToken(name="ops", token=TOKEN)]}, **nomad)
    if gpu_classes is not None:
        cfg = msgspec.structs.replace(cfg, gpu_classes=gpu_classes)
    backend = make_backend(fake, store, cfg, holder=holder)
    svc = ModelService(cfg.models, dict(cfg.gpu_classes), store,
                       placement_check=backend.check_placement)
    await svc.load()
    await backend.start()
    svc.subscribe(backend.apply)
    await backend.apply(svc.catalog)
    await backend.reconciled()
    ctx = AppContext(config=cfg, models=svc, backend=backend, store=store)
    try:
        async with serving(ctx) as url, httpx.AsyncClient(base_url=url, timeout=60) as client:
            yield Instance(client, backend, svc, url)
    finally:
        await backend.close()


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    s = open_store(f"sqlite:///{tmp_path}/llmgw.db")
    await s.open()
    yield s
    await s.close()


@pytest.fixture
async def api(fake: FakeNomad, store: Store) -> AsyncIterator[Instance]:
    async with instance(fake, store, "api-1") as inst:
        yield inst


async def test_an_added_model_runs_as_a_job_and_its_replicas_are_listed(fake, api):
    """POST a model → a job with its devices, cores and memory → allocations → replicas."""
    r = await api.client.post("/api/v1/models", json=gpu_body("qwen", 2), headers=ADMIN)
    assert r.status_code == 200, r.text
    await api.backend.reconciled()
    fake.settle()
    job = fake.job("llmgw-qwen")
    engine = next(t for t in job["TaskGroups"][0]["Tasks"] if t["Name"] == "engine")
    assert engine["Resources"]["Devices"][0]["Name"] == "nvidia/gpu"
    assert engine["Resources"]["Devices"][0]["Count"] == 2
    assert (engine["Resources"]["Cores"], engine["Resources"]["MemoryMB"]) == (16, 131072)
    [alloc] = fake.allocations("llmgw-qwen")
    fake.set_alloc_memory(alloc.id, 200 * GIB)
    r = await api.client.get("/api/v1/replicas?model=qwen", headers=ADMIN)
    assert r.status_code == 200
    [rep] = r.json()
    assert rep["id"] == alloc.id
    assert rep["node"] == alloc.node_name
    assert rep["stale"] is False
    assert rep["reserved_memory"] == 128 * GIB
    assert rep["measured_memory"] == 200 * GIB
    assert "exceeds" in rep["memory_warning"]


async def test_an_unplaceable_model_is_refused_with_the_reason_and_not_stored(fake, api):
    """Sixteen GPUs per replica: 400 naming the missing dimension; the catalog is unchanged."""
    r = await api.client.post("/api/v1/models", json=gpu_body("huge", 16), headers=ADMIN)
    assert r.status_code == 400
    assert "no node has 16 NVIDIA H100 80GB HBM3 on fabric ib-a" in r.json()["error"]["message"]
    names = [m["name"] for m in (await api.client.get("/api/v1/models", headers=ADMIN)).json()]
    assert "huge" not in names
    assert fake.job("llmgw-huge") is None


async def test_a_model_waiting_for_capacity_says_why(fake, api):
    """A profile that fits the fleet but not its free GPUs is accepted and shows the reason."""
    r = await api.client.post("/api/v1/models", json=gpu_body("hog", 8, "ib-b"), headers=ADMIN)
    assert r.status_code == 200, r.text
    await api.backend.reconciled()
    fake.settle()
    r = await api.client.post("/api/v1/models", json=gpu_body("late", 4, "ib-b"), headers=ADMIN)
    assert r.status_code == 200, r.text
    await api.backend.reconciled()
    fake.settle()
    shown = (await api.client.get("/api/v1/models/late", headers=ADMIN)).json()
    assert shown["status"]["waiting_for_capacity"] == (
        "no node with 4 free NVIDIA H100 80GB HBM3 on fabric ib-b; best: gpu-h100-03 has 0")


async def test_edit_shows_stale_replicas_rollout_replaces_them_remove_deregisters(fake, api):
    """Profile edit → stale; rollout → a new job version; remove → the job is stopped."""
    c = api.client
    assert (await c.post("/api/v1/models", json=cpu_body("embed"), headers=ADMIN)).status_code \
        == 200
    await api.backend.reconciled()
    fake.settle()
    version = fake.job("llmgw-embed")["Version"]
    edited = await c.post("/api/v1/models", json=cpu_body("embed", context=4096), headers=ADMIN)
    assert edited.status_code == 200
    await api.backend.reconciled()
    fake.settle()
    assert fake.job("llmgw-embed")["Version"] == version            # not churned
    [rep] = (await c.get("/api/v1/replicas?model=embed", headers=ADMIN)).json()
    assert rep["stale"] is True
    assert (await c.get("/api/v1/models/embed", headers=ADMIN)).json()["stale_replicas"] == 1

    r = await c.post("/api/v1/models/embed/rollout", headers=ADMIN)
    assert r.status_code == 200, r.text
    await api.backend.reconciled()
    fake.settle()
    assert fake.job("llmgw-embed")["Version"] == version + 1

    async def fresh() -> bool:
        reps = (await c.get("/api/v1/replicas?model=embed", headers=ADMIN)).json()
        return bool(reps) and not any(x["stale"] for x in reps)

    # The replaced allocation stays listed (stale) until its shutdown_delay (the
    # model's 30 s drain) has passed and it is killed: once it is told to stop, the
    # fake's clock is moved past the drain rather than waited out.
    def told_to_stop() -> bool:
        return any(a.desired_status == "stop" and not a.client_terminal
                   for a in fake.allocations("llmgw-embed", include_terminal=True))

    await eventually(told_to_stop, timeout=120, what="the stale allocation to be stopped")
    assert not await fresh()
    fake.advance(31)
    await eventually(fresh, timeout=120, what="replicas running the new profile")
    assert (await c.delete("/api/v1/models/embed", headers=ADMIN)).status_code == 204
    await api.backend.reconciled()
    fake.settle()
    assert fake.job("llmgw-embed")["Stop"] is True


async def test_nomad_down_the_api_says_so_and_changes_are_refused(fake, api):
    """Unreachable Nomad: /readyz is 503 naming it, an add is 503 and nothing is stored."""
    fake.stop()
    await api.backend.apply(api.models.catalog)
    await api.backend.reconciled()
    r = await api.client.get("/readyz")
    assert r.status_code == 503
    assert r.json()["error"]["message"] == "not ready: the scheduler cannot be reached"
    r = await api.client.get("/readyz", headers=ADMIN)
    assert r.status_code == 503
    assert f"cannot reach Nomad at {fake.address}" in r.json()["error"]["message"]
    r = await api.client.post("/api/v1/models", json=cpu_body("embed"), headers=ADMIN)
    assert r.status_code == 503
    assert "cannot reach Nomad" in r.json()["error"]["message"]
    assert (await api.client.get("/api/v1/fleet", headers=ADMIN)).status_code == 503
    fake.start()
    await eventually(lambda: api.backend.health().ok, what="recovery")
    names = [m["name"] for m in (await api.client.get("/api/v1/models", headers=ADMIN)).json()]
    assert "embed" not in names


async def test_two_api_instances_one_reconciler(fake, store):
    """A model added through the follower is registered once, by the lease holder."""
    async with instance(fake, store, "api-a") as leader, \
            instance(fake, store, "api-b") as follower:
        assert leader.backend.leader
        assert not follower.backend.leader
        fake.clear_requests()
        r = await follower.client.post("/api/v1/models", json=cpu_body("embed"), headers=ADMIN)
        assert r.status_code == 200, r.text
        await follower.backend.reconciled()
        assert fake.job("llmgw-embed") is None           # the follower did not register

        async def registered() -> bool:
            await leader.models.refresh()                 # what llmgw.server's follower loop does
            return fake.job("llmgw-embed") is not None

        await eventually(registered, what="the leader to register the model")
        fake.settle()
        calls = [(q.method, q.path) for q in fake.requests]
        assert calls.count(("POST", "/v1/jobs")) == 1


# ---- the CLI over the same loopback server ----------------------------------------------

async def _ctl(url: str, *args: str) -> Any:
    return await asyncio.to_thread(
        CliRunner().invoke, main, ["ctl", "--url", url, "--token", TOKEN, *args])


async def test_ctl_fleet_replicas_and_rollout(fake, api):
    """`llmgw ctl fleet|replicas|rollout` print what the API answers, with exit code 0."""
    await api.client.post("/api/v1/models", json=cpu_body("embed"), headers=ADMIN)
    await api.backend.reconciled()
    fake.settle()
    [alloc] = fake.allocations("llmgw-embed")
    url = api.url
    fleet = await _ctl(url, "fleet")
    assert fleet.exit_code == 0, fleet.output
    assert "h100-80g@ib-a" in fleet.output
    assert "gpu-h100-01" in fleet.output
    reps = await _ctl(url, "replicas", "embed")
    assert reps.exit_code == 0, reps.output
    assert alloc.id[:8] in reps.output
    assert alloc.node_name in reps.output
    as_json = await _ctl(url, "replicas", "--output", "json")
    assert json.loads(as_json.output)[0]["id"] == alloc.id
    rolled = await _ctl(url, "rollout", "embed")
    assert rolled.exit_code == 0, rolled.output
    assert "embed" in rolled.output
    missing = await _ctl(url, "rollout", "nope")
    assert missing.exit_code == 1
    assert "nope" in missing.output


async def test_ctl_replicas_says_why_a_model_runs_fewer_replicas(fake, api):
    """Below the table: the model that is short, and why (waiting for GPUs here)."""
    await api.client.post("/api/v1/models", json={**gpu_body("big", 8, "ib-b"),
                                                  "scaling": {"min": 2}}, headers=ADMIN)
    await api.backend.reconciled()
    fake.settle()
    await api.backend.apply(api.models.catalog)
    await api.backend.reconciled()
    reps = await _ctl(api.url, "replicas", "big")
    assert reps.exit_code == 0, reps.output
    assert "big: runs 1 of 2 replicas: waiting for capacity: no node with 8 free NVIDIA " \
           "H100 80GB HBM3 on fabric ib-b" in reps.output


async def test_ctl_fleet_names_a_gpu_class_whose_memory_no_card_reports(fake, store):
    """`ctl fleet` warns that the device memory constraint excludes the nodes, both numbers."""
    marketing = {"h100-80g": GpuClass(device="NVIDIA H100 80GB HBM3",
                                      memory=Size.parse("80GiB"))}
    async with instance(fake, store, "api-1", gpu_classes=marketing) as inst:
        out = await _ctl(inst.url, "fleet")
        assert out.exit_code == 0, out.output
        assert ("warning: gpu class h100-80g declares 81920 MiB per card but gpu-h100-01, "
                "gpu-h100-02, gpu-h100-03 report 81559 MiB: the device memory constraint "
                "(${device.attr.memory} >= 81920 MiB) excludes it") in out.output


async def test_a_capability_nomad_refuses_is_shown_on_the_model_and_readyz_stays_ready(store):
    """A token without the host_volume rule: the model's view, `ctl replicas` and the admin
    page say which capability Nomad refuses; /readyz is 200 (Nomad answers) and its admin
    body names the refusal."""
    import re

    policy = (Path(__file__).resolve().parents[2] / "nomad" / "llmgw-policy.hcl").read_text()
    policy = re.sub(r'host_volume "[^"]+" \{[^}]*\}', "", policy).replace('"llm"', '"default"')
    with FakeNomad(acl_token="root-secret") as fake:
        fake.apply_policy("llmgw", policy)
        token = fake.create_token(["llmgw"], name="llmgw")
        async with instance(fake, store, "api-1", token=token) as api:
            r = await api.client.post("/api/v1/models", json=cpu_body("embed"), headers=ADMIN)
            assert r.status_code == 200, r.text
            await api.backend.apply(api.models.catalog)
            await api.backend.reconciled()
            view = (await api.client.get("/api/v1/models/embed", headers=ADMIN)).json()
            assert "mount-readwrite on host volume 'llmgw-model-cache'" in \
                view["status"]["refused"]
            reps = await _ctl(api.url, "replicas", "embed")
            assert "embed: Nomad refuses llmgw's token: " in reps.output
            from types import SimpleNamespace

            from llmgw.admin.render import environment

            notes = environment().get_template("_status.html").render(m=SimpleNamespace(
                status=SimpleNamespace(**view["status"]), stale_replicas=0,
                memory_warnings=[], upstream=None))
            assert 'class="bad refused">Nomad refuses llmgw\'s token: ' in notes
            assert (await api.client.get("/readyz")).status_code == 200
            ready = (await api.client.get("/readyz", headers=ADMIN)).json()
            assert "mount-readwrite" in ready["scheduler"]["refused"]
