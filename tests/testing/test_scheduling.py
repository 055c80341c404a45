"""Placement by devices, cores and memory, and the metrics that explain a miss (§2, §3.3, §5.2).

Sections marked § are those of docs/nomad-api.md.
"""

from __future__ import annotations

from typing import Any

import httpx

from llmgw.testing import FakeNomad, node_4x_l40s_48g, node_cpu_64c
from tests.testing.jobspec import cpu_job, gpu_job, register, task


def _metric(http: httpx.Client, job_id: str) -> dict[str, Any]:
    evals = http.get(f"/v1/job/{job_id}/evaluations").json()
    failed = [e for e in evals if e.get("FailedTGAllocs")]
    return failed[-1]["FailedTGAllocs"]["serve"]  # type: ignore[no-any-return]


def test_gpu_job_lands_on_matching_node_with_exact_resources(
        http: httpx.Client, nomad: FakeNomad) -> None:
    """Two H100s on fabric ib-a: GPU UUIDs, reserved cores, CpuShares and a host port."""
    register(http, gpu_job())
    nomad.settle()
    [stub] = http.get("/v1/job/llmgw-qwen/allocations").json()
    alloc = http.get(f"/v1/allocation/{stub['ID']}").json()
    node = nomad.node(alloc["NodeName"])
    assert node.meta["llmgw_fabric"] == "ib-a"
    engine = alloc["AllocatedResources"]["Tasks"]["engine"]
    [devices] = engine["Devices"]
    assert devices["Name"] == "NVIDIA H100 80GB HBM3"
    assert len(devices["DeviceIDs"]) == 2
    assert set(devices["DeviceIDs"]) <= {i.id for i in node.devices[0].instances}
    cores = engine["Cpu"]["ReservedCores"]
    assert len(cores) == 16
    assert not set(cores) & set(node.reserved_cores)
    assert engine["Cpu"]["CpuShares"] == 16 * node.core_mhz
    assert engine["Memory"]["MemoryMB"] == 196_608
    [port] = alloc["AllocatedResources"]["Shared"]["Ports"]
    assert port["Label"] == "http"
    assert port["To"] == 8000
    assert node.min_dynamic_port <= port["Value"] <= node.max_dynamic_port


def test_device_name_with_model_picks_the_l40s(http: httpx.Client, nomad: FakeNomad) -> None:
    """"nvidia/gpu/NVIDIA L40S" matches vendor, type and model exactly."""
    job = gpu_job(fabric=None, gpus=1)
    task(job)["Resources"]["Devices"] = [{"Name": "nvidia/gpu/NVIDIA L40S", "Count": 1}]
    register(http, job)
    nomad.settle()
    [alloc] = nomad.allocations("llmgw-qwen")
    assert alloc.node_name == "gpu-l40s-01"


def test_device_memory_constraint_uses_units(http: httpx.Client, nomad: FakeNomad) -> None:
    """>= 40 GiB fits the L40S (46068 MiB); >= 80 GiB matches no "80GB" H100 (§2)."""
    job = gpu_job("fits", fabric=None, gpus=4)
    task(job)["Resources"]["Devices"][0]["Constraints"] = [
        {"LTarget": "${device.attr.memory}", "Operand": ">=", "RTarget": "40 GiB"}]
    register(http, job)
    too_big = gpu_job("never", fabric=None, gpus=1)
    task(too_big)["Resources"]["Devices"][0]["Constraints"] = [
        {"LTarget": "${device.attr.memory}", "Operand": ">=", "RTarget": "80 GiB"}]
    register(http, too_big)
    nomad.settle()
    assert len(nomad.allocations("fits")) == 1
    assert nomad.allocations("never") == []
    assert _metric(http, "never")["ConstraintFiltered"] == {"missing devices": 5}


