"""`llmgw nomad doctor` against the fake Nomad: a cluster set up as the README says is all
there (exit 0), and each missing piece is named on its own line with its fix (exit 1).

The fake answers /v1/acl/token/self and /v1/acl/policy/:name as Nomad does
(llmgw.testing.fake_nomad.acl_routes), with RulesJSON parsed by the fake's own policy
parser, so doctor's reading of a policy is checked against the fake's enforcement.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner, Result

from llmgw.cli import main
from llmgw.testing.fake_nomad import FakeNomad, default_fleet
from llmgw.testing.fake_nomad.records import HostVolume

ROOT = Path(__file__).resolve().parents[2]
POLICY = (ROOT / "nomad" / "llmgw-policy.hcl").read_text()
PROMETHEUS = (ROOT / "deploy" / "prometheus-policy.hcl").read_text()
H100, L40S = "NVIDIA H100 80GB HBM3", "NVIDIA L40S"


def _server_yaml(tmp: Path, fake: FakeNomad, token: str | None,
                 classes: dict[str, tuple[str, str]] | None = None) -> Path:
    classes = classes or {"h100-80g": (H100, "81559MiB"), "l40s-48g": (L40S, "46068MiB")}
    lines = ["scheduler:", "  kind: nomad", "  nomad:", f"    address: {fake.address}",
             "    namespace: llm", "    datacenters: [dc1]"]
    if token:
        lines.append(f"    token: {token}")
    lines.append("gpu_classes:")
    for name, (device, memory) in classes.items():
        lines += [f"  {name}:", f"    device: {device}", f"    memory: {memory}"]
    path = tmp / "server.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _doctor(config: Path, *extra: str) -> Result:
    return CliRunner().invoke(main, ["nomad", "doctor", "--config", str(config), *extra],
                              env={"NOMAD_TOKEN": "", "NOMAD_ADDR": ""})


@pytest.fixture
def cluster() -> Iterator[FakeNomad]:
    with FakeNomad(default_fleet(), acl_token="root", namespaces=("default", "llm")) as f:
        yield f


def _setup(fake: FakeNomad, policy: str = POLICY) -> str:
    """The README's step 2: the policy applied plainly, a token holding it."""
    fake.apply_policy("llmgw", policy)
    return fake.create_token(["llmgw"], name="llmgw")


def _lines(result: Result, status: str) -> list[str]:
    return [ln[8:] for ln in result.output.splitlines() if ln.startswith(status.ljust(8))]


def test_a_cluster_set_up_as_the_readme_says_is_all_there(cluster, tmp_path):
    """The shipped policy on a plain token, the default fleet, both gpu classes and
    Prometheus's token: no line is missing and the exit status is 0."""
    token = _setup(cluster)
    cluster.apply_policy("prometheus", PROMETHEUS)
    prom = cluster.create_token(["prometheus"], name="prometheus")
    got = _doctor(_server_yaml(tmp_path, cluster, token), "--prometheus-token", prom)
    assert got.exit_code == 0, got.output
    assert _lines(got, "missing") == []
    ok = "\n".join(_lines(got, "ok"))
    assert "mount-readwrite on host volume 'llmgw-model-cache'" in ok
    assert "variables write on nomad/jobs/llmgw_prefetch_*" in ok
    assert "node:write" in ok
    assert "gpu class h100-80g: 'NVIDIA H100 80GB HBM3' with 81559 MiB or more" in ok
    assert "node cpu-01: host volume 'llmgw-model-cache' at /var/lib/llmgw/model-cache" in ok
    assert "Prometheus's token: read-job in namespace 'llm'" in ok
    info = "\n".join(_lines(got, "info"))
    assert "is not something Nomad's API shows: the fetch runs as uid 10001" in info
    assert "everything llmgw needs is there" in got.output


def _missing_after(fake: FakeNomad, tmp: Path, policy: str = POLICY, **kw: Any) -> Result:
    token = _setup(fake, policy)
    got = _doctor(_server_yaml(tmp, fake, token, kw.get("classes")))
    assert got.exit_code == 1, got.output
    return got


def test_a_policy_without_the_host_volume_rule_is_named(cluster, tmp_path):
    """No host_volume block: the register capability on the cache volume is missing."""
    got = _missing_after(cluster, tmp_path, re.sub(r'host_volume "[^"]+" \{[^}]*\}', "", POLICY))
    [line] = [ln for ln in _lines(got, "missing") if "host volume" in ln]
    assert "no mount-readwrite on host volume 'llmgw-model-cache'" in line
    assert 'host_volume "llmgw-model-cache" { capabilities = ["mount-readwrite"] }' in got.output


