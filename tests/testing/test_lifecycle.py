"""Allocation lifecycle the tests drive: services, checks, deployments, failures (§4.4, §5).

Sections marked § are those of docs/nomad-api.md.
"""

from __future__ import annotations

import httpx
import pytest

from llmgw.testing import FakeNomad
from tests.testing.jobspec import S, cpu_job, gpu_job, register, task


def test_services_register_before_checks_pass(http: httpx.Client, nomad: FakeNomad) -> None:
    """A replica is in the catalog while its check is still pending (§4.4)."""
    register(http, gpu_job())
    nomad.settle()
    [reg] = http.get("/v1/service/llmgw-qwen").json()
    [alloc] = nomad.allocations("llmgw-qwen")
    node = nomad.node(alloc.node_name)
    assert reg["ID"] == f"_nomad-task-{alloc.id}-group-serve-llmgw-qwen-http"
    assert (reg["AllocID"], reg["Address"], reg["Port"]) == (
        alloc.id, node.address, alloc.ports[0].value)
    assert "Meta" not in reg
    assert "Status" not in reg
    checks = http.get(f"/v1/allocation/{alloc.id}/checks").json()
    [result] = checks.values()
    assert (result["Status"], result["Mode"], result["Group"], result["Check"]) == (
        "pending", "healthiness", "llmgw-qwen.serve[0]", "ready")
    assert "StatusCode" not in result
    assert http.get(f"/v1/client/allocation/{alloc.id}/checks").json() == checks


def test_checks_flip_and_drive_the_deployment(http: httpx.Client, nomad: FakeNomad) -> None:
    """Flipping the check to success makes the alloc healthy and the deployment successful."""
    register(http, gpu_job())
    nomad.settle()
    [alloc] = nomad.allocations("llmgw-qwen")
    assert http.get("/v1/job/llmgw-qwen/deployment").json()["Status"] == "running"
    nomad.set_check(alloc.id, "failure")
    [result] = http.get(f"/v1/allocation/{alloc.id}/checks").json().values()
    assert result["Status"] == "failure"
    assert http.get("/v1/job/llmgw-qwen/deployment").json()["Status"] == "running"
    nomad.set_check(alloc.id, "success")
    [result] = http.get(f"/v1/allocation/{alloc.id}/checks").json().values()
    assert (result["Status"], result["StatusCode"], result["Output"]) == (
        "success", 200, "nomad: http ok")
    deployment = http.get("/v1/job/llmgw-qwen/deployment").json()
    assert deployment["Status"] == "successful"
    assert deployment["TaskGroups"]["serve"]["HealthyAllocs"] == 1
    stub = http.get("/v1/job/llmgw-qwen/allocations").json()[0]
    assert stub["DeploymentStatus"]["Healthy"] is True
    assert http.get("/v1/job/llmgw-qwen").json()["Stable"] is True


def test_scale_is_refused_during_a_deployment(http: httpx.Client, nomad: FakeNomad) -> None:
    """POST /scale is a 400 while the deployment runs, accepted once it finished (§5.3)."""
    register(http, cpu_job())
    nomad.settle()
    body = {"Count": 2, "Target": {"Group": "serve"}, "Message": "more traffic"}
    r = http.post("/v1/job/llmgw-tiny/scale", json=body)
    assert (r.status_code, r.text) == (400, "job scaling blocked due to active deployment")
    nomad.finish_deployment("llmgw-tiny")
    r = http.post("/v1/job/llmgw-tiny/scale", json=body)
    assert r.status_code == 200
    assert r.json()["EvalID"]
    nomad.settle()
    status = http.get("/v1/job/llmgw-tiny/scale").json()
    assert status["TaskGroups"]["serve"]["Desired"] == 2
    assert status["TaskGroups"]["serve"]["Events"][0]["Message"] == "more traffic"
    assert len(nomad.allocations("llmgw-tiny")) == 2


