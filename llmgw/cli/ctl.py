"""``llmgw ctl``: operate a running llmgw through its control API."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

import click

from llmgw.catalog.decode import decode_model_file, decode_value, to_builtins
from llmgw.catalog.units import Size
from llmgw.cli.client import ApiClient, pass_client
from llmgw.cli.output import failures, output_option, print_json, print_table
from llmgw.errors import DefinitionError


@click.group()
@click.option("--url", envvar="LLMGW_URL", default="http://127.0.0.1:8080", show_default=True,
              help="Base URL of the llmgw API (env LLMGW_URL).")
@click.option("--token", envvar="LLMGW_ADMIN_TOKEN", default=None,
              help="Admin token (env LLMGW_ADMIN_TOKEN).")
@click.pass_context
def ctl(ctx: click.Context, url: str, token: str | None) -> None:
    """Operate a running llmgw through its API."""
    ctx.obj = ApiClient(url, token)
    ctx.call_on_close(ctx.obj.close)


@click.group()
def model() -> None:
    """List, show, add and remove models."""


def _scaling_text(s: dict[str, Any]) -> str:
    if s.get("min", 1) == 0:
        return f"on demand (max {s.get('max')}, idle {s.get('idle_timeout', '15m')})"
    return f"{s.get('min', 1)} (max {s.get('max')})"


def _status_text(m: dict[str, Any]) -> str:
    st = m.get("status") or {}
    if m.get("external"):
        return "external"
    parts = [f"{st.get('ready', 0)}/{st.get('desired', 0)} ready"]
    if st.get("shortfall"):       # the reason it is short, waiting or crash loop included
        parts.append(st["shortfall"])
    elif st.get("waiting_for_capacity"):
        parts.append(f"waiting for capacity: {st['waiting_for_capacity']}")
    elif st.get("crash_loop"):
        parts.append("crash loop")
    if st.get("deployment_failed"):
        parts.append("deployment failed")
    if st.get("refused"):
        parts.append("refused by Nomad's ACL")
    if m.get("stale_replicas"):
        parts.append(f"{m['stale_replicas']} stale profile")
    if m.get("memory_warnings"):
        parts.append("memory warning")
    return "; ".join(parts)


@model.command("list")
@output_option
@pass_client
def model_list(client: ApiClient, output: str) -> None:
    """List the models in force, declared and runtime."""
    with failures():
        models = client.get("/api/v1/models")
    if output == "json":
        print_json(models)
        return
    rows = [
        (m["name"], m["origin"], m.get("added_by") or "-", _scaling_text(m["scaling"]),
         _status_text(m))
        for m in models
    ]
    print_table(rows, ["name", "origin", "added by", "scaling", "status"])


@model.command("show")
@click.argument("name")
@output_option
@pass_client
def model_show(client: ApiClient, name: str, output: str) -> None:
    """Show one model: its definition, origin, scaling in force and status."""
    with failures():
        m = client.get(f"/api/v1/models/{name}")
    if output == "json":
        print_json(m)
        return
    click.echo(f"name:      {m['name']}")
    origin = m["origin"]
    if m.get("added_by"):
        origin += f" (added by {m['added_by']} at {m['added_at']})"
    click.echo(f"origin:    {origin}")
    click.echo(f"scaling:   {_scaling_text(m['scaling'])}")
    click.echo(f"status:    {_status_text(m)}")
    st = m.get("status") or {}
    for key in ("last_placement_failure", "last_error", "refused", "prefetch_error"):
        if st.get(key):
            click.echo(f"{key.replace('_', ' ')}: {st[key]}")
    click.echo("definition:")
    import yaml

    click.echo(yaml.safe_dump(m["definition"], sort_keys=False).rstrip())


@model.command("add")
@click.option("-f", "--file", "path", required=True, type=click.Path(dir_okay=False),
              help="A YAML file holding one model entry, the shape of a models: item.")
@click.option("--skip-source-check", is_flag=True,
              help="Add even if the source cannot be checked now (not recommended).")
@output_option
@pass_client
def model_add(client: ApiClient, path: str, skip_source_check: bool, output: str) -> None:
    """Add a model at runtime (replaces a runtime model of the same name).

    The file is read by the same decoder as server.yaml's models: list, so an
    entry moves between the two by copy and paste. Declared models cannot be
    added again; edit server.yaml instead. A profile whose memory is below
    what one replica needs is added, with a warning on stderr.
    """
    with failures():
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise click.UsageError(f"cannot read {path}: {exc.strerror}") from None
        m = decode_model_file(data, source=path)
        body = to_builtins(m)
        q = "?skip_source_check=true" if skip_source_check else ""
        added = client.post(f"/api/v1/models{q}", json=body)
    if output == "json":
        print_json(added)
    else:
        click.echo(f"added {added['name']}; scaling {_scaling_text(added['scaling'])}")
    for warning in added.get("warnings") or []:
        click.echo(f"warning: {warning}", err=True)


@model.command("remove")
@click.argument("name")
@pass_client
def model_remove(client: ApiClient, name: str) -> None:
    """Remove a model that was added at runtime."""
    with failures():
        client.delete(f"/api/v1/models/{name}")
    click.echo(f"removed {name}")


@model.command("resources")
@click.argument("name")
@click.option("--cpu-cores", type=click.IntRange(min=1), required=True,
              help="Cores reserved per replica; also the engine's thread count.")
@click.option("--memory", required=True, help="Memory reserved per replica, e.g. 24GiB.")
@click.option("--profile", default=None, help="The profile to change (default: the first).")
@output_option
@pass_client
def model_resources(client: ApiClient, name: str, cpu_cores: int, memory: str,
                    profile: str | None, output: str) -> None:
    """Set the CPU cores and memory a stored model's profile reserves."""
    try:
        decode_value(memory, Size, source="--memory")
    except DefinitionError as exc:
        raise click.BadParameter(exc.message.removeprefix("--memory: "),
                                 param_hint="--memory") from None
    with failures():
        m = client.put(f"/api/v1/models/{name}/resources",
                       json={"cpu_cores": cpu_cores, "memory": memory, "profile": profile})
    if output == "json":
        print_json(m)
    else:
        click.echo(f"{name}: profile {m['profile']} now reserves {m['cpu_cores']} cores "
                   f"and {m['memory']}")