def test_a_policy_without_variables_access_is_named(cluster, tmp_path):
    """No variables block: reading and writing the credentials' paths are missing."""
    no_vars = re.sub(r"variables \{.*?\n  \}\n", "", POLICY, flags=re.S)
    got = _missing_after(cluster, tmp_path, no_vars)
    said = "\n".join(_lines(got, "missing"))
    assert "no variables write on nomad/jobs/llmgw-* in namespace 'llm'" in said
    assert "no variables read on nomad/jobs/llmgw_prefetch_*" in said


def test_a_token_without_node_write_warns_and_still_passes(cluster, tmp_path):
    """node "read": metadata writes are missing, which llmgw runs without (exit 0)."""
    token = _setup(cluster, POLICY.replace('policy = "write"', 'policy = "read"'))
    got = _doctor(_server_yaml(tmp_path, cluster, token))
    assert got.exit_code == 0, got.output
    assert any("no node:write" in ln for ln in _lines(got, "warn"))


def test_a_token_nomad_does_not_know_is_named(cluster, tmp_path):
    """A deleted or mistyped token: 403 ACL token not found, on its own line."""
    got = _doctor(_server_yaml(tmp_path, cluster, "6a1e0b7e-0000-4000-8000-000000000000"))
    assert got.exit_code == 1
    [line] = _lines(got, "missing")[:1]
    assert "llmgw's token: Nomad cannot say who it is" in line
    assert "ACL token not found" in line


def test_acls_off_is_a_warning_not_a_failure(tmp_path):
    """With ACLs off Nomad answers the acls-disabled token and allows every call."""
    with FakeNomad(default_fleet(), namespaces=("default", "llm")) as fake:
        got = _doctor(_server_yaml(tmp_path, fake, None))
    assert got.exit_code == 0, got.output
    assert any("ACLs are off" in ln for ln in _lines(got, "warn"))


def test_unreachable_nomad_is_one_missing_line(cluster, tmp_path):
    """Nothing answers at the address: one line, exit 1."""
    path = _server_yaml(tmp_path, cluster, "x")
    cluster.stop()
    got = _doctor(path)
    assert got.exit_code == 1
    [line] = _lines(got, "missing")
    assert "cannot reach Nomad" in line


def _fleet_with(name: str, **change: Any) -> list[Any]:
    return [msgspec.structs.replace(n, **change) if n.name == name else n
            for n in default_fleet()]


def test_a_node_without_the_cache_volume_is_named(tmp_path):
    """A client with no host_volume block: that node's line says so, with the fix."""
    with FakeNomad(_fleet_with("cpu-01", host_volumes={}), acl_token="root",
                   namespaces=("default", "llm")) as fake:
        got = _missing_after(fake, tmp_path)
    [line] = [ln for ln in _lines(got, "missing") if ln.startswith("node cpu-01")]
    assert "no host volume 'llmgw-model-cache'" in line


def test_a_read_only_cache_volume_is_named(tmp_path):
    """read_only = true: the fetch could never write it."""
    vol = {"llmgw-model-cache": HostVolume(path="/var/lib/llmgw/model-cache", read_only=True)}
    with FakeNomad(_fleet_with("gpu-l40s-01", host_volumes=vol), acl_token="root",
                   namespaces=("default", "llm")) as fake:
        got = _missing_after(fake, tmp_path)
    assert any("node gpu-l40s-01: host volume 'llmgw-model-cache' is read-only" in ln
               for ln in _lines(got, "missing"))


def test_a_node_without_docker_is_named(tmp_path):
    """No Docker driver fingerprinted: every llmgw task uses it."""
    with FakeNomad(_fleet_with("cpu-01", drivers=["exec"]), acl_token="root",
                   namespaces=("default", "llm")) as fake:
        got = _missing_after(fake, tmp_path)
    assert "node cpu-01: no Docker driver" in _lines(got, "missing")


def test_a_gpu_node_without_the_nvidia_plugin_is_named(tmp_path):
    """A node carrying llmgw_gpu_class but reporting no GPU: the device plugin is absent."""
    with FakeNomad(_fleet_with("gpu-l40s-01", devices=[]), acl_token="root",
                   namespaces=("default", "llm")) as fake:
        got = _missing_after(fake, tmp_path)
    said = "\n".join(_lines(got, "missing"))
    assert "node gpu-l40s-01: carries llmgw_gpu_class but reports no nvidia GPU" in said
    assert "gpu class l40s-48g: no node reports nvidia device 'NVIDIA L40S'" in said


