"""``llmgw jobspec render``: the Nomad jobs of a configuration, without a server.

It needs no server and no Nomad: it renders the jobs of a configuration file
exactly as the Nomad backend would register them (first profile,
``scaling.min`` replicas), which is how ``jobspecs/`` is produced and how an
operator reads what llmgw would submit.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from llmgw.cli.output import failures, print_json


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
    from llmgw.scheduler.nomad.jobui import Links
    from llmgw.scheduler.nomad.render import static_jobs

    with failures():
        cfg = load_config(config_path)
        # Rendered for Nomad whatever the file's scheduler, so Nomad's rules apply.
        catalog = build_catalog(cfg.models, cfg.gpu_classes,
                                Runtime(scheduler="nomad", mirror=cfg.mirror),
                                adapters=cfg.adapters)
        if model is not None:
            m = catalog.get(model)
            if m is None or m.external:
                known = ", ".join(x.name for x in catalog if not x.external) or "none"
                raise NotFoundError(
                    f"{config_path}: no scheduled model {model!r} (scheduled models: {known})")
        jobs = static_jobs(catalog, cfg.scheduler.nomad, cfg.mirror,
                           only=[model] if model else None, links=Links.of(cfg))
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

    from llmgw.scheduler.nomad import jobspec as js

    return json.dumps(js.to_builtins(body), indent=2) + "\n"
