"""docker-compose.yml and nomad/*.hcl agree with each other and with llmgw's configuration.

No Docker engine or Nomad binary runs here, so this checks what can be
checked without them: the compose file parses, its services, ports, volumes
and connection strings line up, the embedded llmgw configuration loads and
renders, the agent configurations offer what the rendered jobs ask for, and
every HTTP caller of the production servers (llmgw, Prometheus, an operator's
CLI) meets the servers' TLS settings.
"""

from __future__ import annotations

import itertools
import re
import shlex
from pathlib import Path, PurePosixPath
from typing import NamedTuple
from urllib.parse import urlsplit

import pytest
import yaml

from llmgw.catalog.build import build_catalog
from llmgw.config import ServerConfig, load_config
from llmgw.scheduler.nomad.render import static_jobs

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
DEV = (ROOT / "nomad" / "dev.hcl").read_text()
README = (ROOT / "README.md").read_text()


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


# ---- TLS: the agents, and every HTTP caller of the servers ------------------------

def tls_settings(name: str) -> dict[str, str]:
    """The ``key = value`` lines of the ``tls`` block of nomad/<name>, comments dropped,
    quotes removed (the block holds no nested block)."""
    hcl = re.sub(r"#[^\n]*", "", (ROOT / "nomad" / name).read_text())
    block = re.search(r"^tls\s*\{([^}]*)\}", hcl, re.M)
    assert block, f"nomad/{name} has no tls block"
    return {k: v.strip('"') for k, v in re.findall(r"^\s*(\w+)\s*=\s*(\S+)", block.group(1),
                                                    re.M)}


def _production_steps() -> str:
    return README.split("\n### A production cluster", 1)[1].split("\n## ", 1)[0]


def _documented_command(prefix: str) -> tuple[list[str], str]:
    """The words of the README's production command starting with ``prefix``, and its
    comment (what the files it writes are installed as)."""
    for line in _production_steps().splitlines():
        command, _, comment = line.strip().partition("#")
        if command.startswith(prefix + " ") or command.strip() == prefix:
            return shlex.split(command), comment.strip()
    raise AssertionError(f"the README's production steps do not run `{prefix}`")


def server_certificate_names() -> set[str]:
    """The names the servers' certificate holds, made as the README makes it: the role's
    name server.<region>.<domain>, localhost and 127.0.0.1, and each -additional-dnsname
    and -additional-ipaddress (command/tls_cert_create.go, recordPreparation)."""
    words, _ = _documented_command("nomad tls cert create -server")
    flags: dict[str, list[str]] = {}
    for flag, value in itertools.pairwise(words):
        if flag.startswith("-") and not value.startswith("-"):
            flags.setdefault(flag.lstrip("-"), []).append(value)
    region = flags.get("region", ["global"])[0]
    domain = flags.get("domain", ["nomad"])[0]
    return {f"server.{region}.{domain}", "localhost", "127.0.0.1",
            *flags.get("additional-dnsname", []), *flags.get("additional-ipaddress", [])}


def installed_as(prefix: str) -> list[str]:
    """The file names the README's comment on command ``prefix`` installs its output as
    (what follows the arrow: ``written.pem → installed.pem``)."""
    _, comment = _documented_command(prefix)
    return re.findall(r"[\w.-]+\.pem", comment.rpartition("→")[2])


class Caller(NamedTuple):
    """One HTTP caller of the servers, as its configuration or instructions set it up."""

    who: str
    address: str
    ca: str | None
    cert: str | None
    key: str | None