@click.command("scale")
@click.argument("name")
@click.option("--min", "min_", type=click.IntRange(min=0), required=True,
              help="Replicas always running. 0 makes the model on demand: the first "
                   "request loads one, and it stops after scaling.idle_timeout idle.")
@click.option("--max", "max_", type=click.IntRange(min=1), default=None,
              help="Most replicas the gateway's scaler may run under load (it aims at "
                   "scaling.target requests per replica, and scales down after "
                   "scaling.scale_down_delay of lower load). Left out, the max in force "
                   "is kept; a --min above it is refused. A model that never had a max "
                   "runs exactly --min replicas.")
@output_option
@pass_client
def scale(client: ApiClient, name: str, min_: int, max_: int | None, output: str) -> None:
    """Change how many replicas a runtime model runs, without a restart.

    Only the scaling block changes; the rest of the stored definition is
    written back untouched. Changing --min keeps the max in force unless
    --max is given too; `llmgw ctl replicas` shows the count the scaler
    chose between the two and why. Models declared in server.yaml are refused: change
    their scaling there, or it reverts on the next restart. The answer is the
    scaling in force, after defaults.
    """
    with failures():
        s = client.put(f"/api/v1/models/{name}/scale", json={"min": min_, "max": max_})
    if output == "json":
        print_json(s)
    else:
        click.echo(f"{name}: scaling {_scaling_text(s)}")


@model.command("prefetch")
@click.argument("name")
@click.option("--nodes", "count", type=click.IntRange(min=1), default=None,
              help="Fetch onto this many nodes the scheduler chooses: ones that could run "
                   "the model and do not hold its weights yet, those with room first "
                   "(default 1).")
@click.option("--node", "nodes", multiple=True, metavar="ID",
              help="Fetch onto this node (name, ID or ID prefix; repeat for more).")
@click.option("--status", "status_only", is_flag=True,
              help="Only show the latest prefetch's progress and the nodes holding the "
                   "weights.")
@output_option
@pass_client
def model_prefetch(client: ApiClient, name: str, count: int | None, nodes: tuple[str, ...],
                   status_only: bool, output: str) -> None:
    """Fetch a model's weights onto nodes ahead of a scale-up.

    A replica placed on a node that holds its weights starts without downloading them,
    and new replicas prefer such nodes. The fetch runs as a Nomad batch job (on the
    embedded scheduler: into this machine's cache); run again with --status to follow
    it. A model whose weights no node can fetch (a Hub model with no mirror, which
    vLLM downloads inside each replica) is refused with the reason.
    """
    if count is not None and nodes:
        raise click.UsageError("give --nodes N or --node ID, not both")
    path = f"/api/v1/models/{quote(name)}/prefetch"
    with failures():
        if status_only:
            answer = client.get(path)
        else:
            body: dict[str, Any] = {"nodes": list(nodes)} if nodes else {"count": count or 1}
            answer = client.post(path, json=body)
    if output == "json":
        print_json(answer)
        return
    print_prefetch(answer)


def print_prefetch(p: dict[str, Any]) -> None:
    if p.get("message"):
        click.echo(f"{p['model']}: {p['message']}")
    if p.get("nodes"):
        print_table([(n["node"], n["state"],
                      f"{n['percent']:.0f}%" if n.get("percent") is not None else "-",
                      n.get("message") or "") for n in p["nodes"]],
                    ["node", "state", "done", "note"])
    warm = p.get("warm") or []
    click.echo(f"nodes holding its weights: {', '.join(warm) if warm else 'none yet'}")
