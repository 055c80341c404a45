"""Deployments over time: progress deadlines, and what Nomad places after a failure.

Each test follows nomad/deploymentwatcher/deployment_watcher.go and
scheduler/reconciler/reconcile_cluster.go as the fake reproduces them.
"""

from __future__ import annotations

import httpx
import pytest

from llmgw.testing import FakeNomad, node_8x_h100_80g
from tests.testing.jobspec import S, cpu_job, gpu_job, register

HOUR = 3600


def _two_h100_job() -> dict[str, object]:
    """Two replicas of eight GPUs each on fabric ib-b, which has one 8-GPU node."""
    return gpu_job(gpus=8, count=2, fabric="ib-b")


def test_a_deployment_short_of_healthy_allocs_fails_at_its_progress_deadline(
        http: httpx.Client, nomad: FakeNomad) -> None:
    """The deadline runs from the first placement; past it, too few healthy means failed."""
    register(http, _two_h100_job())
    nomad.settle()
    [placed] = nomad.allocations("llmgw-qwen")
    nomad.set_check(placed.id, "success")
    running = http.get("/v1/job/llmgw-qwen/deployment").json()
    assert running["Status"] == "running"
    assert running["TaskGroups"]["serve"]["RequireProgressBy"] != "0001-01-01T00:00:00Z"
    nomad.advance(1700)                      # inside the 1800 s deadline
    assert http.get("/v1/job/llmgw-qwen/deployment").json()["Status"] == "running"
    nomad.advance(200)
    failed = http.get("/v1/job/llmgw-qwen/deployment").json()
    assert (failed["Status"], failed["StatusDescription"]) == (
        "failed", "Failed due to progress deadline")
    assert failed["TaskGroups"]["serve"]["HealthyAllocs"] == 1
    assert failed["TaskGroups"]["serve"]["DesiredTotal"] == 2


def test_a_healthy_allocation_moves_the_progress_deadline(
        http: httpx.Client, nomad: FakeNomad) -> None:
    """Progress resets the clock: the deadline is the last health time plus the deadline."""
    register(http, cpu_job(count=2))
    nomad.settle()
    first, second = nomad.allocations("llmgw-tiny")
    nomad.advance(1500)
    nomad.set_check(first.id, "success")     # progress at 1500 s: deadline now 3300 s
    nomad.advance(1000)
    assert http.get("/v1/job/llmgw-tiny/deployment").json()["Status"] == "running"
    nomad.set_check(second.id, "success")
    assert http.get("/v1/job/llmgw-tiny/deployment").json()["Status"] == "successful"
    nomad.advance(2 * HOUR)
    assert http.get("/v1/job/llmgw-tiny/deployment").json()["Status"] == "successful"


def test_after_a_failed_deployment_missing_allocations_are_never_placed(
        http: httpx.Client, nomad: FakeNomad) -> None:
    """deploymentPlaceReady is false: capacity arriving places nothing, and nothing queues."""
    register(http, _two_h100_job())
    nomad.settle()
    [placed] = nomad.allocations("llmgw-qwen")
    nomad.set_check(placed.id, "success")
    nomad.advance(1801)
    nomad.add_node(node_8x_h100_80g("gpu-h100-04", "ib-b"))
    nomad.settle()
    assert [a.id for a in nomad.allocations("llmgw-qwen")] == [placed.id]
    summary = http.get("/v1/job/llmgw-qwen/summary").json()["Summary"]["serve"]
    assert (summary["Running"], summary["Queued"]) == (1, 0)
    blocked = [e for e in nomad.evaluations("llmgw-qwen") if e.status == "blocked"]
    assert blocked == []


def test_scaling_to_the_same_count_after_a_failure_places_the_rest_in_place(
        http: httpx.Client, nomad: FakeNomad) -> None:
    """/scale bumps the version (Job.Scale registers); the running alloc is updated in place."""
    register(http, _two_h100_job())
    nomad.settle()
    [placed] = nomad.allocations("llmgw-qwen")
    nomad.set_check(placed.id, "success")
    nomad.advance(1801)
    nomad.add_node(node_8x_h100_80g("gpu-h100-04", "ib-b"))
    nomad.settle()
    version = http.get("/v1/job/llmgw-qwen").json()["Version"]
    r = http.post("/v1/job/llmgw-qwen/scale",
                  json={"Count": 2, "Target": {"Group": "serve"}, "Message": "recover"})
    assert r.status_code == 200
    nomad.settle()
    assert http.get("/v1/job/llmgw-qwen").json()["Version"] == version + 1
    allocs = nomad.allocations("llmgw-qwen")
    assert len(allocs) == 2
    assert placed.id in {a.id for a in allocs}                # not replaced
    assert {a.job_version for a in allocs} == {version + 1}   # the old one updated in place
    deployment = http.get("/v1/job/llmgw-qwen/deployment").json()
    assert (deployment["Status"], deployment["JobVersion"]) == ("running", version + 1)
    assert deployment["TaskGroups"]["serve"]["PlacedAllocs"] == 2
    assert deployment["TaskGroups"]["serve"]["HealthyAllocs"] == 1   # judged again


def test_max_parallel_zero_means_no_deployment_and_all_at_once_updates(
        http: httpx.Client, nomad: FakeNomad) -> None:
    """An empty update strategy: no deployment, /scale always allowed, all replaced at once."""
    job = cpu_job(count=2)
    job["Update"]["MaxParallel"] = 0
    register(http, job)
    nomad.settle()
    assert http.get("/v1/job/llmgw-tiny/deployment").json() is None
    first = {a.id for a in nomad.allocations("llmgw-tiny")}
    edited = cpu_job(count=2, cores=4)
    edited["Update"]["MaxParallel"] = 0
    register(http, edited)
    nomad.settle()
    after = nomad.allocations("llmgw-tiny")
    assert len(after) == 2
    assert not first & {a.id for a in after}                   # both replaced in one plan
    r = http.post("/v1/job/llmgw-tiny/scale", json={"Count": 3, "Target": {"Group": "serve"}})
    assert r.status_code == 200


def test_the_clock_moves_only_forward(nomad: FakeNomad) -> None:
    """advance() refuses a negative step and moves now() by what it was given."""
    before = nomad.now()
    nomad.advance(10)
    assert nomad.now() - before >= 10 * S
    with pytest.raises(ValueError, match="forward"):
        nomad.advance(-1)
