"""Defaults Nomad fills in (§1.2, §1.3) and the register semantics around versions (§1.1).

Sections marked § are those of docs/nomad-api.md.
"""

from __future__ import annotations

import httpx

from llmgw.testing import FakeNomad
from tests.testing.jobspec import S, cpu_job, gpu_job, register, task

MINIMAL = {"ID": "web", "TaskGroups": [{"Name": "g", "Tasks": [{"Name": "t", "Driver": "docker"}]}]}


def test_minimal_job_gets_nomads_defaults(http: httpx.Client) -> None:
    """A bare job comes back with §1.2's defaults, including CPU 100 / MemoryMB 300."""
    assert register(http, MINIMAL).status_code == 200
    job = http.get("/v1/job/web").json()
    assert (job["Name"], job["Type"], job["Region"], job["Namespace"], job["Priority"]) == (
        "web", "service", "global", "default", 50)
    assert job["Datacenters"] == ["*"]
    assert job["NodePool"] == "default"
    assert job["Version"] == 0
    assert job["Stop"] is False
    group = job["TaskGroups"][0]
    assert group["Count"] == 1
    assert group["RestartPolicy"] == {"Attempts": 2, "Interval": 1800 * S, "Delay": 15 * S,
                                      "Mode": "fail", "RenderTemplates": False}
    assert group["ReschedulePolicy"] == {"Attempts": 0, "Interval": 0, "Delay": 30 * S,
                                         "DelayFunction": "exponential", "MaxDelay": 3600 * S,
                                         "Unlimited": True}
    assert group["Update"] == {"Stagger": 30 * S, "MaxParallel": 1, "HealthCheck": "checks",
                               "MinHealthyTime": 10 * S, "HealthyDeadline": 300 * S,
                               "ProgressDeadline": 600 * S, "AutoRevert": False, "Canary": 0,
                               "AutoPromote": False}
    assert group["Migrate"] == {"MaxParallel": 1, "HealthCheck": "checks",
                                "MinHealthyTime": 10 * S, "HealthyDeadline": 300 * S}
    assert group["EphemeralDisk"] == {"Sticky": False, "Migrate": False, "SizeMB": 300}
    t = group["Tasks"][0]
    assert t["Resources"] == {"CPU": 100, "Cores": 0, "MemoryMB": 300}
    assert t["KillTimeout"] == 5 * S
    assert t["LogConfig"] == {"MaxFiles": 10, "MaxFileSizeMB": 10, "Disabled": False}


def test_cores_without_cpu_gets_cpu_zero(http: httpx.Client) -> None:
    """With Cores set and CPU absent the agent writes CPU 0, never the default 100 (§1.3)."""
    assert register(http, cpu_job()).status_code == 200
    resources = task(http.get("/v1/job/llmgw-tiny").json())["Resources"]
    assert (resources["CPU"], resources["Cores"], resources["MemoryMB"]) == (0, 8, 16_384)


def test_service_and_device_defaults(http: httpx.Client) -> None:
    """Service name/address mode/on_update and device Count get their defaults."""
    job = gpu_job()
    service = job["TaskGroups"][0]["Services"][0]
    del service["Name"]
    del task(job)["Resources"]["Devices"][0]["Count"]
    assert register(http, job).status_code == 200
    stored = http.get("/v1/job/llmgw-qwen").json()
    svc = stored["TaskGroups"][0]["Services"][0]
    assert (svc["Name"], svc["AddressMode"], svc["OnUpdate"]) == (
        "llmgw-qwen-serve", "auto", "require_healthy")
    assert svc["Checks"][0]["OnUpdate"] == "require_healthy"
    assert task(stored)["Resources"]["Devices"][0]["Count"] == 1