@pytest.mark.parametrize(("body", "status", "text"), [
    ({"Count": 1, "Target": {}}, 400, "missing task group name for scaling action"),
    ({"Count": -1, "Target": {"Group": "serve"}}, 400, "scaling action count can't be negative"),
    ({"Count": 1, "Target": {"Group": "nope"}}, 400,
     'task group "nope" specified for scaling does not exist in job'),
    ({"Count": 1, "Target": {"Group": "serve", "Job": "other"}}, 400,
     "job ID in payload did not match URL"),
])
def test_scale_request_errors(http: httpx.Client, nomad: FakeNomad, body: dict[str, object],
                              status: int, text: str) -> None:
    """Bad scaling requests get Nomad's status and text."""
    register(http, cpu_job())
    r = http.post("/v1/job/llmgw-tiny/scale", json=body)
    assert (r.status_code, r.text) == (status, text)


def test_manual_run_mode(http: httpx.Client) -> None:
    """With auto_run off, allocations stay pending (already in the catalog) until run_alloc."""
    with FakeNomad(auto_run=False) as nomad, httpx.Client(base_url=nomad.address) as c:
        register(c, gpu_job())
        nomad.settle()
        [alloc] = nomad.allocations("llmgw-qwen")
        assert alloc.client_status == "pending"
        assert len(c.get("/v1/service/llmgw-qwen").json()) == 1
        nomad.run_alloc(alloc.id)
        assert c.get(f"/v1/allocation/{alloc.id}").json()["ClientStatus"] == "running"


def test_a_failure_in_a_progress_based_deployment_is_replaced_and_it_goes_on(
        http: httpx.Client, nomad: FakeNomad) -> None:
    """With a progress deadline, a failed alloc of the running deployment is replaced."""
    register(http, cpu_job())
    nomad.settle()
    [first] = nomad.allocations("llmgw-tiny")
    nomad.fail_alloc(first.id)
    nomad.settle()
    deployment = http.get("/v1/job/llmgw-tiny/deployment").json()
    assert deployment["Status"] == "running"
    assert deployment["TaskGroups"]["serve"]["UnhealthyAllocs"] == 1
    [second] = nomad.allocations("llmgw-tiny")
    assert second.previous_allocation == first.id
    stub = next(a for a in http.get("/v1/job/llmgw-tiny/allocations").json()
                if a["ID"] == first.id)
    assert (stub["ClientStatus"], stub["NextAllocation"]) == ("failed", second.id)
    assert stub["DeploymentStatus"]["Healthy"] is False
    assert stub["TaskStates"]["engine"]["Failed"] is True


def test_without_a_progress_deadline_the_first_failure_fails_the_deployment(
        http: httpx.Client, nomad: FakeNomad) -> None:
    """ProgressDeadline 0: the first unhealthy alloc fails it, and nothing replaces it."""
    job = cpu_job()
    job["Update"]["ProgressDeadline"] = 0
    register(http, job)
    nomad.settle()
    [first] = nomad.allocations("llmgw-tiny")
    nomad.fail_alloc(first.id)
    nomad.settle()
    deployment = http.get("/v1/job/llmgw-tiny/deployment").json()
    assert (deployment["Status"], deployment["StatusDescription"]) == (
        "failed", "Failed due to unhealthy allocations")
    assert http.get("/v1/service/llmgw-tiny").json() == []
    assert nomad.allocations("llmgw-tiny") == []  # not rescheduled: its deployment failed


def test_after_a_successful_deployment_a_failed_alloc_is_rescheduled(
        http: httpx.Client, nomad: FakeNomad) -> None:
    """Once the deployment succeeded, a failure is replaced by a rescheduled alloc."""
    register(http, cpu_job())
    nomad.settle()
    nomad.set_job_checks("llmgw-tiny", "success")
    [first] = nomad.allocations("llmgw-tiny")
    nomad.fail_alloc(first.id, "OOM killed")
    nomad.settle()
    [second] = nomad.allocations("llmgw-tiny")
    assert second.previous_allocation == first.id
    assert second.client_status == "running"
    assert http.get("/v1/job/llmgw-tiny/deployment").json()["Status"] == "successful"