def test_never_fits_is_constraint_filtered(http: httpx.Client, nomad: FakeNomad) -> None:
    """16 GPUs fit no node: ConstraintFiltered "missing devices", nothing exhausted, queued."""
    r = register(http, gpu_job(gpus=16))
    nomad.settle()
    ev = http.get(f"/v1/evaluation/{r.json()['EvalID']}").json()
    metric = ev["FailedTGAllocs"]["serve"]
    assert metric["ConstraintFiltered"] == {"missing devices": 2,
                                            "${meta.llmgw_fabric} = ib-a": 3}
    assert metric["DimensionExhausted"] is None
    assert metric["NodesExhausted"] == 0
    assert (metric["NodesEvaluated"], metric["NodesAvailable"]) == (5, {"dc1": 5})
    assert ev["QueuedAllocations"] == {"serve": 1}
    blocked = http.get(f"/v1/evaluation/{ev['BlockedEval']}").json()
    assert (blocked["Status"], blocked["TriggeredBy"], blocked["StatusDescription"]) == (
        "blocked", "queued-allocs", "created to place remaining allocations")
    summary = http.get("/v1/job/llmgw-qwen/summary").json()["Summary"]["serve"]
    assert summary["Queued"] == 1


def test_busy_gpus_are_dimension_exhausted(http: httpx.Client, nomad: FakeNomad) -> None:
    """When every matching GPU is taken the node is exhausted, not filtered."""
    register(http, gpu_job("big", gpus=8, count=2, cores=8))
    nomad.settle()
    register(http, gpu_job("late", gpus=1, cores=4))
    nomad.settle()
    assert len(nomad.allocations("big")) == 2
    assert nomad.allocations("late") == []
    metric = _metric(http, "late")
    assert metric["DimensionExhausted"] == {"devices: no devices match request": 2}
    assert metric["NodesExhausted"] == 2
    assert metric["ConstraintFiltered"] == {"${meta.llmgw_fabric} = ib-a": 3}


def test_cores_and_memory_exhaustion(http: httpx.Client) -> None:
    """Cores and memory run out on a single CPU node with their own dimension keys."""
    with FakeNomad([node_cpu_64c("cpu-01")]) as nomad, \
            httpx.Client(base_url=nomad.address) as c:
        register(c, cpu_job("a", cores=60, memory_mb=1024))
        register(c, cpu_job("b", cores=8, memory_mb=1024))
        register(c, cpu_job("c", cores=1, memory_mb=380_000))
        nomad.settle()
        assert _metric(c, "b")["DimensionExhausted"] == {"cores": 1}
        assert _metric(c, "c")["DimensionExhausted"] == {"memory": 1}


def test_identical_nodes_share_a_computed_class(http: httpx.Client) -> None:
    """A node identical to a rejected one is filtered as "computed class ineligible"."""
    a, b = node_cpu_64c("cpu-a"), node_cpu_64c("cpu-b")
    b.attributes = {k: (a.attributes[k] if not k.startswith("unique.") else v)
                    for k, v in b.attributes.items()}
    with FakeNomad([a, b]) as nomad, httpx.Client(base_url=nomad.address) as c:
        register(c, gpu_job(fabric=None))
        nomad.settle()
        assert _metric(c, "llmgw-qwen")["ConstraintFiltered"] == {
            "missing devices": 1, "computed class ineligible": 1}


def test_missing_host_volume_filters_the_node(http: httpx.Client) -> None:
    """A node without the cache host volume is "missing compatible host volumes"."""
    with FakeNomad([node_4x_l40s_48g("gpu-l40s-01", cache_volume=None)]) as nomad, \
            httpx.Client(base_url=nomad.address) as c:
        job = gpu_job(fabric=None, gpus=1, model="NVIDIA L40S")
        register(c, job)
        nomad.settle()
        assert _metric(c, "llmgw-qwen")["ConstraintFiltered"] == {
            "missing compatible host volumes": 1}


