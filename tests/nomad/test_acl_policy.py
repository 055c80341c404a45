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


def _jobspecs() -> list[dict[str, object]]:
    """Every job `jobspecs/` holds, as `llmgw jobspec render` wrote it."""
    import json

    out = []
    for path in sorted((ROOT / "jobspecs").glob("*.json")):
        body = json.loads(path.read_text())
        out.append(body.get("Job", body))
    assert out
    return out


def test_a_token_with_only_the_shipped_policy_registers_every_rendered_job(cluster):
    """Job.Register checks each group's host volume against the token's host_volume rules
    (nomad/job_endpoint.go doRegister, acl/acl.go AllowHostVolumeOperation): every job in
    jobspecs/, and the prefetch, sweep and adapter fetch jobs, register with the
    documented token."""
    from llmgw.catalog.adapter import Adapter
    from llmgw.catalog.source import Source
    from llmgw.config import NomadConfig
    from llmgw.scheduler.nomad import adapterjob, warmth
    from llmgw.scheduler.nomad import jobspec as js

    fake, token = cluster
    cfg = NomadConfig(namespace="llm", datacenters=["dc1"])
    m = cpu_model("embed")
    lora = Adapter(name="embed-legal", base="embed",
                   source=Source.parse("http://mirror.internal:8070/adapters/embed-legal/"))
    extra = [warmth.prefetch_job(m, cfg, "http://mirror.internal:8070", ["n1"], run="r1"),
             warmth.sweep_job(cfg, ["n1"], [], since=0.0, run="r1"),
             adapterjob.fetch_job(lora, cfg, None, fake.nodes[0].id, run="r1")]
    jobs = _jobspecs() + [msgspec_builtins(js.encode(j)) for j in extra]
    with _as(fake, token) as c:
        for job in jobs:
            r = c.post("/v1/jobs", json={"Job": job})
            assert r.status_code == 200, (job["ID"], r.status_code, r.text)


def msgspec_builtins(raw: bytes) -> dict[str, object]:
    import json

    decoded: dict[str, object] = json.loads(raw)
    return decoded


def test_register_is_refused_without_the_host_volume_rule_while_plan_passes(cluster):
    """A policy with every namespace capability but no host_volume block: Job.Plan (which
    checks no volume) answers 200, Job.Register answers 403 Permission denied."""
    fake, _ = cluster
    text = re.sub(r'host_volume "[^"]+" \{[^}]*\}', "", POLICY_FILE.read_text())
    fake.apply_policy("no-volume", text)
    token = fake.create_token(["no-volume"])
    job = _jobspecs()[0]
    with _as(fake, token) as c:
        assert c.post(f"/v1/job/{job['ID']}/plan", json={"Job": job}).status_code == 200
        r = c.post("/v1/jobs", json={"Job": job})
        assert (r.status_code, r.text) == (403, "Permission denied")


def test_the_fake_reads_host_volume_rules_as_nomad_does(cluster):
    """acl/policy.go: policy "read" grants mount-readonly only, "write" both, a glob
    matches when no exact rule does, deny wins, and an unknown capability is refused."""
    from llmgw.testing.fake_nomad import acl
    from llmgw.testing.fake_nomad.cluster import NomadError

    def compiled(rules: str) -> acl.Acl:
        return acl.Acl([acl.parse_policy("p", rules)])

    read = compiled('host_volume "cache" { policy = "read" }')
    assert read.allow_host_volume("cache", "mount-readonly")
    assert not read.allow_host_volume("cache", "mount-readwrite")
    glob = compiled('host_volume "llmgw-*" { capabilities = ["mount-readwrite"] }')
    assert glob.allow_host_volume("llmgw-model-cache", "mount-readwrite")
    assert not glob.allow_host_volume("other", "mount-readwrite")
    both = acl.Acl([acl.parse_policy("a", 'host_volume "c" { policy = "write" }'),
                    acl.parse_policy("b", 'host_volume "c" { policy = "deny" }')])
    assert not both.allow_host_volume("c", "mount-readonly")
    with pytest.raises(NomadError, match="Invalid host volume capability 'mount-rw'"):
        acl.parse_policy("x", 'host_volume "c" { capabilities = ["mount-rw"] }')


async def test_a_refused_register_is_a_permission_error_on_the_model_not_an_outage(caplog):
    """A token whose policy lacks the host_volume rule: the model records which capability
    on what Nomad refused and the fix, health() stays ok (Nomad answers) and names it, the
    reconciler keeps its interval rather than backing off, and the log says it once."""
    import logging

    text = re.sub(r'host_volume "[^"]+" \{[^}]*\}', "", POLICY_FILE.read_text())
    caplog.set_level(logging.INFO, logger="llmgw.nomad")
    with FakeNomad(default_fleet(), acl_token=MANAGEMENT, namespaces=("default", "llm")) as fake:
        fake.apply_policy("llmgw", text)
        token = fake.create_token(["llmgw"], name="llmgw")
        m = cpu_model("embed")
        backend = make_backend(fake, cfg=config(fake, [m], namespace="llm", token=token))
        await backend.start()
        try:
            for _ in range(3):
                await applied(backend, catalog(m))
            status = backend.status("embed")
            assert "mount-readwrite on host volume 'llmgw-model-cache'" in (status.refused or "")
            assert "'llmgw' (accessor " in (status.refused or "")
            assert "nomad/llmgw-policy.hcl" in (status.refused or "")
            health = backend.health()
            assert health.ok
            assert "mount-readwrite" in (health.refused or "")
            assert backend._failures == 0          # no back-off: Nomad is not down
            assert fake.allocations("llmgw-embed", namespace="llm") == []
        finally:
            await backend.close()
    said = [r for r in caplog.records if "mount-readwrite" in r.getMessage()]
    assert len(said) == 1
    assert not [r for r in caplog.records if "unreachable" in r.getMessage()]


def test_the_token_writes_the_credentials_an_adapter_fetch_reads(cluster):
    """An adapter behind a password-protected mirror: llmgw's token writes the Variable
    its fetch job reads (nomad/jobs/llmgw_adapter_*), and no other job's task reads it."""
    from llmgw.catalog.adapter import Adapter
    from llmgw.catalog.source import Source
    from llmgw.config import NomadConfig
    from llmgw.scheduler.nomad import adapterjob, credentials
    from llmgw.scheduler.nomad.client import NomadClient

    fake, token = cluster
    cfg = NomadConfig(address=fake.address, namespace="llm", datacenters=["dc1"],
                      token=token)
    mirror = "http://llmgw:s3cret@mirror.internal:8070"
    lora = Adapter(name="embed-legal", base="embed", source=Source.parse("hf://acme/legal"))
    jid = adapterjob.job_id(lora.name, fake.nodes[0].id)
    client = NomadClient(cfg)
    try:
        path = credentials.Keeper(client, cfg, mirror).ensure(lora, jid)
    finally:
        client.close()
    assert path == f"nomad/jobs/{jid}"
    assert fake.variable(path, namespace="llm") == {credentials.FETCH_USERINFO: "llmgw:s3cret"}
    with _as(fake, _other_job_workload(fake)) as c:
        assert c.get(f"/v1/var/{path}", params={"namespace": "llm"}).status_code == 403
