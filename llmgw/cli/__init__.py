"""The ``llmgw`` command: a thin layer over the app, the API client and the tools.

Each command lives in the module of its noun; this one only assembles them,
and it is the one place where a command is attached to a group, so the
whole tree reads here. ``ctl`` talks to a running llmgw through its API
(``--url``/``LLMGW_URL``, ``--token``/``LLMGW_ADMIN_TOKEN``); ``serve``, ``keys``,
``mirror``, ``fetch``, ``cache`` and ``jobspec`` work on this host; ``nomad doctor``
reads the Nomad cluster the configuration names.

Command modules import their heavy dependencies inside the commands, so
``llmgw --help`` starts without loading the server.
"""

from __future__ import annotations

import click

from llmgw import __version__
from llmgw.cli import (
    adapters,
    cache,
    ctl,
    jobspec,
    keys,
    mirror,
    nomad,
    plan,
    replicas,
    serve,
    tenants,
)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="llmgw")
def main() -> None:
    """Serve a catalog of LLMs behind one OpenAI-compatible endpoint."""


ctl.model.add_command(plan.plan)
ctl.ctl.add_command(ctl.model)
ctl.ctl.add_command(adapters.adapter)
ctl.ctl.add_command(ctl.scale)
ctl.ctl.add_command(replicas.rollout)
ctl.ctl.add_command(replicas.replicas)
ctl.ctl.add_command(replicas.fleet)
ctl.ctl.add_command(tenants.team)
ctl.ctl.add_command(tenants.key)
ctl.ctl.add_command(tenants.usage)
ctl.ctl.add_command(tenants.costs)

main.add_command(serve.serve)
main.add_command(ctl.ctl)
main.add_command(jobspec.jobspec)
main.add_command(keys.keys)
main.add_command(mirror.mirror)
main.add_command(mirror.fetch)
main.add_command(cache.cache)
main.add_command(nomad.nomad)
