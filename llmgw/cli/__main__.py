"""``python -m llmgw.cli`` runs the ``llmgw`` command (as tests and Nomad tasks do)."""

from llmgw.cli import main

main()
