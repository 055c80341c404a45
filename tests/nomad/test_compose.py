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


def test_compose_brings_up_postgres_nomad_and_llmgw_in_order():
    """Three services; llmgw waits for a healthy Postgres and a healthy Nomad."""
    services = COMPOSE["services"]
    assert set(services) == {"postgres", "nomad", "llmgw"}
    deps = services["llmgw"]["depends_on"]
    assert deps == {"postgres": {"condition": "service_healthy"},
                    "nomad": {"condition": "service_healthy"}}
    for name in ("postgres", "nomad"):
        assert services[name]["healthcheck"]["test"]


def test_llmgw_reaches_postgres_with_the_database_compose_creates(server_config: ServerConfig):
    """The database URL names the postgres service, its user and its database."""
    url = urlsplit(server_config.database)
    pg = COMPOSE["services"]["postgres"]["environment"]
    assert url.hostname == "postgres"
    assert (url.port or 5432) == 5432
    assert url.username == pg["POSTGRES_USER"]
    assert url.path.lstrip("/") == pg["POSTGRES_DB"]


def test_llmgw_reaches_nomad_on_the_port_the_agent_serves(server_config: ServerConfig):
    """NOMAD_ADDR names the nomad service on the HTTP port of nomad/dev.hcl, also published."""
    addr = urlsplit(server_config.scheduler.nomad.address)
    http = int(re.search(r"\bhttp\s*=\s*(\d+)", DEV).group(1))
    assert server_config.scheduler.kind == "nomad"
    assert addr.hostname == "nomad"
    assert addr.port == http
    assert f"{http}:{http}" in COMPOSE["services"]["nomad"]["ports"]


def test_the_nomad_container_runs_the_dev_config_and_shares_paths_with_docker():
    """The agent loads nomad/dev.hcl; its data dir and cache are mounted at the same path."""
    nomad = COMPOSE["services"]["nomad"]
    mounts = {m.split(":")[1]: m.split(":")[0] for m in nomad["volumes"]}
    config_arg = next(a for a in nomad["command"] if a.startswith("-config="))
    target = config_arg.removeprefix("-config=")
    assert mounts[target] == "./nomad/dev.hcl"
    assert "/var/run/docker.sock" in mounts
    data_dir = re.search(r'data_dir\s*=\s*"([^"]+)"', DEV).group(1)
    assert any(data_dir.startswith(inside) and mounts[inside] == inside for inside in mounts)
    for path in _host_volumes(DEV).values():
        assert mounts.get(path) == path


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


def test_llmgw_listens_on_the_published_port(server_config: ServerConfig):
    """The port llmgw listens on is the one compose publishes."""
    port = server_config.listen.rsplit(":", 1)[1]
    assert f"{port}:{port}" in COMPOSE["services"]["llmgw"]["ports"]


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
