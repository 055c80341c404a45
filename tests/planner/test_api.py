"""POST /api/v1/plan: the same candidates as the CLI, from the live fleet or given pools."""

from __future__ import annotations

import msgspec
from litestar.testing import TestClient

from llmgw.planner.candidates import pools_from_fleet
from llmgw.planner.plan import PlanRequest, plan_model
from tests.planner.apps import FleetBackend, plan_app, two_fabric_fleet
from tests.planner.fixtures import load_config

LLAMA_70B = load_config("llama-3.3-70b-instruct")


def test_plans_against_the_live_fleet() -> None:
    """Without pools the fleet's pools are used, one per fabric, as plan_model answers."""
    backend = FleetBackend(two_fabric_fleet())
    body = {"model": "meta-llama/Llama-3.3-70B-Instruct", "config": LLAMA_70B,
            "parameters": {"total": 70_553_706_496, "source": "hub"}}
    with TestClient(app=plan_app(backend)) as client:
        r = client.post("/api/v1/plan", json=body)
    assert r.status_code == 200, r.text
    assert backend.calls == 1
    data = r.json()
    assert {c["pool"] for c in data["candidates"]} == {"h100-80g/ib-a", "h100-80g/ib-b"}
    pools, _ = pools_from_fleet(two_fabric_fleet())
    expected = plan_model(msgspec.convert(body, PlanRequest), pools)
    assert data["candidates"] == msgspec.to_builtins(expected.candidates)
    assert len(data["candidates"]) == len(expected.candidates)
    first = data["candidates"][0]
    for key in ("quantization", "gpus", "pool", "weights_bytes_per_gpu", "weights_bytes_total",
                "host_bytes", "kv_bytes_per_token", "max_context", "fits", "reason"):
        assert key in first
    assert first["fits"] is True


def test_given_pools_skip_the_fleet() -> None:
    """Pools in the body are planned on and the backend is not asked."""
    backend = FleetBackend(two_fabric_fleet())
    body = {"model": "m", "config": LLAMA_70B,
            "pools": [{"name": "l40s", "gpus_per_node": 4, "gpu_memory": 48_305_799_168}],
            "options": {"quantizations": ["bf16"], "engine": "vllm"}}
    with TestClient(app=plan_app(backend)) as client:
        r = client.post("/api/v1/plan", json=body)
    assert r.status_code == 200, r.text
    assert backend.calls == 0
    assert {(c["pool"], c["gpus"]) for c in r.json()["candidates"]} == {("l40s", 4), ("l40s", 2),
                                                                         ("l40s", 1)}


def test_unknown_architecture_is_400_with_the_reason() -> None:
    """A config the planner cannot reason about is a 400 that says so."""
    body = {"model": "m", "config": {**LLAMA_70B, "model_type": "mamba"}, "pools": []}
    with TestClient(app=plan_app(FleetBackend(two_fabric_fleet()))) as client:
        r = client.post("/api/v1/plan", json=body)
    assert r.status_code == 400
    assert "cannot reason about" in r.json()["error"]["message"]


def test_malformed_body_names_the_field() -> None:
    """An unknown option is a 400 naming the field."""
    body = {"model": "m", "config": LLAMA_70B, "options": {"kv_dtype": "fp4"}}
    with TestClient(app=plan_app(FleetBackend(two_fabric_fleet()))) as client:
        r = client.post("/api/v1/plan", json=body)
    assert r.status_code == 400
    assert "kv_dtype" in r.json()["error"]["message"]