def test_ineligible_draining_and_down_nodes_get_no_placements(
        http: httpx.Client, nomad: FakeNomad) -> None:
    """Only ready, eligible, non-draining nodes are candidates (§3.3 item 6)."""
    nomad.set_node("gpu-h100-01", eligible=False)
    nomad.set_node("gpu-h100-02", drain=True)
    register(http, gpu_job(fabric=None))
    nomad.settle()
    [alloc] = nomad.allocations("llmgw-qwen")
    assert alloc.node_name == "gpu-h100-03"
    nomad.set_node("gpu-h100-03", status="down")
    register(http, gpu_job("second", fabric=None))
    nomad.settle()
    assert nomad.allocations("second") == []
    assert _metric(http, "second")["NodesAvailable"] == {"dc1": 2}


def test_blocked_eval_places_when_capacity_frees(http: httpx.Client, nomad: FakeNomad) -> None:
    """Stopping a job frees GPUs and the waiting job's blocked evaluation places it."""
    register(http, gpu_job("big", gpus=8, count=2, cores=8))
    register(http, gpu_job("late", gpus=4, cores=4))
    nomad.settle()
    assert nomad.allocations("late") == []
    assert http.delete("/v1/job/big").status_code == 200
    nomad.settle()
    [late] = nomad.allocations("late")
    assert late.client_status == "running"
    statuses = [e["Status"] for e in http.get("/v1/job/late/evaluations").json()]
    assert statuses == ["complete", "complete"]


def test_scale_down_stops_highest_indexes(http: httpx.Client, nomad: FakeNomad) -> None:
    """Lowering Count stops job.group[2] and [1], keeping [0]."""
    register(http, cpu_job(count=3))
    nomad.settle()
    nomad.set_job_checks("llmgw-tiny", "success")
    nomad.settle()
    r = http.post("/v1/job/llmgw-tiny/scale", json={"Count": 1, "Target": {"Group": "serve"}})
    assert r.status_code == 200, r.text
    nomad.settle()
    assert [a.name for a in nomad.allocations("llmgw-tiny")] == ["llmgw-tiny.serve[0]"]
    stopped = [a for a in nomad.allocations("llmgw-tiny", include_terminal=True) if a.terminal]
    assert sorted(a.index for a in stopped) == [1, 2]
    assert all(a.client_status == "complete" for a in stopped)


def test_deregister_stops_allocations_and_removes_services(
        http: httpx.Client, nomad: FakeNomad) -> None:
    """DELETE marks the job stopped, allocations complete, registrations gone; purge deletes."""
    register(http, gpu_job())
    nomad.settle()
    assert len(http.get("/v1/service/llmgw-qwen").json()) == 1
    r = http.delete("/v1/job/llmgw-qwen")
    assert r.status_code == 200
    assert r.json()["EvalID"]
    nomad.settle()
    assert http.get("/v1/service/llmgw-qwen").json() == []
    job = http.get("/v1/job/llmgw-qwen").json()
    assert (job["Stop"], job["Status"]) == (True, "dead")
    [alloc] = http.get("/v1/job/llmgw-qwen/allocations").json()
    assert (alloc["DesiredStatus"], alloc["ClientStatus"]) == ("stop", "complete")
    assert http.delete("/v1/job/llmgw-qwen?purge=true").status_code == 200
    assert http.get("/v1/job/llmgw-qwen").status_code == 404


def test_plan_reports_placements_and_failures_without_registering(
        http: httpx.Client, nomad: FakeNomad) -> None:
    """/plan answers DesiredTGUpdates and FailedTGAllocs and changes nothing (§1.1)."""
    good = http.post("/v1/job/llmgw-qwen/plan", json={"Job": gpu_job(count=2), "Diff": True})
    assert good.status_code == 200
    body = good.json()
    assert body["Annotations"]["DesiredTGUpdates"]["serve"]["Place"] == 2
    assert body["FailedTGAllocs"] is None
    assert body["Diff"]["Type"] == "Added"
    bad = http.post("/v1/job/llmgw-qwen/plan", json={"Job": gpu_job(gpus=16)}).json()
    assert bad["FailedTGAllocs"]["serve"]["ConstraintFiltered"]["missing devices"] == 2
    assert bad["CreatedEvals"][0]["Status"] == "blocked"
    assert http.get("/v1/job/llmgw-qwen").status_code == 404
    assert nomad.evaluations("llmgw-qwen") == []


