"""The ``llmgw`` command: a thin layer over the app, the API client and the tools.

Each command group lives in its own module; this one only assembles them.
``ctl`` talks to a running llmgw through its API (``--url``/``LLMGW_URL``,
``--token``/``LLMGW_ADMIN_TOKEN``); ``serve``, ``keys``, ``mirror``, ``fetch`` and
``jobspec`` work on this host.
"""

from __future__ import annotations

import importlib

import click

from llmgw import __version__

# (module, attribute) of every command attached to the top-level group.
_COMMANDS = [
    ("llmgw.cli.serve", "serve"),
    ("llmgw.cli.ctl", "ctl"),
    ("llmgw.cli.nomad", "jobspec"),
    ("llmgw.cli.keys", "keys"),
    ("llmgw.cli.mirror", "mirror"),
    ("llmgw.cli.mirror", "fetch"),
]


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="llmgw")
def main() -> None:
    """Serve a catalog of LLMs behind one OpenAI-compatible endpoint."""


for _module, _attr in _COMMANDS:
    main.add_command(getattr(importlib.import_module(_module), _attr))
