"""docker-compose.yml and nomad/*.hcl agree with each other and with llmgw's configuration.

No Docker engine or Nomad binary runs here, so this checks what can be
checked without them: the compose file parses, its services, ports, volumes
and connection strings line up, the embedded llmgw configuration loads and
renders, and the agent configurations offer what the rendered jobs ask for.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from llmgw.catalog.build import build_catalog
from llmgw.config import ServerConfig, load_config
from llmgw.scheduler.nomad.render import static_jobs

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
DEV = (ROOT / "nomad" / "dev.hcl").read_text()


def _host_volumes(hcl: str) -> dict[str, str]:
    blocks = re.findall(r'host_volume\s+"([^"]+)"\s*\{([^}]*)\}', hcl)
    return {name: re.search(r'path\s*=\s*"([^"]+)"', body).group(1) for name, body in blocks}


def _meta_keys(hcl: str) -> set[str]:
    block = re.search(r"\bmeta\s*\{([^}]*)\}", hcl)
    return set(re.findall(r"^\s*(\w+)\s*=", block.group(1), re.M)) if block else set()


@pytest.fixture(scope="module")
def server_config(tmp_path_factory: pytest.TempPathFactory) -> ServerConfig:
    path = tmp_path_factory.mktemp("compose") / "server.yaml"
    path.write_text(COMPOSE["configs"]["llmgw-server"]["content"])
    env = COMPOSE["services"]["llmgw"]["environment"]
    return load_config(path, env={k: str(v) for k, v in env.items()})


def test_compose_runs_postgres_and_llmgw_and_leaves_nomad_to_the_host():
    """Two services by default, llmgw after a healthy Postgres (Prometheus and Grafana
    only with the observability profile); no Nomad container, since a Nomad client
    needs the host's cgroups, network and Docker daemon."""
    services = COMPOSE["services"]
    assert {name for name, s in services.items() if not s.get("profiles")} == \
        {"postgres", "llmgw"}
    assert {name for name, s in services.items() if s.get("profiles")} == \
        {"prometheus", "grafana"}
    assert services["llmgw"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    assert services["postgres"]["healthcheck"]["test"]
    assert "nomad agent -dev -config nomad/dev.hcl" in (ROOT / "docker-compose.yml").read_text()


def test_llmgw_reaches_postgres_through_the_port_compose_publishes(server_config: ServerConfig):
    """llmgw on the host network reaches Postgres at the loopback port it is published on,
    as the user and database compose creates."""
    url = urlsplit(server_config.database)
    pg = COMPOSE["services"]["postgres"]
    assert COMPOSE["services"]["llmgw"]["network_mode"] == "host"
    assert f"{url.hostname}:{url.port}:5432" in pg["ports"]
    assert url.username == pg["environment"]["POSTGRES_USER"]
    assert url.path.lstrip("/") == pg["environment"]["POSTGRES_DB"]


def test_llmgw_reaches_the_host_agent_on_the_port_dev_hcl_serves(server_config: ServerConfig):
    """NOMAD_ADDR is the host's loopback on the HTTP port of nomad/dev.hcl, which binds
    beyond loopback so replicas register at addresses llmgw can route to."""
    addr = urlsplit(server_config.scheduler.nomad.address)
    http = int(re.search(r"\bhttp\s*=\s*(\d+)", DEV).group(1))
    assert server_config.scheduler.kind == "nomad"
    assert (addr.hostname, addr.port) == ("127.0.0.1", http)
    assert re.search(r'^bind_addr\s*=\s*"0\.0\.0\.0"', DEV, re.M)


def test_the_fetch_tasks_run_the_image_compose_builds(server_config: ServerConfig):
    """The jobs' fetch task image is the llmgw image compose builds from the Dockerfile,
    which the host's Docker (the one Nomad drives) then holds."""
    llmgw = COMPOSE["services"]["llmgw"]
    assert llmgw["build"] == "."
    assert server_config.scheduler.nomad.fetcher_image == llmgw["image"]


def test_the_jobs_llmgw_renders_find_what_the_dev_agent_offers(server_config: ServerConfig):
    """The cache volume the jobs claim and the fabric meta key exist on the dev client."""
    nomad_cfg = server_config.scheduler.nomad
    assert nomad_cfg.cache_volume in _host_volumes(DEV)
    assert nomad_cfg.fabric_meta_key in _meta_keys(DEV)
    jobs = static_jobs(build_catalog(server_config.models, server_config.gpu_classes),
                       nomad_cfg, server_config.mirror)
    assert jobs, "the compose configuration should schedule at least one model"
    for job in jobs:
        assert job.Namespace == "default"        # the only namespace a dev agent has
        assert job.Datacenters == [re.search(r'datacenter\s*=\s*"([^"]+)"', DEV).group(1)]
        (volume,) = job.TaskGroups[0].Volumes.values()
        assert volume.Source == nomad_cfg.cache_volume
        for c in job.TaskGroups[0].Constraints:   # e.g. CPU models keep off GPU nodes
            if c.Operand == "is_not_set" and c.LTarget.startswith("${meta."):
                assert c.LTarget[len("${meta."):-1] not in _meta_keys(DEV), job.ID


def test_llmgw_listens_where_the_instructions_curl(server_config: ServerConfig):
    """On the host network, the port llmgw listens on is the one the comment curls, with
    the admin token compose gives it."""
    port = server_config.listen.rsplit(":", 1)[1]
    text = (ROOT / "docker-compose.yml").read_text()
    token = COMPOSE["services"]["llmgw"]["environment"]["LLMGW_ADMIN_TOKENS"].split("=")[1]
    assert f"Bearer {token}\" localhost:{port}/" in text


def test_production_clients_carry_the_plugin_volume_and_meta_llmgw_needs():
    """GPU clients load the NVIDIA plugin; every client has the cache and the meta keys."""
    gpu = (ROOT / "nomad" / "client-gpu.hcl").read_text()
    cpu = (ROOT / "nomad" / "client-cpu.hcl").read_text()
    assert 'plugin "nomad-device-nvidia"' in gpu
    assert "nvidia_runtime" in gpu
    assert {"llmgw_fabric", "llmgw_gpu_class"} <= _meta_keys(gpu)
    assert "llmgw_gpu_class" not in _meta_keys(cpu)     # it marks GPU nodes
    for hcl in (gpu, cpu):
        assert "llmgw-model-cache" in _host_volumes(hcl)
    policy = (ROOT / "nomad" / "llmgw-policy.hcl").read_text()
    for capability in ("submit-job", "read-job", "scale-job"):
        assert capability in policy
    assert not any(p.suffix == ".py" for p in (ROOT / "nomad").iterdir())


def test_production_clients_enable_acls_and_load_the_shipped_tls_block():
    """Each client config turns ACLs on; nomad/tls.hcl (loaded beside it) turns TLS on for
    HTTP and RPC, verifies the servers' hostname, and trusts the servers' CA."""
    server = (ROOT / "nomad" / "server.hcl").read_text()
    tls = (ROOT / "nomad" / "tls.hcl").read_text()
    for name in ("client-gpu.hcl", "client-cpu.hcl"):
        hcl = (ROOT / "nomad" / name).read_text()
        assert re.search(r"\bacl\s*\{\s*enabled\s*=\s*true\s*\}", hcl), name
        assert "tls.hcl" in hcl, f"{name} should say where its TLS block is"
    block = re.search(r"\btls\s*\{([^}]*)\}", tls).group(1)
    settings = dict(re.findall(r"^\s*(\w+)\s*=\s*(\S+)", block, re.M))
    assert settings["http"] == settings["rpc"] == "true"
    assert settings["verify_server_hostname"] == "true"
    server_ca = re.search(r'ca_file\s*=\s*("[^"]+")', server).group(1)
    assert settings["ca_file"] == server_ca
