"""A job's ``ui`` block in the fake, as Nomad keeps it and updates it (§1.9).

Sections marked § are those of docs/nomad-api.md.
"""

from __future__ import annotations

import copy
from typing import Any

import httpx

from llmgw.testing import FakeNomad
from tests.testing.jobspec import cpu_job, register

UI = {"Description": "Embeddings for search.",
      "Links": [{"Label": "llmgw admin", "URL": "https://llmgw.example.com/admin/models/x"}]}


def _with(job: dict[str, Any], **fields: Any) -> dict[str, Any]:
    job = copy.deepcopy(job)
    job.update(fields)
    return job


def _plan(http: httpx.Client, job: dict[str, Any]) -> dict[str, int]:
    r = http.post(f"/v1/job/{job['ID']}/plan", json={"Job": job, "Diff": True})
    assert r.status_code == 200, r.text
    return r.json()["Annotations"]["DesiredTGUpdates"]["serve"]  # type: ignore[no-any-return]


def test_the_block_is_kept_with_nomads_own_spelling(http: httpx.Client) -> None:
    """Registered with Links[].URL, read back as the server struct spells it: Url; a job
    without a block reads UI null, and an empty link list reads null."""
    assert register(http, _with(cpu_job(), UI=UI)).status_code == 200
    assert http.get("/v1/job/llmgw-tiny").json()["UI"] == {
        "Description": "Embeddings for search.",
        "Links": [{"Label": "llmgw admin", "Url": "https://llmgw.example.com/admin/models/x"}]}
    assert register(http, cpu_job("plain")).status_code == 200
    assert http.get("/v1/job/plain").json()["UI"] is None
    assert register(http, _with(cpu_job("bare"), UI={"Description": "d", "Links": []})
                    ).status_code == 200
    assert http.get("/v1/job/bare").json()["UI"] == {"Description": "d", "Links": None}


def test_a_ui_only_change_is_a_new_version_updated_in_place(nomad: FakeNomad,
                                                             http: httpx.Client) -> None:
    """scheduler/util.go tasksUpdated never reads Job.UI: a new description is a new job
    version, and the running allocation moves to it in place, never replaced."""
    job = cpu_job(count=2)
    assert register(http, job).status_code == 200
    nomad.settle()
    before = {a.id for a in nomad.allocations("llmgw-tiny")}
    assert _plan(http, _with(job, UI=UI))["InPlaceUpdate"] == 2
    assert register(http, _with(job, UI=UI)).status_code == 200
    nomad.settle()
    assert http.get("/v1/job/llmgw-tiny").json()["Version"] == 1
    allocs = nomad.allocations("llmgw-tiny")
    assert {a.id for a in allocs} == before
    assert all(a.job_version == 1 for a in allocs)


def test_an_affinity_change_replaces_allocations(nomad: FakeNomad, http: httpx.Client) -> None:
    """Unlike the UI block, a changed affinity is destructive (scheduler/util.go
    affinitiesUpdated), as a changed warm-node affinity is on a real cluster."""
    job = cpu_job()
    assert register(http, job).status_code == 200
    nomad.settle()
    moved = copy.deepcopy(job)
    moved["TaskGroups"][0]["Affinities"] = [
        {"LTarget": "${meta.llmgw_cache_x}", "Operand": "=", "RTarget": "t1", "Weight": 100}]
    updates = _plan(http, moved)
    assert (updates["DestructiveUpdate"], updates["InPlaceUpdate"]) == (1, 0)


def test_a_description_over_1000_bytes_is_refused(http: httpx.Client) -> None:
    """Job.Validate counts bytes (Go's len): 334 three-byte characters are too many, with
    Nomad's message and the byte count."""
    r = register(http, _with(cpu_job(), UI={"Description": "語" * 334}))
    assert r.status_code == 500
    assert "UI description must be under 1000 characters, currently 1002" in r.text
    assert register(http, _with(cpu_job(), UI={"Description": "語" * 333})).status_code == 200
