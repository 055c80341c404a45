"""deploy/prometheus.yml finds every replica and gateway through Nomad's service
discovery, with the token deploy/prometheus-policy.hcl allows, and labels them so an
engine's metrics join llmgw's on ``model``.

No Prometheus runs here. Its Nomad discovery is two reads — ``GET /v1/services``, then
``GET /v1/service/:name`` per service — turned into ``__meta_nomad_*`` labels
(discovery/nomad/nomad.go in prometheus/prometheus, ``refresh``: tags joined by the
separator with one at each end), and ``relabel`` below applies the two relabel actions
the file uses as Prometheus defines them (regex anchored at both ends, source labels
joined with ';', ``replace`` writing ``$1`` only on a match and deleting the label when
the result is empty). They run here against the fake Nomad, on jobs llmgw rendered and
registered, read with the documented policy's token.
"""

from __future__ import annotations

import copy
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import yaml

from llmgw.catalog.build import build_catalog
from llmgw.testing.fake_nomad import FakeNomad, default_fleet

from ..conftest import require_tool
from .conftest import applied, config, cpu_model, gpu_model, make_backend
from .shapes import GPU_CLASSES

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
POLICY_FILE = ROOT / "deploy" / "prometheus-policy.hcl"
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
MANAGEMENT = "management-secret"
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def _job(config: dict[str, Any], name: str) -> dict[str, Any]:
    return next(j for j in config["scrape_configs"] if j["job_name"] == name)


def relabel(labels: dict[str, str], rules: list[dict[str, Any]]) -> dict[str, str] | None:
    """Prometheus's relabelling for keep and replace; None when the target is dropped."""
    out = dict(labels)
    for rule in rules:
        action = rule.get("action", "replace")
        value = rule.get("separator", ";").join(out.get(name, "")
                                                for name in rule.get("source_labels", []))
        match = re.fullmatch(rule.get("regex", "(.*)"), value)
        if action == "keep":
            if match is None:
                return None
        elif action == "replace":
            if match is None:
                continue
            groups = (match.group(0), *match.groups())
            result = re.sub(r"\$\{?(\d+)\}?", lambda g, got=groups: got[int(g.group(1))] or "",
                            rule.get("replacement", "$1"))
            if result:
                out[rule["target_label"]] = result
            else:
                out.pop(rule["target_label"], None)
        else:
            raise AssertionError(f"relabel action {action!r} is not modelled here")
    return {k: v for k, v in out.items() if not k.startswith("__")} | \
        {"__address__": out["__address__"]}


def discover(fake: FakeNomad, token: str, sd: dict[str, Any]) -> list[dict[str, str]]:
    """What Prometheus's Nomad discovery makes of the cluster, read with ``token``."""
    ns = {"namespace": sd["namespace"]}
    sep = sd.get("tag_separator", ",")
    found = []
    with httpx.Client(base_url=fake.address, headers={"X-Nomad-Token": token},
                      timeout=30) as c:
        listed = c.get("/v1/services", params=ns)
        assert listed.status_code == 200, listed.text
        for stub in listed.json():
            for service in stub["Services"]:
                got = c.get(f"/v1/service/{service['ServiceName']}", params=ns)
                assert got.status_code == 200, got.text
                for reg in got.json():
                    labels = {
                        "__address__": f"{reg['Address']}:{reg['Port']}",
                        "__meta_nomad_address": reg["Address"],
                        "__meta_nomad_dc": reg["Datacenter"],
                        "__meta_nomad_node_id": reg["NodeID"],
                        "__meta_nomad_namespace": reg["Namespace"],
                        "__meta_nomad_service": reg["ServiceName"],
                        "__meta_nomad_service_id": reg["ID"],
                        "__meta_nomad_service_port": str(reg["Port"]),
                    }
                    if reg["Tags"]:
                        labels["__meta_nomad_tags"] = sep + sep.join(reg["Tags"]) + sep
                    found.append(labels)
    return found


def _scraped(fake: FakeNomad, token: str, job: str) -> list[dict[str, str]]:
    cfg = _job(PROMETHEUS, job)
    [sd] = cfg["nomad_sd_configs"]
    targets = [relabel(t, cfg["relabel_configs"]) for t in discover(fake, token, sd)]
    return sorted((t for t in targets if t is not None), key=lambda t: t["__address__"])


def _documented_apply() -> tuple[str, str]:
    line = next(ln.lstrip("# ").strip() for ln in POLICY_FILE.read_text().splitlines()
                if "nomad acl policy apply" in ln)
    words = shlex.split(line)
    assert not any(w.startswith("-namespace") or w.startswith("-job") for w in words)
    assert (ROOT / words[-1]).resolve() == POLICY_FILE
    return words[-2], words[-1]


