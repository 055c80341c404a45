"""``llmgw keys add|list|revoke``: API keys for the gateway, on the keys file of this host.

These commands edit the file directly (no running server is needed); every
gateway reading the file picks the change up within a second or so. The file
is found from ``--keys-file`` (or ``LLMGW_KEYS_FILE``), else from the
``keys_file`` of ``--config`` (or ``LLMGW_CONFIG``).
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import click

from llmgw.cli.output import failures, output_option, print_json, print_table
from llmgw.errors import ConfigError


def _keys_path(keys_file: str | None, config: str | None) -> Path:
    if keys_file:
        return Path(keys_file)
    if config:
        from llmgw.config import load_config

        cfg = load_config(config)
        if not cfg.keys_file:
            raise ConfigError(f"{config}: keys_file is not set; add `keys_file: /path/keys.json` "
                              "there, or pass --keys-file", field="keys_file")
        return Path(cfg.keys_file)
    raise ConfigError("no keys file given: pass --keys-file PATH (or set LLMGW_KEYS_FILE), or "
                      "--config server.yaml (or LLMGW_CONFIG) to use its keys_file")


_file_options = [
    click.option("--keys-file", envvar="LLMGW_KEYS_FILE", default=None,
                 type=click.Path(dir_okay=False),
                 help="The keys file (env LLMGW_KEYS_FILE)."),
    click.option("--config", "-c", envvar="LLMGW_CONFIG", default=None,
                 type=click.Path(dir_okay=False),
                 help="server.yaml, whose keys_file is used (env LLMGW_CONFIG)."),
]


def _with_file_options(f: click.decorators.FC) -> click.decorators.FC:
    for option in reversed(_file_options):
        f = option(f)
    return f


@click.group()
def keys() -> None:
    """Create, list and revoke the gateway's API keys (on this host's keys file)."""


@keys.command("add")
@click.argument("name")
@click.option("--models", default="", metavar="A,B",
              help="Models the key may use, comma-separated (default: all).")
@click.option("--rpm", type=int, default=None,
              help="Requests per minute allowed to the key (default: no limit).")
@click.option("--priority", type=click.Choice(["interactive", "batch"]), default="interactive",
              show_default=True,
              help="When a model is saturated, queued interactive requests go before batch.")
@_with_file_options
@output_option
def add(name: str, models: str, rpm: int | None, priority: str, keys_file: str | None,
        config: str | None, output: str) -> None:
    """Create a key NAME and print it: the only time it is shown.

    Only its SHA-256 is stored. Clients send it as `Authorization: Bearer KEY`
    (the OpenAI clients' api_key).
    """
    from llmgw.gateway.keys import add_key

    allowed = [m.strip() for m in models.split(",") if m.strip()]
    with failures():
        path = _keys_path(keys_file, config)
        key = add_key(path, name, allowed, rpm, "batch" if priority == "batch" else "interactive")
    if output == "json":
        print_json({"name": name, "key": key, "models": allowed, "rpm": rpm,
                    "priority": priority})
        return
    click.echo(key)
    click.echo(f"key {name!r} added to {path}; store it now, it cannot be shown again",
               err=True)


@keys.command("list")
@_with_file_options
@output_option
def list_(keys_file: str | None, config: str | None, output: str) -> None:
    """List the keys: names, ids, models, limits. Never the keys themselves."""
    from llmgw.gateway.keys import read_keys_file
    from llmgw.tenancy import key_id

    with failures():
        content = read_keys_file(_keys_path(keys_file, config))
    def created(at: datetime | None) -> str | None:
        return at.isoformat() if at else None

    if output == "json":
        print_json([{"name": k.name, "id": key_id(k.sha256), "models": k.models, "rpm": k.rpm,
                     "priority": k.priority, "created_at": created(k.created_at)}
                    for k in content.keys])
        return
    print_table([[k.name, key_id(k.sha256), ",".join(k.models) or "all", k.rpm or "unlimited",
                  k.priority, created(k.created_at)] for k in content.keys],
                ["name", "id", "models", "rpm", "priority", "created"])


@keys.command("revoke")
@click.argument("name")
@_with_file_options
def revoke(name: str, keys_file: str | None, config: str | None) -> None:
    """Remove the key NAME; gateways refuse it once they have reloaded the file."""
    from llmgw.gateway.keys import revoke_key

    with failures():
        path = _keys_path(keys_file, config)
        revoke_key(path, name)
    click.echo(f"key {name!r} revoked in {path}", err=True)
