"""``python -m llmgw`` runs the ``llmgw`` command."""

from llmgw.cli import main

main()