def _two_cpu_nodes_one_busy(http: httpx.Client, nomad: FakeNomad) -> None:
    register(http, cpu_job("llmgw-hog", cores=40, memory_mb=300_000))
    nomad.settle()
    assert [a.node_name for a in nomad.allocations("llmgw-hog")] == ["cpu-01"]


def test_bin_packing_stacks_replicas_on_the_busy_node_without_a_spread() -> None:
    """Job anti-affinity alone loses to bin-packing: three of four replicas share a node."""
    with FakeNomad([node_cpu_64c("cpu-01"), node_cpu_64c("cpu-02")]) as nomad, \
            httpx.Client(base_url=nomad.address) as http:
        _two_cpu_nodes_one_busy(http, nomad)
        register(http, cpu_job(count=4, cores=4, memory_mb=8192))
        nomad.settle()
        nodes = sorted(a.node_name for a in nomad.allocations("llmgw-tiny"))
        assert nodes == ["cpu-01", "cpu-01", "cpu-01", "cpu-02"]


def test_a_spread_on_the_node_id_evens_replicas_across_nodes() -> None:
    """An even spread on ${node.unique.id} scores an unused node +1, a used one -1."""
    with FakeNomad([node_cpu_64c("cpu-01"), node_cpu_64c("cpu-02")]) as nomad, \
            httpx.Client(base_url=nomad.address) as http:
        _two_cpu_nodes_one_busy(http, nomad)
        job = cpu_job(count=4, cores=4, memory_mb=8192)
        job["TaskGroups"][0]["Spreads"] = [{"Attribute": "${node.unique.id}", "Weight": 100}]
        register(http, job)
        nomad.settle()
        nodes = sorted(a.node_name for a in nomad.allocations("llmgw-tiny"))
        assert nodes == ["cpu-01", "cpu-01", "cpu-02", "cpu-02"]
        [alloc] = [a for a in nomad.allocations("llmgw-tiny") if a.index == 1]
        scores = http.get(f"/v1/allocation/{alloc.id}").json()["Metrics"]["ScoreMetaData"]
        assert any("allocation-spread" in s["Scores"] for s in scores)


def test_distinct_hosts_leaves_a_replica_unplaced_rather_than_share_a_node() -> None:
    """Three replicas, two nodes: the third is filtered by "distinct_hosts" and queued."""
    with FakeNomad([node_cpu_64c("cpu-01"), node_cpu_64c("cpu-02")]) as nomad, \
            httpx.Client(base_url=nomad.address) as http:
        job = cpu_job(count=3)
        job["TaskGroups"][0]["Constraints"] = [{"Operand": "distinct_hosts", "RTarget": "true"}]
        register(http, job)
        nomad.settle()
        assert sorted(a.node_name for a in nomad.allocations("llmgw-tiny")) == [
            "cpu-01", "cpu-02"]
        assert _metric(http, "llmgw-tiny")["ConstraintFiltered"] == {"distinct_hosts": 2}
        summary = http.get("/v1/job/llmgw-tiny/summary").json()["Summary"]["serve"]
        assert summary["Queued"] == 1


def test_spreads_are_validated_as_nomad_does(http: httpx.Client) -> None:
    """A spread needs an attribute and a weight in (0, 100]."""
    job = cpu_job()
    job["TaskGroups"][0]["Spreads"] = [{"Attribute": "", "Weight": 0}]
    r = register(http, job)
    assert r.status_code == 500
    assert "Spread 1 validation failed" in r.text
    assert "Missing spread attribute" in r.text
    assert "Spread block must have a positive weight from 0 to 100" in r.text
