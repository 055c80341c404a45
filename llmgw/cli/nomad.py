"""``llmgw nomad doctor``: check a real cluster before its first model, read-only.

The decisions are ``llmgw.scheduler.nomad.doctor``'s; this module only reads Nomad
through the same client llmgw's server uses (so the same address, token, namespace and
TLS settings) and prints one line per check.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

import click
import msgspec

from llmgw.cli.output import failures

if TYPE_CHECKING:
    from llmgw.config import NomadConfig
    from llmgw.scheduler.nomad import wire
    from llmgw.scheduler.nomad.client import NomadClient
    from llmgw.scheduler.nomad.doctor import Seen, TokenSeen


@click.group("nomad")
def nomad() -> None:
    """Check the Nomad cluster llmgw's configuration points at."""


@nomad.command("doctor")
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False),
              help="The server configuration (server.yaml) whose Nomad settings to check.")
@click.option("--prometheus-token", envvar="PROMETHEUS_NOMAD_TOKEN", default=None,
              help="Also check Prometheus's service-discovery token "
                   "(deploy/prometheus-policy.hcl).")
def doctor(config_path: str, prometheus_token: str | None) -> None:
    """Say, line by line, what the cluster has and lacks for llmgw, with each fix.

    Reads only: who llmgw's token is and what its policies grant against every call
    llmgw makes, each client's cache volume and Docker driver, the GPUs each gpu class
    names, and Prometheus's token when given. Exit status 0 only when nothing needed is
    missing ("warn" lines are things llmgw runs without, with less).
    """
    from llmgw.config import load_config
    from llmgw.scheduler.nomad import doctor as decide
    from llmgw.scheduler.nomad.client import NomadClient

    with failures():
        cfg = load_config(config_path, os.environ)
    nomad_cfg = cfg.scheduler.nomad
    client = NomadClient(nomad_cfg)
    try:
        seen = _read(client, nomad_cfg, prometheus_token)
    finally:
        client.close()
    lines = decide.diagnose(seen, nomad_cfg, cfg.gpu_classes)
    for line in lines:
        click.echo(line.text)
    missing = sum(line.status == "missing" for line in lines)
    click.echo(f"\n{missing} missing" if missing else "\neverything llmgw needs is there")
    sys.exit(decide.exit_code(lines))


def _token(client: NomadClient) -> TokenSeen:
    from llmgw.errors import LlmgwError
    from llmgw.scheduler.nomad.doctor import TokenSeen

    try:
        token = client.token_self()
    except LlmgwError as exc:
        return TokenSeen(error=exc.message)
    rules: list[wire.PolicyRules] = []
    unreadable: dict[str, str] = {}
    if token.Type != "management" and token.AccessorID != "acls-disabled":
        for name in token.Policies or []:
            try:
                policy = client.acl_policy(name)
            except LlmgwError as exc:
                unreadable[name] = exc.message
                continue
            if policy.RulesJSON is not None:
                rules.append(policy.RulesJSON)
    return TokenSeen(token=token, policies=rules, unreadable=unreadable)


def _read(client: NomadClient, cfg: NomadConfig, prometheus_token: str | None) -> Seen:
    from llmgw.errors import LlmgwError
    from llmgw.scheduler.nomad.client import NomadClient
    from llmgw.scheduler.nomad.doctor import Seen

    try:
        client.leader()
    except LlmgwError as exc:
        return Seen(address=cfg.address, reachable=False, error=exc.message)
    llmgw = _token(client)
    nodes: list[wire.Node] = []
    nodes_error = ""
    try:
        nodes = client.nodes()
    except LlmgwError as exc:
        nodes_error = exc.message
    prometheus = None
    if prometheus_token:
        other = NomadClient(msgspec.structs.replace(cfg, token=prometheus_token))
        try:
            prometheus = _token(other)
        finally:
            other.close()
    return Seen(address=cfg.address, reachable=True, llmgw=llmgw, nodes=nodes,
                nodes_error=nodes_error, prometheus=prometheus)