def test_alloc_stats_report_memory(http: httpx.Client, nomad: FakeNomad) -> None:
    """set_alloc_memory shows up as RSS and Usage in the client stats."""
    register(http, cpu_job())
    nomad.settle()
    [alloc] = nomad.allocations("llmgw-tiny")
    nomad.set_alloc_memory(alloc.id, 12 * 2**30)
    stats = http.get(f"/v1/client/allocation/{alloc.id}/stats").json()
    memory = stats["ResourceUsage"]["MemoryStats"]
    assert memory["RSS"] == memory["Usage"] == 12 * 2**30
    assert stats["Tasks"]["engine"]["ResourceUsage"]["MemoryStats"]["RSS"] == 12 * 2**30


def test_node_down_loses_allocs_and_replaces_them(http: httpx.Client, nomad: FakeNomad) -> None:
    """A node going down marks its allocs lost, drops their services, places replacements."""
    register(http, gpu_job(fabric=None))
    nomad.settle()
    [alloc] = nomad.allocations("llmgw-qwen")
    nomad.set_node(alloc.node_name, status="down")
    nomad.settle()
    lost = http.get(f"/v1/allocation/{alloc.id}").json()
    assert (lost["ClientStatus"], lost["DesiredDescription"]) == (
        "lost", "alloc is lost since its node is down")
    [replacement] = nomad.allocations("llmgw-qwen")
    assert replacement.node_name != alloc.node_name
    [reg] = http.get("/v1/service/llmgw-qwen").json()
    assert reg["AllocID"] == replacement.id
    r = http.get(f"/v1/allocation/{alloc.id}/checks")
    assert (r.status_code, r.text) == (404, "No path to node")


def test_drain_migrates_allocations(http: httpx.Client, nomad: FakeNomad) -> None:
    """Draining a node moves its allocations elsewhere ("alloc is being migrated")."""
    register(http, gpu_job(fabric=None))
    nomad.settle()
    [alloc] = nomad.allocations("llmgw-qwen")
    nomad.set_node(alloc.node_name, drain=True)
    nomad.settle()
    [moved] = nomad.allocations("llmgw-qwen")
    assert moved.node_name != alloc.node_name
    assert moved.previous_allocation == alloc.id
    old = http.get(f"/v1/allocation/{alloc.id}").json()
    assert (old["DesiredDescription"], old["ClientStatus"]) == (
        "alloc is being migrated", "complete")
    node = http.get(f"/v1/node/{nomad.node(alloc.node_name).id}").json()
    assert node["Drain"] is True
    assert node["DrainStrategy"] is not None


def _task_service_job(*, task_delay: int = 0, group_delay: int = 0) -> dict[str, object]:
    """The replica's service on its engine task, with shutdown delays where asked."""
    job = gpu_job(fabric=None)
    group = job["TaskGroups"][0]
    task(job)["Services"] = group.pop("Services")
    if task_delay:
        task(job)["ShutdownDelay"] = task_delay
    if group_delay:
        group["ShutdownDelay"] = group_delay
    return job


def _drain_one(http: httpx.Client, nomad: FakeNomad, job: dict[str, object]) -> str:
    register(http, job)
    nomad.settle()
    [alloc] = nomad.allocations("llmgw-qwen")
    assert [s.alloc_id for s in nomad.services("llmgw-qwen")] == [alloc.id]
    nomad.set_node(alloc.node_name, drain=True)
    nomad.settle()
    [moved] = nomad.allocations("llmgw-qwen")
    assert moved.node_name != alloc.node_name
    return alloc.id


def test_a_stopping_task_leaves_the_catalog_then_waits_its_shutdown_delay(
        http: httpx.Client, nomad: FakeNomad) -> None:
    """The task's services are deregistered first, then it waits shutdown_delay (its state
    pending, "Waiting for shutdown delay"), then it is killed and the alloc completes
    (taskrunner/service_hook.go PreKilling, task_runner.go handleKill)."""
    old = _drain_one(http, nomad, _task_service_job(task_delay=30 * S))
    assert old not in {s.alloc_id for s in nomad.services("llmgw-qwen")}
    stopping = http.get(f"/v1/allocation/{old}").json()
    assert (stopping["DesiredStatus"], stopping["ClientStatus"]) == ("stop", "running")
    engine = stopping["TaskStates"]["engine"]
    assert engine["State"] == "pending"
    assert engine["Events"][-1]["Type"] == "Waiting for shutdown delay"
    nomad.advance(29)
    assert http.get(f"/v1/allocation/{old}").json()["ClientStatus"] == "running"
    nomad.advance(1)
    done = http.get(f"/v1/allocation/{old}").json()
    assert done["ClientStatus"] == "complete"
    assert done["TaskStates"]["engine"]["Events"][-1]["Type"] == "Killed"