def test_a_gpu_class_naming_a_device_no_node_reports_is_named(cluster, tmp_path):
    """A device string that is not the NVML name: missing, with what nodes do report."""
    got = _missing_after(cluster, tmp_path, classes={"h100-80g": ("H100 80GB", "81559MiB")})
    [line] = [ln for ln in _lines(got, "missing") if ln.startswith("gpu class")]
    assert "no node reports nvidia device 'H100 80GB' (nodes report: NVIDIA H100 80GB HBM3, " \
           "NVIDIA L40S)" in line


def test_a_gpu_class_declaring_more_memory_than_cards_report_is_named(cluster, tmp_path):
    """memory: 80GiB on an "80GB" H100 (which reports 81559 MiB): no node matches."""
    got = _missing_after(cluster, tmp_path, classes={"h100-80g": (H100, "80GiB")})
    [line] = [ln for ln in _lines(got, "missing") if ln.startswith("gpu class")]
    assert "declares 81920 MiB per card but the nodes report 81559 MiB" in line
    assert "set its memory to 81559MiB" in got.output


def test_a_prometheus_token_without_read_job_is_named(cluster, tmp_path):
    """Prometheus's token with a policy for another namespace: read-job in llm is missing."""
    token = _setup(cluster)
    cluster.apply_policy("prometheus", PROMETHEUS.replace('"llm"', '"other"'))
    prom = cluster.create_token(["prometheus"], name="prometheus")
    got = _doctor(_server_yaml(tmp_path, cluster, token), "--prometheus-token", prom)
    assert got.exit_code == 1
    assert any("Prometheus's token: no read-job in namespace 'llm'" in ln
               for ln in _lines(got, "missing"))


def test_doctor_reads_policies_as_the_fake_enforces_them(cluster, tmp_path):
    """Where doctor says the host-volume grant is missing, the fake refuses the register;
    where it says present, the register passes (the two readings of one policy agree)."""
    import httpx

    job = msgspec.json.decode((ROOT / "jobspecs" / "llmgw-nomic-embed-text.json").read_bytes())
    job = job.get("Job", job)
    for policy, present in ((POLICY, True),
                            (POLICY.replace('capabilities = ["mount-readwrite"]',
                                            'policy = "read"'), False)):
        name = f"p{int(present)}"
        cluster.apply_policy(name, policy)
        token = cluster.create_token([name], name=name)
        got = _doctor(_server_yaml(tmp_path, cluster, token))
        said = any("mount-readwrite on host volume" in ln for ln in _lines(got, "ok"))
        r = httpx.post(f"{cluster.address}/v1/jobs", json={"Job": job},
                       headers={"X-Nomad-Token": token})
        assert (said, r.status_code == 200) == (present, present), (got.output, r.text)


async def test_the_readme_steps_end_with_doctor_green_and_a_model_serving(tmp_path):
    """README "A production cluster": the policy applied by the command its file documents,
    a token holding it, clients whose cache is owned by the fetch user; doctor is green,
    then the first model's replica is placed, fetches, runs and serves."""
    from .conftest import applied, catalog, config, cpu_model, eventually, make_backend
    from .test_acl_policy import POLICY_FILE, documented_apply

    with FakeNomad(default_fleet(), acl_token="root", namespaces=("default", "llm"),
                   image_users={"ghcr.io/llmgw/llmgw:0.1.0": 10001}) as fake:
        name, flags = documented_apply()
        fake.apply_policy(name, POLICY_FILE.read_text(), **flags)
        token = fake.create_token([name], name="llmgw")
        got = _doctor(_server_yaml(tmp_path, fake, token))
        assert got.exit_code == 0, got.output
        m = cpu_model("embed")
        backend = make_backend(fake, cfg=config(fake, [m], namespace="llm", token=token))
        await backend.start()
        try:
            await applied(backend, catalog(m))
            fake.settle()
            [a] = fake.allocations("llmgw-embed", namespace="llm")
            assert a.client_status == "running"
            fake.set_check(a.id, "success")
            await eventually(lambda: backend.endpoints("embed"), what="a healthy endpoint")
            assert backend.status("embed").refused is None
        finally:
            await backend.close()