@pytest.fixture
def cluster() -> Iterator[tuple[FakeNomad, str]]:
    """ACLs on, llmgw's namespace named as deploy/prometheus.yml names it, and a
    Prometheus token made as deploy/prometheus-policy.hcl says."""
    namespace = _job(PROMETHEUS, "llmgw-engines")["nomad_sd_configs"][0]["namespace"]
    with FakeNomad(default_fleet(), acl_token=MANAGEMENT,
                   namespaces=("default", namespace)) as fake:
        name, _ = _documented_apply()
        fake.apply_policy(name, POLICY_FILE.read_text())
        yield fake, fake.create_token([name])


def _gateway_and_foreign_jobs(fake: FakeNomad, namespace: str) -> None:
    def job(job_id: str, tags: list[str]) -> dict[str, Any]:
        return {"ID": job_id, "Namespace": namespace, "Datacenters": ["dc1"], "TaskGroups": [{
            "Name": "g", "Count": 1,
            "Networks": [{"Mode": "host", "DynamicPorts": [{"Label": "http"}]}],
            "Tasks": [{"Name": "t", "Driver": "docker", "Config": {"image": "x"},
                       "Resources": {"CPU": 100, "MemoryMB": 64},
                       "Services": [{"Name": job_id, "Provider": "nomad",
                                     "PortLabel": "http", "Tags": tags}]}]}]}
    with httpx.Client(base_url=fake.address, headers={"X-Nomad-Token": MANAGEMENT}) as c:
        for body in (job("llmgw", ["llmgw-gateway"]), job("reports", ["web"])):
            assert c.post("/v1/jobs", json={"Job": body}).status_code == 200
    fake.settle()


async def test_every_replica_is_scraped_with_the_labels_that_join_llmgws(cluster):
    """Each replica llmgw registered becomes one target on its engine's address, labelled
    model (the catalog name llmgw's metrics use), profile, gpu_class (GPU profiles only),
    alloc, node_id and datacenter; other services in the namespace are not scraped."""
    fake, token = cluster
    namespace = _job(PROMETHEUS, "llmgw-engines")["nomad_sd_configs"][0]["namespace"]
    gpu, cpu = gpu_model("qwen", gpus=2, min_=2), cpu_model("embed")
    backend = make_backend(fake, cfg=config(fake, namespace=namespace, token=MANAGEMENT))
    await backend.start()
    try:
        await applied(backend, build_catalog([gpu, cpu], GPU_CLASSES))
    finally:
        await backend.close()
    fake.settle()
    _gateway_and_foreign_jobs(fake, namespace)

    targets = _scraped(fake, token, "llmgw-engines")
    allocs = {a.id: a for m in ("qwen", "embed")
              for a in fake.allocations(f"llmgw-{m}", namespace=namespace)}
    assert len(targets) == 3
    assert {t["alloc"] for t in targets} == set(allocs)
    for t in targets:
        a = allocs[t["alloc"]]
        reg = next(s for s in fake.services() if s.alloc_id == a.id)
        assert t["__address__"] == f"{reg.address}:{reg.port}"
        assert (t["node_id"], t["datacenter"]) == (a.node_id, "dc1")
        assert UUID.match(t["alloc"])
    by_model = {t["model"]: t for t in targets}
    assert {k: by_model["qwen"][k] for k in ("model", "profile", "gpu_class")} == {
        "model": "qwen", "profile": "h100", "gpu_class": "h100-80g"}
    assert (by_model["embed"]["profile"], "gpu_class" in by_model["embed"]) == ("cpu", False)
    assert "fingerprint" not in by_model["qwen"]   # a label that would change with each edit

    [gateway] = _scraped(fake, token, "llmgw-gateway")
    assert "model" not in gateway   # the gateway's own series carry model
    assert UUID.match(gateway["alloc"])


def test_the_token_reads_services_and_nothing_it_could_change(cluster):
    """The documented policy lets Prometheus list and read services; submitting,
    scaling or stopping a job is refused."""
    fake, token = cluster
    namespace = _job(PROMETHEUS, "llmgw-engines")["nomad_sd_configs"][0]["namespace"]
    with httpx.Client(base_url=fake.address, headers={"X-Nomad-Token": token}) as c:
        assert c.get("/v1/services", params={"namespace": namespace}).status_code == 200
        job = {"ID": "sneaky", "Namespace": namespace, "TaskGroups": []}
        assert c.post("/v1/jobs", json={"Job": job}).status_code == 403
        assert c.delete("/v1/job/llmgw-qwen", params={"namespace": namespace}
                        ).status_code == 403
    with httpx.Client(base_url=fake.address, headers={"X-Nomad-Token": fake.create_token([])}
                      ) as c:
        assert c.get("/v1/services", params={"namespace": namespace}).status_code == 403