def test_unchanged_reregister_keeps_version_but_creates_an_eval(
        http: httpx.Client, nomad: FakeNomad) -> None:
    """Re-registering the same spec keeps Version, answers the old ModifyIndex, adds an eval."""
    first = register(http, cpu_job()).json()
    nomad.settle()
    again = register(http, cpu_job()).json()
    assert again["EvalID"]
    assert again["EvalID"] != first["EvalID"]
    assert again["JobModifyIndex"] == first["JobModifyIndex"]
    assert again["EvalCreateIndex"] > first["EvalCreateIndex"]
    assert http.get("/v1/job/llmgw-tiny").json()["Version"] == 0
    changed = cpu_job(cores=4)
    assert register(http, changed).json()["JobModifyIndex"] > first["JobModifyIndex"]
    assert http.get("/v1/job/llmgw-tiny").json()["Version"] == 1
    versions = http.get("/v1/job/llmgw-tiny/versions").json()["Versions"]
    assert [v["Version"] for v in versions] == [1, 0]


def test_meta_change_is_destructive_and_count_change_is_not(
        http: httpx.Client, nomad: FakeNomad) -> None:
    """Changing job Meta replaces the allocation; raising Count keeps the existing one (§1.7)."""
    register(http, cpu_job())
    nomad.settle()
    [original] = nomad.allocations("llmgw-tiny")
    register(http, cpu_job(count=2))
    nomad.settle()
    allocs = nomad.allocations("llmgw-tiny")
    assert [a.name for a in allocs] == ["llmgw-tiny.serve[0]", "llmgw-tiny.serve[1]"]
    assert allocs[0].id == original.id
    assert allocs[0].job_version == 1
    job = cpu_job(count=2)
    job["Meta"]["llmgw_fingerprint"] = "f2"
    register(http, job)
    nomad.settle()
    nomad.set_job_checks("llmgw-tiny", "success")  # let the rolling update finish
    nomad.settle()
    nomad.set_job_checks("llmgw-tiny", "success")
    nomad.settle()
    replaced = nomad.allocations("llmgw-tiny")
    assert {a.job_version for a in replaced} == {2}
    assert original.id not in {a.id for a in replaced}
    old = next(a for a in nomad.allocations("llmgw-tiny", include_terminal=True)
               if a.id == original.id)
    assert old.desired_description == "alloc is being updated due to job update"
    assert old.next_allocation in {a.id for a in replaced}


def test_enforce_index_check_and_set(http: httpx.Client) -> None:
    """EnforceIndex with a stale index is a 500 with Nomad's message (§1.1)."""
    first = register(http, cpu_job(), EnforceIndex=True, JobModifyIndex=0)
    assert first.status_code == 200
    r = register(http, cpu_job(), EnforceIndex=True, JobModifyIndex=0)
    assert (r.status_code, r.text) == (500, "Enforcing job modify index 0: job already exists")
    r = register(http, cpu_job(), EnforceIndex=True, JobModifyIndex=3)
    assert r.status_code == 500
    assert r.text == ("Enforcing job modify index 3: job exists with conflicting job modify "
                      f"index: {first.json()['JobModifyIndex']}")
    r = register(http, cpu_job(cores=2), EnforceIndex=True,
                 JobModifyIndex=first.json()["JobModifyIndex"])
    assert r.status_code == 200


def test_memory_max_warns_without_oversubscription(http: httpx.Client) -> None:
    """MemoryMaxMB is accepted with Nomad's warning that it will be ignored (§1.3)."""
    job = cpu_job()
    task(job)["Resources"]["MemoryMaxMB"] = 32_768
    body = register(http, job).json()
    assert body["Warnings"].startswith("1 warning:\n\n* Memory oversubscription is not enabled")


def test_preserve_counts_keeps_scaled_counts(http: httpx.Client, nomad: FakeNomad) -> None:
    """PreserveCounts keeps each existing group's Count; without it the body's Count wins."""
    register(http, cpu_job(count=2))
    nomad.settle()
    register(http, cpu_job(count=1, cores=4), PreserveCounts=True)
    assert http.get("/v1/job/llmgw-tiny").json()["TaskGroups"][0]["Count"] == 2
    register(http, cpu_job(count=1, cores=4))
    assert http.get("/v1/job/llmgw-tiny").json()["TaskGroups"][0]["Count"] == 1
