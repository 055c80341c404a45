"""``llmgw mirror serve|add|unused|remove`` and ``llmgw fetch``.

The mirror commands run on the mirror host and work on its directory, the
precedent ``llmgw keys`` set for operator tooling that works on files rather
than through the API. ``unused`` and ``remove`` also read the catalog in force
through the control API (``--url``/``LLMGW_URL``, ``--token``/
``LLMGW_ADMIN_TOKEN``, as ``ctl`` does) and refuse to go on without it.
``fetch`` is the prestart task of every scheduled replica.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import click
import msgspec

from llmgw.catalog.source import HfSource, Source
from llmgw.catalog.units import format_size
from llmgw.cli.client import ApiClient
from llmgw.cli.output import failures, output_option, print_json, print_table
from llmgw.weights.fetchlog import LOG_INTERVAL

if TYPE_CHECKING:
    from llmgw.weights.mirror.add import AddResult

_dir_option = click.option(
    "--dir", "mirror_dir", envvar="LLMGW_MIRROR_DIR", default=".", show_default=True,
    type=click.Path(file_okay=False), help="The mirror directory (env LLMGW_MIRROR_DIR).",
)
_mirror_url_option = click.option(
    "--mirror-url", envvar="LLMGW_MIRROR_URL", default=None,
    help="The base URL catalog sources use for this mirror (env LLMGW_MIRROR_URL). Only its "
         "path prefix matters: sources are compared by path, whatever host they spell.",
)
_url_option = click.option(
    "--url", envvar="LLMGW_URL", default="http://127.0.0.1:8080", show_default=True,
    help="Base URL of the llmgw API, to read the catalog (env LLMGW_URL).",
)
_token_option = click.option("--token", envvar="LLMGW_ADMIN_TOKEN", default=None,
                             help="Admin token (env LLMGW_ADMIN_TOKEN).")


@click.group()
def mirror() -> None:
    """Serve the model mirror, add models to it, find and remove unused files."""


@mirror.command("serve")
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.option("--listen", default="127.0.0.1:8070", show_default=True,
              help="HOST:PORT to listen on; 0.0.0.0:8070 to serve the nodes.")
def serve(directory: str, listen: str) -> None:
    """Serve DIRECTORY read-only over HTTP: GET and HEAD with ranges, nothing else.

    Every write method answers 405; a path escaping the directory answers 404.
    Models are put on the mirror with `llmgw mirror add`, on this host.
    """
    import asyncio

    from llmgw.config import split_listen
    from llmgw.weights.mirror.server import MirrorServer, raise_file_limit, serve_forever

    with failures():
        host, port = split_listen(listen)
    raise_file_limit()

    def ready(server: MirrorServer) -> None:
        click.echo(f"serving {server.root} read-only on {server.url}")
        sys.stdout.flush()

    try:
        asyncio.run(serve_forever(directory, host, port, ready))
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {listen}: {exc.strerror}") from None
    except KeyboardInterrupt:
        pass


def _source_hint(source: Source, mirror_url: str | None, result: AddResult) -> str | None:
    if isinstance(source, HfSource):
        return source.text.strip()   # jobs fetch it from the mirror at the path it was put at
    if not mirror_url:
        return None
    base = mirror_url.rstrip("/")
    if len(result.files) == 1:
        return f"{base}/{result.files[0].path}"
    return f"{base}/{result.directory}"


@mirror.command("add")
@click.argument("source")
@click.option("--name", default=None,
              help="Directory name on the mirror for an http(s) source (default: from the "
                   "file name). An hf:// source always goes where Nomad jobs fetch it.")
@click.option("--version", default=None,
              help="Version directory for an http(s) source (required there). An hf:// "
                   "source's version is its revision, or main.")
@click.option("--sha256", default=None, help="The expected sum of an http(s) download.")
@_dir_option
@_mirror_url_option
@output_option
def add(source: str, name: str | None, version: str | None, sha256: str | None,
        mirror_dir: str, mirror_url: str | None, output: str) -> None:
    """Download SOURCE onto the mirror as NAME/VERSION/FILE, checked.

    SOURCE is hf://ORG/REPO[@REVISION] (the whole snapshot), hf://ORG/REPO[@REVISION]/FILE
    or an http(s) URL. A Hub source lands in ORG--REPO/REVISION/ (lower-cased; main
    when no revision is given), which is where Nomad jobs fetch it. The download
    lands under a hidden name and is renamed into place when complete; its length is
    checked against what the source promised and a sha256 is written beside each file.
    An existing version is never replaced.
    """
    from llmgw.catalog.decode import decode_value
    from llmgw.weights.mirror.add import add as add_source

    with failures():
        src = decode_value(source, Source, source="source")
        result = add_source(src, mirror_dir, name=name, version=version, sha256=sha256,
                            progress=sys.stderr.isatty())
    hint = _source_hint(src, mirror_url, result)
    if output == "json":
        print_json({**msgspec.to_builtins(result), "source": hint})
        return
    for f in result.files:
        click.echo(f"{f.sha256}  {f.path}  ({format_size(f.size)})")
    click.echo(f"added {result.directory}"
               + (f" (commit {result.commit})" if result.commit else ""))
    if hint:
        click.echo(f"source for the catalog: {hint}")


def _warn_stale(stale: list[str]) -> None:
    for name in stale:
        click.echo(f"warning: {name} has replicas started from an older definition, whose "
                   f"source may still be fetched; `llmgw ctl rollout {name}` first", err=True)


@mirror.command("unused")
@_dir_option
@_mirror_url_option
@_url_option
@_token_option
@output_option
def unused(mirror_dir: str, mirror_url: str | None, url: str, token: str | None,
           output: str) -> None:
    """List mirror files that no catalog entry uses.

    Refuses when the catalog cannot be read: an unreachable catalog and an empty
    one would both list every file.
    """
    from llmgw.weights.mirror import usage

    with failures(), ApiClient(url, token) as client:
        files, catalog = usage.unused(mirror_dir, client, mirror_url)
    _warn_stale(catalog.stale)
    if output == "json":
        print_json(msgspec.to_builtins(files))
        return
    print_table([(f.path, format_size(f.size)) for f in files], ["path", "size"])
    total = sum(f.size for f in files)
    click.echo(f"{len(files)} unused file(s), {format_size(total)}", err=True)


@mirror.command("remove")
@click.argument("path")
@_dir_option
@_mirror_url_option
@_url_option
@_token_option
def remove(path: str, mirror_dir: str, mirror_url: str | None, url: str,
           token: str | None) -> None:
    """Delete PATH (a file with its .sha256, or a directory) from the mirror.

    Refused while a catalog entry uses it: retire the entry first, since a node
    that must refetch a deleted file cannot.
    """
    from llmgw.weights.mirror import usage

    with failures(), ApiClient(url, token) as client:
        removed = usage.remove(mirror_dir, path, client, mirror_url)
    for rel in removed:
        click.echo(f"removed {rel}")


@click.command("fetch")
@click.argument("url")
@click.argument("dest")
@click.option("--sha256", default=None,
              help="Expected sum; by default the mirror's URL.sha256 (when it has one).")
@click.option("--retries", type=click.IntRange(min=0), default=8, show_default=True,
              help="Attempts without progress before giving up (a resumed transfer that "
                   "makes progress does not count).")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=60.0, show_default=True,
              help="Seconds to wait for the server on each read.")
@click.option("--quiet", "-q", is_flag=True,
              help="No progress bar or progress lines; only the files and the summary.")
@click.option("--progress-file", default=None, type=click.Path(dir_okay=False),
              help="Keep this JSON file current with the bytes fetched, the rate and the "
                   "total (a Nomad job points it into the allocation directory, where the "
                   "control plane reads it).")
@click.option("--log-interval", type=click.FloatRange(min=0.1), default=LOG_INTERVAL,
              show_default=True,
              help="Seconds between two progress lines when no terminal shows a bar (a "
                   "Nomad task's log).")
def fetch(url: str, dest: str, sha256: str | None, retries: int, timeout: float,
          quiet: bool, progress_file: str | None, log_interval: float) -> None:
    """Fetch URL to DEST: resumed, verified, renamed into place (the prestart task).

    A URL ending in '/' is a mirror directory: every file below it is fetched into
    DEST. Two fetches of one file on one node download it once; the second waits.
    Credentials come from LLMGW_FETCH_USERINFO (user:password, percent-encoded as in
    a URL), which a Nomad job sets from its Variable, so none is on the command line.

    Without a terminal (as a Nomad task) it writes a progress line every
    --log-interval seconds, and always a one-line summary at the end; on failure the
    last line says what went wrong and what to do, on stdout and stderr.
    """
    import contextlib
    import os

    from llmgw.redact import redact_url
    from llmgw.weights import cache
    from llmgw.weights.fetch import check_writable, remote_size, with_userinfo
    from llmgw.weights.fetch import fetch as fetch_url
    from llmgw.weights.fetchlog import FetchLog
    from llmgw.weights.mirror.add import ProgressBar

    url = with_userinfo(url, os.environ.get("LLMGW_FETCH_USERINFO"))
    shown = redact_url(url)
    bar = ProgressBar(dest) if sys.stderr.isatty() and not quiet else None
    tracker: cache.ProgressFile | None = None
    try:
        with failures():
            check_writable(dest)   # the cache's owner and this uid, before a byte moves
        with failures(), cache.using(dest):   # a cache sweep leaves this entry alone meanwhile
            lines = bar is None and not quiet
            # The total, from a HEAD or the mirror's listing: only for what shows it.
            size = remote_size(url, timeout) if progress_file or lines else None
            tracker = (cache.ProgressFile(progress_file, shown, dest, size)
                       if progress_file else None)
            log = FetchLog(cache.Meter(shown, dest, size), click.echo, interval=log_interval)
            try:
                with log.running() if lines else contextlib.nullcontext():
                    results = fetch_url(url, dest, sha256=sha256, retries=retries,
                                        timeout=timeout,
                                        notify=lambda m: click.echo(m, err=True),
                                        progress=_both(bar, tracker))
            finally:
                if bar is not None:
                    bar.close()
            if tracker is not None:
                tracker.write(finished=True)
            cache.record_use(dest)
    except click.ClickException as exc:
        # The error goes to stderr as ever; stdout, which the Nomad UI shows first,
        # must not end on a progress line either.
        click.echo(f"failed: {exc.format_message()}")
        if progress_file:
            cache.write_failure(progress_file, shown, exc.format_message(),
                                tracker.meter.read() if tracker is not None else None)
        raise
    for r in results:
        note = "" if r.transferred else "  (already in place)"
        click.echo(f"{r.sha256 or '-'}  {r.path}{note}")
    log.summary(results)


def _both(*callbacks: Any) -> Any:
    """One progress callback calling each given one."""
    live = [c for c in callbacks if c is not None]
    if not live:
        return None
    if len(live) == 1:
        return live[0]

    def call(done: int, total: int | None) -> None:
        for c in live:
            c(done, total)
    return call
