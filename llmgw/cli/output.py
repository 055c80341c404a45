"""Printing results as tables or JSON, and turning errors into exit codes.

Exit codes: 0 on success, 1 when the operation was refused or failed,
2 on usage errors. Every llmgw error carries its own code; this is the one
place that applies it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import click

from llmgw.errors import LlmgwError

F = TypeVar("F", bound=Callable[..., Any])

output_option = click.option(
    "--output", "-o", type=click.Choice(["table", "json"]), default="table",
    show_default=True, help="Print a table for people or JSON for scripts.",
)


def print_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, sort_keys=False, default=str))


def print_table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> None:
    cells = [[("-" if v is None else str(v)) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    click.echo("  ".join(h.upper().ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip())
    for row in cells:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


class Failure(click.ClickException):
    """An llmgw error on its way out of the CLI, with the error's exit code."""

    def __init__(self, err: LlmgwError) -> None:
        super().__init__(err.message)
        self.exit_code = err.exit_code  # type: ignore[misc]  # per instance: the error decides

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.message}", err=True, file=file or sys.stderr)


@contextmanager
def failures() -> Iterator[None]:
    """Turn llmgw errors raised inside the block into a clean message and exit code."""
    try:
        yield
    except LlmgwError as err:
        raise Failure(err) from None
