"""``llmgw cache sweep``: account for a node's weight cache and keep it within a bound.

The task of the batch job the Nomad backend submits to sweep its nodes
(``llmgw.scheduler.nomad.render.sweep_job``); it also works by hand on any cache
directory. It prints, and writes to ``--report``, what the cache holds afterwards,
which the control plane reads back to set each node's metadata.
"""

from __future__ import annotations

import click

from llmgw.catalog.units import Size, format_size
from llmgw.cli.output import failures


def _size(_ctx: click.Context, _param: click.Parameter, value: str | None) -> int | None:
    if value is None:
        return None
    from llmgw.catalog.decode import decode_value
    from llmgw.errors import DefinitionError

    try:
        return int(decode_value(value, Size, source="--max-bytes"))
    except DefinitionError as exc:
        raise click.BadParameter(exc.message.removeprefix("--max-bytes: ")) from None


@click.group()
def cache() -> None:
    """The node-local weight cache that `llmgw fetch` fills."""


@cache.command("sweep")
@click.argument("root", type=click.Path(file_okay=False))
@click.option("--max-bytes", callback=_size, default=None,
              help="Remove least-recently-used entries until the cache holds at most this "
                   "much, e.g. 2TiB (default: remove nothing, only report).")
@click.option("--keep", multiple=True,
              help="An entry a running or starting replica uses, by path or tag: never "
                   "removed (repeat).")
@click.option("--since", type=float, default=None,
              help="Unix time: an entry used at or after it is never removed (a replica "
                   "placed after the --keep list was made has used its entry since).")
@click.option("--report", type=click.Path(dir_okay=False), default=None,
              help="Write what the cache holds afterwards here, as JSON.")
def sweep(root: str, max_bytes: int | None, keep: tuple[str, ...], since: float | None,
          report: str | None) -> None:
    """Report the cache under ROOT and evict what is over --max-bytes."""
    from pathlib import Path

    import msgspec

    from llmgw.weights import cache as node_cache

    with failures():
        result = node_cache.sweep(root, max_bytes, keep=keep,
                                  since=since if since is not None else float("inf"))
        if report:
            target = Path(report)
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(target.name + ".tmp")
            tmp.write_bytes(msgspec.json.encode(result))
            tmp.replace(target)
    for e in result.evicted:
        click.echo(f"evicted {e.path} ({format_size(e.size)})")
    bound = f" of {format_size(max_bytes)}" if max_bytes is not None else ""
    click.echo(f"{len(result.entries)} entries, {format_size(result.total)}{bound}")
    if result.kept_over_bound:
        click.echo(f"warning: {format_size(result.kept_over_bound)} over the bound is held by "
                   "replicas that use it", err=True)
