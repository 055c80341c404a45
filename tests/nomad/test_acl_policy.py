"""nomad/llmgw-policy.hcl, applied exactly as its own instructions say, in the fake Nomad.

The fake parses the policy the way Nomad does and attaches it the way ``nomad acl
policy apply`` attaches it (llmgw.testing.fake_nomad.acl), so these tests read the
apply command out of the file's comment and run it: whatever an operator pastes is
what is checked.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llmgw.testing.fake_nomad import FakeNomad, default_fleet

from .conftest import applied, catalog, config, cpu_model, eventually, make_backend

ROOT = Path(__file__).resolve().parents[2]
POLICY_FILE = ROOT / "nomad" / "llmgw-policy.hcl"
MANAGEMENT = "management-secret"


def documented_apply() -> tuple[str, dict[str, str]]:
    """The policy name and the flags of the `nomad acl policy apply` line in the file."""
    text = POLICY_FILE.read_text()
    line = next(ln.lstrip("# ").strip() for ln in text.splitlines()
                if "nomad acl policy apply" in ln)
    words = shlex.split(line)[4:]
    flags: dict[str, str] = {}
    while words and words[0].startswith("-"):
        flag = words.pop(0).lstrip("-")
        flags[flag] = words.pop(0)
    name, path = words
    assert (ROOT / path).resolve() == POLICY_FILE
    return name, {k: v for k, v in flags.items() if k in ("namespace", "job", "group", "task")}


@pytest.fixture
def cluster() -> Iterator[tuple[FakeNomad, str]]:
    """A fake Nomad with ACLs, namespace llm, the policy applied as documented, and
    llmgw's token created as documented."""
    with FakeNomad(default_fleet(), acl_token=MANAGEMENT, namespaces=("default", "llm")) as f:
        name, flags = documented_apply()
        f.apply_policy(name, POLICY_FILE.read_text(), **flags)
        yield f, f.create_token([name])


def _as(fake: FakeNomad, token: str) -> httpx.Client:
    return httpx.Client(base_url=fake.address, headers={"X-Nomad-Token": token}, timeout=30)


def _other_job_workload(fake: FakeNomad) -> str:
    """The workload identity of a task of some other team's job in namespace llm."""
    job = {"ID": "reports", "Namespace": "llm", "Datacenters": ["dc1"], "TaskGroups": [{
        "Name": "web", "Count": 1, "Tasks": [{"Name": "app", "Driver": "docker",
                                              "Config": {"image": "busybox"},
                                              "Resources": {"CPU": 100, "MemoryMB": 64}}]}]}
    with _as(fake, MANAGEMENT) as c:
        assert c.post("/v1/jobs", json={"Job": job}).status_code == 200
    fake.settle()
    [alloc] = fake.allocations("reports", namespace="llm")
    return fake.workload_token(alloc.id, "app")


def test_the_policy_applied_the_documented_way_grants_nothing_to_other_jobs(cluster):
    """Another job's task in llmgw's namespace can neither submit jobs, nor read or write
    the credentials llmgw keeps in Variables."""
    fake, token = cluster
    with _as(fake, token) as c:
        r = c.put("/v1/var/nomad/jobs/llmgw-qwen", params={"namespace": "llm"},
                  json={"Items": {"LLMGW_FETCH_USERINFO": "reader:s3cret"}})
        assert r.status_code == 200, r.text
    workload = _other_job_workload(fake)
    with _as(fake, workload) as c:
        job = {"ID": "llmgw-evil", "Namespace": "llm", "TaskGroups": []}
        assert (c.post("/v1/jobs", json={"Job": job}).status_code,) == (403,)
        r = c.get("/v1/var/nomad/jobs/llmgw-qwen", params={"namespace": "llm"})
        assert (r.status_code, r.text) == (403, "Permission denied")
        r = c.put("/v1/var/nomad/jobs/llmgw-qwen", params={"namespace": "llm"},
                  json={"Items": {"LLMGW_FETCH_USERINFO": "attacker:x"}})
        assert r.status_code == 403
        assert c.post("/v1/job/llmgw-qwen/scale", params={"namespace": "llm"},
                      json={"Count": 0, "Target": {"Group": "serve"}}).status_code == 403
    assert fake.variable("nomad/jobs/llmgw-qwen", "llm") == {
        "LLMGW_FETCH_USERINFO": "reader:s3cret"}


