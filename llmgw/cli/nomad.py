"""``llmgw ctl rollout|replicas|fleet`` (through the API) and ``llmgw jobspec render`` (local).

The ``ctl`` commands only call the control API, so they work the same against
one instance or a load balancer. ``jobspec render`` needs no server and no
Nomad: it renders the jobs of a configuration file exactly as the Nomad
backend would register them (first profile, ``scaling.min`` replicas), which
is how ``jobspecs/`` is produced and how an operator reads what llmgw would
submit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

import click

from llmgw.catalog.units import format_size
from llmgw.cli.client import ApiClient
from llmgw.cli.ctl import ctl, pass_client
from llmgw.cli.output import failures, output_option, print_json, print_table


@ctl.command("rollout")
@click.argument("name")
@output_option
@pass_client
def rollout(client: ApiClient, name: str, output: str) -> None:
    """Replace a model's replicas with ones running its current profile.

    After a profile is edited, running replicas are left alone and show as
    "stale profile" (replacing a replica that serves costs more than the
    difference). This starts the replacement, one replica at a time.
    """
    with failures():
        answer = client.post(f"/api/v1/models/{quote(name)}/rollout")
    if output == "json":
        print_json(answer)
    else:
        click.echo(answer.get("message") or f"rolling out {name}")


def _memory(r: dict[str, Any]) -> str:
    reserved, measured = r.get("reserved_memory"), r.get("measured_memory")
    if reserved is None and measured is None:
        return "-"
    used = format_size(measured) if measured is not None else "?"
    held = format_size(reserved) if reserved is not None else "?"
    return f"{used} / {held}"


def _note(r: dict[str, Any]) -> str:
    notes = []
    if r.get("stale"):
        notes.append("stale profile")
    if r.get("memory_warning"):
        notes.append(r["memory_warning"])
    if r.get("message"):
        notes.append(r["message"])
    return "; ".join(notes)


@ctl.command("replicas")
@click.argument("name", required=False)
@output_option
@pass_client
def replicas(client: ApiClient, name: str | None, output: str) -> None:
    """List replicas: node, state, health, profile, memory used against reserved.

    "stale profile" marks a replica started with an older definition of its
    profile; `llmgw ctl rollout MODEL` replaces it.
    """
    path = "/api/v1/replicas" + (f"?model={quote(name)}" if name else "")
    with failures():
        rows = client.get(path)
    if output == "json":
        print_json(rows)
        return
    print_table(
        [(r["model"], _short_id(r["id"]), r["node"], r["state"], "yes" if r["healthy"] else "no",
          r["profile"], _memory(r), _note(r)) for r in rows],
        ["model", "replica", "node", "state", "healthy", "profile", "memory used/reserved",
         "note"],
    )


def _short_id(replica_id: str) -> str:
    """Nomad allocation UUIDs shortened as Nomad's own CLI shows them; other ids whole."""
    if len(replica_id) == 36 and replica_id.count("-") == 4:
        return replica_id[:8]
    return replica_id


@ctl.command("fleet")
@output_option
@pass_client
def fleet(client: ApiClient, output: str) -> None:
    """Show pools (gpu class and fabric) and nodes with their free capacity.

    Free is what Nomad could place now: down, draining and ineligible nodes
    are listed with their state and count nothing free.
    """
    with failures():
        f = client.get("/api/v1/fleet")
    if output == "json":
        print_json(f)
        return
    print_table(
        [(p["name"], len(p["nodes"]), f"{p['gpus_free']}/{p['gpus_total']}",
          p["largest_free_gpus_on_a_node"],
          format_size(p["gpu_memory"]) if p.get("gpu_memory") else "-") for p in f["pools"]],
        ["pool", "nodes", "gpus free/total", "most free on a node", "gpu memory"],
    )
    click.echo()
    print_table(
        [(n["name"], n["status"], n.get("gpu_class") or n.get("gpu_device") or "-",
          n.get("fabric") or "-", f"{n['gpus_free']}/{n['gpus_total']}",
          f"{n['cores_free']}/{n['cores_total']}",
          f"{format_size(n['memory_free'])}/{format_size(n['memory_total'])}")
         for n in f["nodes"]],
        ["node", "status", "gpu class", "fabric", "gpus free", "cores free", "memory free"],
    )


@click.group()
def jobspec() -> None:
    """Nomad job specifications, as llmgw renders them."""


@jobspec.command("render")
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False),
              help="The server configuration (server.yaml) whose models to render.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Write one <job>.json per job into this directory instead of printing.")
@click.argument("model", required=False)
def render(config_path: str, out_dir: str | None, model: str | None) -> None:
    """Print the Nomad jobs for the configuration's models as JSON (PUT /v1/jobs bodies).

    Each job uses the model's first profile and scaling.min replicas; the
    running backend instead picks the first profile the fleet can place.
    """
    from llmgw.catalog.build import Runtime, build_catalog
    from llmgw.config import load_config
    from llmgw.errors import NotFoundError
    from llmgw.scheduler.nomad import jobspec as js
    from llmgw.scheduler.nomad.render import static_jobs

    with failures():
        cfg = load_config(config_path)
        # Rendered for Nomad whatever the file's scheduler, so Nomad's rules apply.
        catalog = build_catalog(cfg.models, cfg.gpu_classes,
                                Runtime(scheduler="nomad", mirror=cfg.mirror))
        if model is not None:
            m = catalog.get(model)
            if m is None or m.external:
                known = ", ".join(x.name for x in catalog if not x.external) or "none"
                raise NotFoundError(
                    f"{config_path}: no scheduled model {model!r} (scheduled models: {known})")
        jobs = static_jobs(catalog, cfg.scheduler.nomad, cfg.mirror,
                           only=[model] if model else None)
    bodies = [js.JobRegisterRequest(Job=j) for j in jobs]
    if out_dir is None:
        print_json(js.to_builtins(bodies[0]) if model else [js.to_builtins(b) for b in bodies])
        return
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for body in bodies:
        (out / f"{body.Job.ID}.json").write_text(render_file(body))
        click.echo(out / f"{body.Job.ID}.json")


def render_file(body: Any) -> str:
    """The checked-in form of one job: indented JSON with a final newline."""
    import json

    from llmgw.scheduler.nomad import jobspec as js

    return json.dumps(js.to_builtins(body), indent=2) + "\n"
