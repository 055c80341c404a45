"""``llmgw ctl rollout|replicas|fleet``: what runs, where, and replacing it.

These only call the control API, so they work the same against one instance
or a load balancer, and the same whichever scheduler (Nomad or the embedded
one) runs the replicas.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import click

from llmgw.catalog.units import format_size
from llmgw.cli.client import ApiClient, pass_client
from llmgw.cli.output import failures, output_option, print_json, print_table


@click.command("rollout")
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


@click.command("replicas")
@click.argument("name", required=False)
@output_option
@pass_client
def replicas(client: ApiClient, name: str | None, output: str) -> None:
    """List replicas: node, state, phase, health, profile, memory used against reserved.

    A starting replica's phase says where it is: pulling image, fetching weights
    (with the share on disk), loading, healthy.

    "stale profile" marks a replica started with an older definition of its
    profile; `llmgw ctl rollout MODEL` replaces it. Below the table, per model: the
    replicas desired and ready and why that many (the gateway's scaler decides
    between scaling.min and scaling.max from the load), and for each model that
    runs fewer replicas than it should, why (waiting for capacity, a crash loop,
    a failed deployment, a capability Nomad refuses llmgw's token).
    """
    path = "/api/v1/replicas" + (f"?model={quote(name)}" if name else "")
    with failures():
        rows = client.get(path)
        if output == "json":
            print_json(rows)
            return
        models = [client.get(f"/api/v1/models/{quote(name)}")] if name else \
            client.get("/api/v1/models")
    print_table(
        [(r["model"], _short_id(r["id"]), r["node"], r["state"], r.get("phase") or "-",
          "yes" if r["healthy"] else "no", r["profile"], _memory(r), _note(r)) for r in rows],
        ["model", "replica", "node", "state", "phase", "healthy", "profile",
         "memory used/reserved", "note"],
    )
    counts = [_counts(m) for m in models if not m.get("external")]
    if counts:
        click.echo()
        print_table(counts, ["model", "desired", "ready", "min..max", "why"])
    notes = [line for m in models for line in _model_notes(m)]
    if notes:
        click.echo()
        for line in notes:
            click.echo(line)


def _model_notes(m: dict[str, Any]) -> list[str]:
    """What a model's status says about replicas it lacks, one line each."""
    st = m.get("status") or {}
    out = []
    if st.get("shortfall"):
        out.append(f"{m['name']}: {st['shortfall']}")
    if st.get("deployment_failed"):
        out.append(f"{m['name']}: {st['deployment_failed']}")
    if st.get("refused"):
        out.append(f"{m['name']}: Nomad refuses llmgw's token: {st['refused']}")
    if st.get("prefetch_error"):
        out.append(f"{m['name']}: prefetch: {st['prefetch_error']}")
    return out


def _counts(m: dict[str, Any]) -> tuple[str, int, int, str, str]:
    """A model's replica count: what the scheduler runs, and what the scaler asked and why."""
    status, scaling, scaler = m["status"], m["scaling"], m.get("scaler")
    if scaler:
        since = scaler.get("since")
        why = f"scaler ({scaler['kind']}): {scaler['reason']}"
        if since is not None:
            why += f"; count unchanged for {since:.0f}s"
    elif scaling["max"] > max(scaling["min"], 1):
        why = "no decision from the gateway's scaler yet"
    elif scaling["min"] == 0:
        why = "on demand: started by a request, stopped when idle"
    else:
        why = "fixed: scaling.min = scaling.max"
    return (m["name"], status["desired"], status["ready"], f"{scaling['min']}..{scaling['max']}",
            why)


def _short_id(replica_id: str) -> str:
    """Nomad allocation UUIDs shortened as Nomad's own CLI shows them; other ids whole."""
    if len(replica_id) == 36 and replica_id.count("-") == 4:
        return replica_id[:8]
    return replica_id


@click.command("fleet")
@output_option
@pass_client
def fleet(client: ApiClient, output: str) -> None:
    """Show pools (gpu class and fabric) and nodes with their free capacity.

    Free is what Nomad could place now: down, draining and ineligible nodes
    are listed with their state and count nothing free. "weights held" names the
    models whose weights a node's cache holds: their next replica prefers it.
    Configuration the fleet contradicts — a gpu class declaring more memory than its cards report,
    which keeps every job off them — is printed below, with the fix.
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
          f"{format_size(n['memory_free'])}/{format_size(n['memory_total'])}",
          ", ".join(n.get("warm") or []) or "-")
         for n in f["nodes"]],
        ["node", "status", "gpu class", "fabric", "gpus free", "cores free", "memory free",
         "weights held"],
    )
    if f.get("warnings"):
        click.echo()
        for line in f["warnings"]:
            click.echo(f"warning: {line}")