def test_applying_it_to_the_namespace_would_hand_it_to_every_workload(cluster):
    """The fake attaches a -namespace policy the way Nomad does, which is why the file
    says never to: the same other job's task could then submit jobs."""
    fake, _ = cluster
    name, _flags = documented_apply()
    fake.apply_policy(name, POLICY_FILE.read_text(), namespace="llm")
    workload = _other_job_workload(fake)
    with _as(fake, workload) as c:
        job = {"ID": "llmgw-evil", "Namespace": "llm", "Datacenters": ["dc1"],
               "TaskGroups": [{"Name": "g", "Count": 0, "Tasks": [{
                   "Name": "t", "Driver": "docker", "Config": {"image": "busybox"}}]}]}
        assert c.post("/v1/jobs", json={"Job": job}).status_code == 200


async def test_the_policy_grants_llmgw_what_its_backend_does(cluster):
    """The backend, holding only the documented token, registers a model's job in llm,
    sees it placed, records the weights on the node's metadata and reads the fleet; a
    token without the policy is refused."""
    fake, token = cluster
    m = cpu_model("embed")
    backend = make_backend(fake, cfg=config(fake, [m], namespace="llm", token=token))
    await backend.start()
    try:
        await applied(backend, catalog(m))
        fake.settle()
        assert fake.allocations("llmgw-embed", namespace="llm")
        assert backend.status("embed").last_error is None
        [a] = fake.allocations("llmgw-embed", namespace="llm")
        await eventually(lambda: "llmgw_cache_embed" in fake.node(a.node_name).meta,
                         what="the node's cache metadata, written with node:write")
        fleet = await backend.fleet()
        assert fleet.nodes
    finally:
        await backend.close()
    with _as(fake, fake.create_token([])) as c:
        assert c.get("/v1/jobs", params={"namespace": "llm"}).status_code == 403


def test_the_policy_parses_as_nomad_parses_it(cluster):
    """Nomad's parser refuses an unknown capability; the shipped file has none."""
    fake, _ = cluster
    from llmgw.testing.fake_nomad.cluster import NomadError

    with pytest.raises(NomadError, match="Invalid namespace capability 'read-jobs'"):
        fake.apply_policy("typo", 'namespace "llm" { capabilities = ["read-jobs"] }')
    assert re.search(r'namespace "\*"', POLICY_FILE.read_text())


async def test_with_node_read_only_models_still_run_and_the_refusal_is_said_once(caplog):
    """The choice the policy offers — node "read" — leaves nodes unmarked: the model's job
    is placed as before, and the refused metadata write is logged once, not each pass."""
    text = POLICY_FILE.read_text().replace('policy = "write"', 'policy = "read"')
    with FakeNomad(default_fleet(), acl_token=MANAGEMENT, namespaces=("default", "llm")) as fake:
        name, flags = documented_apply()
        fake.apply_policy(name, text, **flags)
        token = fake.create_token([name])
        m = cpu_model("embed")
        backend = make_backend(fake, cfg=config(fake, [m], namespace="llm", token=token))
        await backend.start()
        try:
            for _ in range(3):
                await applied(backend, catalog(m))
            fake.settle()
            [a] = fake.allocations("llmgw-embed", namespace="llm")
            assert "llmgw_cache_embed" not in fake.node(a.node_name).meta
            assert backend.health().ok
        finally:
            await backend.close()
    said = [r for r in caplog.records if "keeping the nodes' cache metadata" in r.message]
    assert len(said) == 1
    assert "node:write" in said[0].getMessage()