def http_callers() -> list[Caller]:
    """llmgw as examples/server.yaml configures it, Prometheus's Nomad discovery (and any
    scrape of Nomad's own /v1/metrics) in deploy/prometheus.yml, and the operator's CLI
    as the README's production steps export its NOMAD_* variables."""
    nomad = load_config(ROOT / "examples" / "server.yaml", env={}).scheduler.nomad
    callers = [Caller("llmgw (examples/server.yaml)", nomad.address, nomad.ca_cert,
                      nomad.client_cert, nomad.client_key)]
    prometheus = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    for job in prometheus["scrape_configs"]:
        for sd in job.get("nomad_sd_configs", []):
            tls = sd.get("tls_config", {})
            callers.append(Caller(f"Prometheus job {job['job_name']} (nomad_sd_configs)",
                                  sd["server"], tls.get("ca_file"), tls.get("cert_file"),
                                  tls.get("key_file")))
        if job.get("metrics_path", "").startswith("/v1/metrics"):
            tls = job.get("tls_config", {})
            callers.extend(Caller(f"Prometheus job {job['job_name']}",
                                  f"{job.get('scheme', 'http')}://{target}", tls.get("ca_file"),
                                  tls.get("cert_file"), tls.get("key_file"))
                           for static in job.get("static_configs", [])
                           for target in static["targets"])
    env = dict(re.findall(r"^\s*export (NOMAD_\w+)=(\S+)", _production_steps(), re.M))
    assert "NOMAD_ADDR" in env, "the README's production steps should set up the CLI"
    callers.append(Caller("the nomad CLI (README)", env["NOMAD_ADDR"], env.get("NOMAD_CACERT"),
                          env.get("NOMAD_CLIENT_CERT"), env.get("NOMAD_CLIENT_KEY")))
    return callers


def test_servers_and_clients_verify_each_others_certificates_on_rpc():
    """Servers and client agents speak TLS on HTTP and RPC with one CA, each checks that its
    RPC peer holds a server certificate of the region (verify_server_hostname: on a server
    it also refuses Raft from anything else, nomad/rpc.go validateRaftTLS), and neither is
    left in rpc_upgrade_mode, which accepts plaintext RPC and skips that check."""
    server, client = tls_settings("server.hcl"), tls_settings("tls.hcl")
    for name, settings in (("server.hcl", server), ("tls.hcl", client)):
        assert settings["http"] == settings["rpc"] == "true", name
        assert settings.get("verify_server_hostname") == "true", name
        assert settings.get("rpc_upgrade_mode", "false") == "false", name
        assert {"ca_file", "cert_file", "key_file"} <= set(settings), name
    assert server["ca_file"] == client["ca_file"]


def test_every_http_caller_of_the_servers_meets_their_tls():
    """The servers serve HTTPS and verify clients (verify_https_client: Go's
    RequireAndVerifyClientCert against ca_file, helper/tlsutil/config.go
    IncomingTLSConfig), so llmgw, Prometheus and the CLI each use https to a host the
    servers' certificate names, trust the servers' CA file, and present the certificate
    and key the README makes for HTTP callers from that CA."""
    server = tls_settings("server.hcl")
    assert server["http"] == "true"
    names = server_certificate_names()
    [ca_name] = installed_as("nomad tls ca create")
    cert_name, key_name = installed_as("nomad tls cert create -cli")
    assert PurePosixPath(server["ca_file"]).name == ca_name
    assert key_name == cert_name.removesuffix(".pem") + "-key.pem"
    callers = http_callers()
    assert len(callers) >= 5   # llmgw, three Prometheus jobs, the CLI
    for c in callers:
        url = urlsplit(c.address)
        assert url.scheme == "https", c
        assert url.hostname in names, (c, f"the servers' certificate names only {names}")
        assert c.ca is not None, (c, "an https caller needs the servers' CA")
        ca = PurePosixPath(c.ca)
        assert ca.name == ca_name, c
        if server.get("verify_https_client") == "true":
            assert c.cert is not None, (c, "the servers refuse a caller without a certificate")
            assert c.key is not None, (c, "a certificate is presented with its key")
            cert, key = PurePosixPath(c.cert), PurePosixPath(c.key)
            assert (cert.name, key.name) == (cert_name, key_name), c
            assert cert.parent == key.parent == ca.parent, c


def test_http_callers_use_a_cli_certificate_not_an_agents():
    """An agent's certificate (-client or -server) would let its holder pose as a Nomad
    agent on RPC; HTTP callers get the -cli one, which is only ever a caller."""
    words, _ = _documented_command("nomad tls cert create -cli")
    assert words == ["nomad", "tls", "cert", "create", "-cli"]
    agent_files = {*installed_as("nomad tls cert create -server"),
                   *installed_as("nomad tls cert create -client")}
    assert agent_files == {PurePosixPath(tls_settings(n)[k]).name
                           for n in ("server.hcl", "tls.hcl") for k in ("cert_file", "key_file")}
    for c in http_callers():
        assert PurePosixPath(c.cert or "").name not in agent_files, c