def test_a_group_shutdown_delay_runs_while_a_task_service_is_still_registered(
        http: httpx.Client, nomad: FakeNomad) -> None:
    """A group's shutdown_delay deregisters only group services before it waits
    (group_service_hook.go preKillLocked); a task's service goes when the task is killed
    after it."""
    old = _drain_one(http, nomad, _task_service_job(group_delay=30 * S))
    assert old in {s.alloc_id for s in nomad.services("llmgw-qwen")}
    nomad.advance(30)
    assert old not in {s.alloc_id for s in nomad.services("llmgw-qwen")}
    assert http.get(f"/v1/allocation/{old}").json()["ClientStatus"] == "complete"


def test_rolling_update_waits_for_health(http: httpx.Client, nomad: FakeNomad) -> None:
    """With MaxParallel 1 a destructive update replaces one alloc per healthy batch."""
    register(http, cpu_job(count=2))
    nomad.settle()
    nomad.set_job_checks("llmgw-tiny", "success")
    nomad.settle()
    job = cpu_job(count=2)
    job["Meta"]["llmgw_fingerprint"] = "f2"
    register(http, job)
    nomad.settle()
    versions = sorted(a.job_version for a in nomad.allocations("llmgw-tiny"))
    assert versions == [0, 1]
    new = next(a for a in nomad.allocations("llmgw-tiny") if a.job_version == 1)
    nomad.set_check(new.id, "success")
    nomad.settle()
    assert sorted(a.job_version for a in nomad.allocations("llmgw-tiny")) == [1, 1]


def test_a_task_killed_mid_run_records_the_real_kill_sequence() -> None:
    """A stop while the prestart fetch runs: the fetch gets Killing, Terminated with the
    signal's exit code (143), Killed, and Failed stays false; the engine that never
    started gets Killing only (task_runner.go handleKill, emitExitResultEvent)."""
    with FakeNomad(auto_run=False) as nomad, httpx.Client(base_url=nomad.address) as c:
        register(c, cpu_job())
        nomad.settle()
        [alloc] = nomad.allocations("llmgw-tiny")
        nomad.run_alloc(alloc.id, through_prestart=False)
        assert c.delete("/v1/job/llmgw-tiny").status_code == 200
        nomad.settle()
        states = c.get(f"/v1/allocation/{alloc.id}").json()["TaskStates"]
        fetch = states["fetch"]
        kinds = [e["Type"] for e in fetch["Events"]]
        assert kinds[-3:] == ["Killing", "Terminated", "Killed"]
        terminated = fetch["Events"][-2]
        assert (terminated["ExitCode"], terminated["Details"]["exit_code"],
                terminated["DisplayMessage"]) == (143, "143", "Exit Code: 143")
        assert fetch["Events"][-3]["DisplayMessage"] == \
            "Sent interrupt. Waiting 5s before force killing"
        assert (fetch["State"], fetch["Failed"]) == ("dead", False)
        engine = states["engine"]
        assert [e["Type"] for e in engine["Events"]][-1] == "Killing"
        assert (engine["State"], engine["Failed"]) == ("dead", False)


def test_a_prestart_task_that_finished_exits_zero() -> None:
    """A fetch that ran to its end records Terminated with exit code 0."""
    with FakeNomad() as nomad, httpx.Client(base_url=nomad.address) as c:
        register(c, cpu_job())
        nomad.settle()
        [alloc] = nomad.allocations("llmgw-tiny")
        fetch = c.get(f"/v1/allocation/{alloc.id}").json()["TaskStates"]["fetch"]
        [terminated] = [e for e in fetch["Events"] if e["Type"] == "Terminated"]
        assert (terminated["ExitCode"], terminated["Details"]["exit_code"]) == (0, "0")
