"""A model's description and links reach its job's ``ui`` block, and never a replica.

Against the fake Nomad, which treats ``Job.UI`` as Nomad does: a new job version whose
allocations are updated in place (scheduler/util.go ``tasksUpdated`` never reads it).
"""

from __future__ import annotations

import msgspec

from llmgw.catalog.build import Provenance, build_catalog
from llmgw.catalog.fingerprint import fingerprint
from llmgw.testing.fake_nomad import FakeNomad

from .conftest import applied, catalog, config, cpu_model, eventually, make_backend
from .shapes import GPU_CLASSES

JOB = "llmgw-embed"
CONFLICT = "Enforcing job modify index 9: job exists with conflicting job modify index: 10"


async def _serving(fake: FakeNomad, backend, model) -> tuple[set[str], int]:
    """The model registered, its replicas healthy and its deployment finished."""
    await applied(backend, catalog(model))
    fake.settle()
    fake.set_job_checks(JOB, "success")
    await eventually(lambda: fake.deployment(JOB).status == "successful")
    return {a.id for a in fake.allocations(JOB)}, fake.job(JOB)["Version"]


def _registers(fake: FakeNomad) -> list[dict]:
    return [r.body for r in fake.requests
            if (r.method, r.path) == ("POST", "/v1/jobs")]


async def test_a_new_description_reaches_the_job_and_restarts_no_replica(fake, backend):
    """Editing only the description registers one new version of the same spec: the same
    allocations carry it in place, still running, and nothing is stale."""
    m = cpu_model("embed", min_=2)
    replicas, version = await _serving(fake, backend, m)
    assert not fake.job(JOB)["UI"]["Description"].startswith("Embeddings")
    spec = fake.job(JOB)["Meta"]["llmgw_spec"]

    edited = msgspec.structs.replace(m, description="Embeddings for search.")
    await applied(backend, catalog(edited))
    fake.settle()
    job = fake.job(JOB)
    assert job["UI"]["Description"].startswith("Embeddings for search.\nModel embed on ")
    assert job["Version"] == version + 1
    assert job["Meta"]["llmgw_spec"] == spec
    allocs = fake.allocations(JOB)
    assert {a.id for a in allocs} == replicas
    assert all(a.job_version == version + 1 and a.client_status == "running" for a in allocs)
    assert backend.stale("embed") is None
    for r in await backend.replicas("embed"):
        assert r.fingerprint == fingerprint(m, m.profiles[0])
        assert r.restarts == 0


async def test_a_block_already_in_place_is_not_registered_again(fake, backend):
    """Passes that find the registered block equal to the rendered one write nothing, so
    the job's versions do not pile up."""
    _, version = await _serving(fake, backend, cpu_model("embed"))
    fake.clear_requests()
    for _ in range(3):
        await applied(backend, catalog(cpu_model("embed")))
    assert _registers(fake) == []
    assert fake.job(JOB)["Version"] == version


async def test_a_public_url_set_later_adds_the_admin_link_in_place(fake):
    """A server restarted with public_url links every job to its admin page, in place."""
    m = cpu_model("embed")
    first = make_backend(fake)
    await first.start()
    try:
        replicas, _ = await _serving(fake, first, m)
        assert [link["Label"] for link in fake.job(JOB)["UI"]["Links"] or ()] == []
    finally:
        await first.close()
    cfg = config(fake, server={"public_url": "https://llmgw.example.com",
                               "dashboard_url": "https://g.example.com/d/l?var-model={model}"})
    second = make_backend(fake, cfg=cfg)
    await second.start()
    try:
        await applied(second, catalog(m))
        fake.settle()
        links = fake.job(JOB)["UI"]["Links"]
        assert links == [
            {"Label": "llmgw admin", "Url": "https://llmgw.example.com/admin/models/embed"},
            {"Label": "Dashboard", "Url": "https://g.example.com/d/l?var-model=embed"}]
        assert {a.id for a in fake.allocations(JOB)} == replicas
    finally:
        await second.close()


async def test_the_block_is_written_only_if_the_job_is_still_as_read(fake, backend):
    """The re-registration is a check-and-set on the JobModifyIndex read: when the job
    changed meanwhile (a scale from another process), Nomad refuses it, nothing is
    recorded as an error, and a later pass writes the block over the job as it is."""
    m = cpu_model("embed")
    await _serving(fake, backend, m)
    read = fake.job(JOB)["JobModifyIndex"]
    fake.inject("POST", r"^/v1/jobs$", 500, CONFLICT, times=1)
    fake.clear_requests()
    edited = msgspec.structs.replace(m, description="Embeddings for search.")
    await applied(backend, catalog(edited))
    [refused] = _registers(fake)
    assert (refused["EnforceIndex"], refused["JobModifyIndex"]) == (True, read)
    assert backend.status("embed").last_error is None
    await eventually(lambda: fake.job(JOB)["UI"]["Description"].startswith("Embeddings for"),
                     what="the next pass to write the block")
    assert fake.job(JOB)["TaskGroups"][0]["Count"] == 1


async def test_a_runtime_model_names_who_added_it_in_the_job(fake, backend):
    """The catalog's provenance reaches the description: who added a runtime model."""
    m = cpu_model("embed")
    cat = build_catalog([m], GPU_CLASSES,
                        provenance={"embed": Provenance(origin="runtime", added_by="alice")})
    await applied(backend, cat)
    fake.settle()
    assert "\nAdded at run time by alice.\n" in fake.job(JOB)["UI"]["Description"]