def test_the_dev_setup_labels_replicas_the_same_way_and_scrapes_llmgw_where_it_listens():
    """docker-compose.yml's Prometheus relabels replicas exactly as deploy/prometheus.yml
    does, asks the dev agent llmgw uses, and scrapes the gateway at its listen port."""
    dev = yaml.safe_load(COMPOSE["configs"]["prometheus-dev"]["content"])
    server = yaml.safe_load(COMPOSE["configs"]["llmgw-server"]["content"])
    env = COMPOSE["services"]["llmgw"]["environment"]
    engines = _job(dev, "llmgw-engines")
    assert engines["relabel_configs"] == _job(PROMETHEUS, "llmgw-engines")["relabel_configs"]
    [sd] = engines["nomad_sd_configs"]
    assert (sd["server"], sd["namespace"]) == (env["NOMAD_ADDR"],
                                              server["scheduler"]["nomad"]["namespace"])
    port = server["listen"].rsplit(":", 1)[1]
    assert _job(dev, "llmgw-gateway")["static_configs"] == [{"targets": [f"127.0.0.1:{port}"]}]
    grafana = COMPOSE["services"]["grafana"]
    assert "./deploy/grafana/llmgw.json:/var/lib/grafana/dashboards/llmgw.json:ro" in \
        grafana["volumes"]


# A nomad_sd_configs entry's own fields (discovery/nomad/nomad.go in prometheus/prometheus,
# SDConfig); everything else in it is the inlined HTTP client configuration (token, TLS),
# which a scrape job inlines too.
NOMAD_SD_FIELDS = {"server", "namespace", "region", "refresh_interval", "allow_stale",
                   "tag_separator"}


def _without_nomad_discovery(cfg: dict[str, Any], files: Path) -> dict[str, Any]:
    """deploy/prometheus.yml as Debian's promtool can check it: each job's Nomad discovery
    becomes a static target at the server's address with the discovery's HTTP client
    settings on the job, and every file it names is an empty file under ``files``."""
    out = copy.deepcopy(cfg)
    for job in out["scrape_configs"]:
        sds = job.pop("nomad_sd_configs", None)
        if sds is None:
            continue
        [sd] = sds
        unknown = {k for k in sd if k not in NOMAD_SD_FIELDS} - {
            "authorization", "tls_config", "basic_auth", "oauth2", "proxy_url",
            "follow_redirects", "enable_http2", "http_headers", "no_proxy",
            "proxy_from_environment", "proxy_connect_header"}
        assert not unknown, (job["job_name"], unknown)
        job.update({k: v for k, v in sd.items() if k not in NOMAD_SD_FIELDS})
        job["static_configs"] = [{"targets": [urlsplit(sd["server"]).netloc]}]

    def relocate(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: (str(files / Path(v).name) if k.endswith("_file") and k != "rule_files"
                        and isinstance(v, str) else relocate(v)) for k, v in node.items()}
        if isinstance(node, list):
            return [relocate(v) for v in node]
        return node

    out = relocate(out)
    files.mkdir(exist_ok=True)
    for job in out["scrape_configs"]:
        for name in (job.get("authorization", {}).get("credentials_file"),
                     *job.get("tls_config", {}).values()):
            if isinstance(name, str):
                Path(name).touch()
    return out


def test_the_scrape_config_passes_promtool_with_nomad_discovery_set_aside(tmp_path: Path):
    """Debian's promtool has no Nomad discovery, so each nomad_sd_configs entry is checked in
    halves: its own fields against those Prometheus's SDConfig reads, and its token and TLS
    settings by promtool on a job with a static target. The rest of the file, the rule
    files it loads beside it included, promtool checks as written."""
    promtool = require_tool("promtool", "apt-get install prometheus (Debian's, as .ci/run)")
    checked = _without_nomad_discovery(PROMETHEUS, tmp_path / "files")
    for name in PROMETHEUS["rule_files"]:
        shutil.copy(ROOT / "deploy" / name, tmp_path / name)
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(checked))
    done = subprocess.run([promtool, "check", "config", "prometheus.yml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout
    assert re.search(r"SUCCESS: \d+ rules found", done.stdout), done.stdout


def test_promtool_would_catch_a_client_certificate_without_its_key(tmp_path: Path):
    """The check above is not a formality: a discovery that presents a certificate without
    its key (so Prometheus could never answer verify_https_client) fails it."""
    promtool = require_tool("promtool", "apt-get install prometheus (Debian's, as .ci/run)")
    broken = copy.deepcopy(PROMETHEUS)
    broken.pop("rule_files")
    for job in broken["scrape_configs"]:
        for sd in job.get("nomad_sd_configs", []):
            sd["tls_config"] = {k: v for k, v in sd["tls_config"].items() if k != "key_file"}
    (tmp_path / "prometheus.yml").write_text(
        yaml.safe_dump(_without_nomad_discovery(broken, tmp_path / "files")))
    done = subprocess.run([promtool, "check", "config", "prometheus.yml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode != 0
    assert "key" in (done.stdout + done.stderr).lower()
