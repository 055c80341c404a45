"""``llmgw ctl adapter``: list, add and remove LoRA adapters of a running llmgw."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import click

from llmgw.catalog.adapter import Adapter, decode_adapter_file
from llmgw.catalog.decode import convert, to_builtins
from llmgw.cli.client import ApiClient, pass_client
from llmgw.cli.output import failures, output_option, print_json, print_table


@click.group()
def adapter() -> None:
    """List, add and remove LoRA adapters (fine-tunes served on a base model)."""


@adapter.command("list")
@output_option
@pass_client
def adapter_list(client: ApiClient, output: str) -> None:
    """List the adapters in force, declared and runtime, and where each is loaded."""
    with failures():
        adapters = client.get("/api/v1/adapters")
    if output == "json":
        print_json(adapters)
        return
    rows = [(a["name"], a["base"], str(a.get("rank") or "-"), "yes" if a["pinned"] else "no",
             a["origin"], a.get("added_by") or "-", str(len(a.get("loaded_on") or [])))
            for a in adapters]
    print_table(rows, ["name", "base", "rank", "pinned", "origin", "added by", "loaded on"])


@adapter.command("add")
@click.argument("name", required=False)
@click.option("-f", "--file", "path", type=click.Path(dir_okay=False),
              help="A YAML file holding one adapter entry, the shape of an adapters: item.")
@click.option("--base", help="The model the adapter is served on.")
@click.option("--source", help="Where its weights are: a directory (path or mirror URL) "
                               "holding adapter_config.json, or hf://ORG/REPO.")
@click.option("--rank", type=int, help="Its LoRA rank (adapter_config.json's r).")
@click.option("--pinned", is_flag=True, help="Keep it loaded on every replica of the base.")
@click.option("--description", default="")
@click.option("--skip-source-check", is_flag=True,
              help="Add even if the source cannot be checked now (not recommended).")
@output_option
@pass_client
def adapter_add(client: ApiClient, name: str | None, path: str | None, base: str | None,
                source: str | None, rank: int | None, pinned: bool, description: str,
                skip_source_check: bool, output: str) -> None:
    """Add an adapter at runtime (replaces a runtime adapter of the same name).

    Give either a file (``-f``, read by the same decoder as server.yaml's
    ``adapters:`` list) or NAME with ``--base`` and ``--source``. The base's
    replicas are not restarted: the gateway loads the adapter where it is
    asked for.
    """
    with failures():
        if path is not None:
            try:
                data = Path(path).read_bytes()
            except OSError as exc:
                raise click.UsageError(f"cannot read {path}: {exc.strerror}") from None
            entry = decode_adapter_file(data, source=path)
        else:
            if not name or not base or not source:
                raise click.UsageError("give -f FILE, or NAME with --base and --source")
            fields: dict[str, object] = {"name": name, "base": base, "source": source,
                                         "pinned": pinned, "description": description}
            if rank is not None:
                fields["rank"] = rank
            entry = convert(fields, Adapter, source="command line")
        q = "?skip_source_check=true" if skip_source_check else ""
        added = client.post(f"/api/v1/adapters{q}", json=to_builtins(entry))
    if output == "json":
        print_json(added)
    else:
        click.echo(f"added {added['name']} on {added['base']}; loaded where it is asked for")


@adapter.command("remove")
@click.argument("name")
@pass_client
def adapter_remove(client: ApiClient, name: str) -> None:
    """Remove an adapter that was added at runtime; replicas unload it."""
    with failures():
        client.delete(f"/api/v1/adapters/{quote(name, safe='')}")
    click.echo(f"removed {name}")
