"""``llmgw mirror add SOURCE``: put a model on the mirror, whole and checked.

A mirror is copied to every node, so a partial or corrupt file here is a
partial or corrupt file everywhere, caught (if at all) once per node. So:

- Everything is downloaded under a hidden temporary directory beside the
  final one (``<name>/.<version>.adding-…``), which the server neither serves
  nor lists, and the whole version is renamed into place in one step when
  every file is complete. An interrupted add leaves nothing a node can see.
- Each file's length is checked against what the source promised (the
  Hub's file size; the HTTP server's Content-Length), and its sha256 is
  computed, compared with the Hub's LFS sum where there is one, reported and
  written beside it as ``<file>.sha256`` for ``llmgw fetch`` to verify.
- A version that exists is never replaced — that is the point of the
  ``<name>/<version>/<file>`` layout: nodes that fetched it earlier and nodes
  fetching it now must hold the same bytes. Add under a new ``--version``.
  One more file of a Hub revision (``hf://org/repo@rev/other.gguf``) joins
  that version, linked into place; a file is never replaced either.
- A Hub source goes where ``llmgw.weights.layout.mirror_path`` puts it, the
  directory the Nomad job fetches; ``--name`` and ``--version`` are refused
  for it, since a job could never find a copy put elsewhere.

From the Hugging Face Hub the download itself is huggingface-hub's (it knows
authentication, redirects to the CDN and the Xet store); the whole snapshot is
pinned to one commit, so files from two commits cannot be mixed. From an
http(s) URL it is ``llmgw fetch``'s transfer, which resumes a cut connection.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import click
import msgspec

from llmgw.catalog.decode import decode_value
from llmgw.catalog.source import HfSource, Source, UrlSource
from llmgw.errors import DefinitionError, LlmgwError, RefusedError
from llmgw.weights import layout
from llmgw.weights.fetch import fetch_file, head_length
from llmgw.weights.hub import HfHub, Hub, HubError


class AddedFile(msgspec.Struct, kw_only=True):
    path: str       # relative to the mirror directory
    size: int
    sha256: str


class AddResult(msgspec.Struct, kw_only=True):
    name: str
    version: str
    directory: str  # relative to the mirror directory, ending in '/'
    files: list[AddedFile]
    commit: str | None = None  # the Hub commit the files were downloaded at


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


_NEW_VERSION = "Add it under a new --version (and point the catalog entry at it)"
_NEW_REVISION = ("Pin the revision to mirror in the source (hf://ORG/REPO@REVISION) and in the "
                 "catalog entry")


def _refuse_existing(final: Path, name: str, version: str, way_out: str = _NEW_VERSION) -> None:
    if final.exists():
        raise RefusedError(
            f"the mirror already holds {name}/{version}; a version is never replaced, because "
            f"nodes that fetched it would then disagree with nodes fetching it now. {way_out}"
        )


@contextlib.contextmanager
def _staging(root: Path, name: str, version: str) -> Iterator[Path]:
    """A hidden directory to build the version in; removed unless renamed into place."""
    parent = root / name
    parent.mkdir(parents=True, exist_ok=True)
    tmp = parent / f".{version}.adding-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        with contextlib.suppress(OSError):
            parent.rmdir()  # only if empty: a refused or failed first version leaves nothing


def _publish(tmp: Path, final: Path, name: str, version: str) -> None:
    _refuse_existing(final, name, version)
    try:
        # Renaming a directory onto a non-empty one fails, so two adds racing for
        # one version cannot both win.
        os.rename(tmp, final)
    except OSError as exc:
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
            _refuse_existing(final, name, version)
        raise
    fd = os.open(final.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _finish_file(tmp: Path, rel: str, promised: int | None, lfs_sha: str | None,
                 source: str) -> AddedFile:
    path = tmp / rel
    size = path.stat().st_size
    if promised is not None and size != promised:
        raise LlmgwError(f"{source}: {rel} is {size} bytes but the source promised {promised}; "
                         "nothing was added. Run the add again")
    digest = _sha256(path)
    if lfs_sha is not None and digest != lfs_sha.lower():
        raise LlmgwError(f"{source}: {rel} has sha256 {digest} but the Hub records {lfs_sha}; "
                         "nothing was added. Run the add again")
    path.with_name(path.name + layout.SIDECAR).write_text(layout.format_sidecar(digest,
                                                                               path.name))
    return AddedFile(path=rel, size=size, sha256=digest)


# -- from the Hub ---------------------------------------------------------------------------

@contextlib.contextmanager
def _hub_bars(show: bool) -> Iterator[None]:
    from huggingface_hub.utils.tqdm import (
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )

    was_disabled = are_progress_bars_disabled()
    (enable_progress_bars if show else disable_progress_bars)()
    try:
        yield
    finally:
        (disable_progress_bars if was_disabled else enable_progress_bars)()


def _refuse_existing_file(dest: Path, shown: str) -> None:
    if dest.exists():
        raise RefusedError(
            f"the mirror already holds {shown}; a file is never replaced, because nodes "
            "that fetched it would then disagree with nodes fetching it now")


def _publish_file(tmp: Path, rel: str, final: Path, name: str, version: str) -> None:
    """Put one more file into an existing version: its sum first, then the file, each
    linked under its final name (a link fails where a name exists, so nothing is ever
    replaced) and so visible at once and whole."""
    dest = final / rel
    _refuse_existing_file(dest, f"{name}/{version}/{rel}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    side = rel + layout.SIDECAR
    with contextlib.suppress(FileExistsError):
        os.link(tmp / side, final / side)   # a sum left by an add cut at this very point
    try:
        os.link(tmp / rel, dest)
    except FileExistsError:
        raise RefusedError(f"{name}/{version}/{rel} was added meanwhile by another "
                           "`mirror add`; nothing was replaced") from None
    fd = os.open(dest.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _add_hf(src: HfSource, root: Path, progress: bool, hub: Hub) -> AddResult:
    source = src.text
    where = layout.mirror_path(src)
    assert where is not None
    name, version = where.split("/")[:2]
    final = root / name / version
    if src.filename is None:
        # Refused before the Hub is asked: nothing has to be downloaded to know.
        _refuse_existing(final, name, version, _NEW_REVISION)
    else:
        _refuse_existing_file(final / src.filename, f"{name}/{version}/{src.filename}")
    try:
        info = hub.repo_info(src.repo_id, src.revision, files=True)
    except HubError as exc:
        raise LlmgwError(f"{source}: {exc.reason}") from None
    commit = info.sha or src.revision or layout.UNPINNED
    siblings = {f.path: f for f in info.files}
    if src.filename is not None:
        if src.filename not in siblings:
            raise LlmgwError(f"{source}: file {src.filename!r} is not in {src.repo_id} at "
                             f"{commit[:12]}; check the name against the repository's files")
        wanted = [src.filename]
    else:
        # Dot-files (.gitattributes) are repository plumbing, and hidden on the mirror.
        wanted = sorted(n for n in siblings if not any(
            layout.is_hidden(p) for p in n.split("/")))
    if not wanted:
        raise LlmgwError(f"{source}: the repository holds no files to add")
    with _staging(root, name, version) as tmp, _hub_bars(progress):
        files: list[AddedFile] = []
        for rel in wanted:
            try:
                hub.download(src.repo_id, rel, commit, tmp)
            except HubError as exc:
                raise LlmgwError(f"{source}: {exc.reason}; nothing was added") from None
            sib = siblings[rel]
            files.append(_finish_file(tmp, rel, sib.size, sib.lfs_sha256, source))
        shutil.rmtree(tmp / ".cache", ignore_errors=True)  # huggingface-hub's bookkeeping
        if src.filename is not None and final.exists():
            _publish_file(tmp, src.filename, final, name, version)
        else:
            _publish(tmp, final, name, version)
    return AddResult(name=name, version=version, directory=f"{name}/{version}/",
                     commit=commit,
                     files=[msgspec.structs.replace(f, path=f"{name}/{version}/{f.path}")
                            for f in files])


# -- from an http(s) URL --------------------------------------------------------------------

class ProgressBar:
    """A progress bar on stderr, drawn once the length is known."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.bar: Any = None
        self.done = 0

    def __call__(self, done: int, total: int | None) -> None:
        if self.bar is None:
            self.bar = click.progressbar(length=total or 0, label=self.label, file=sys.stderr)
            self.bar.__enter__()
        self.bar.update(done - self.done)
        self.done = done

    def close(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)


def _add_http(src: UrlSource, root: Path, name: str | None, version: str | None,
              sha256: str | None, progress: bool, timeout: float) -> AddResult:
    source, shown = src.url, src.shown  # a password in the URL is never echoed

    filename = unquote(Path(urlsplit(source).path).name)
    if not filename or layout.is_hidden(filename):
        raise DefinitionError(f"{shown}: the URL names no file; give the URL of one file",
                              field="source")
    layout.check_segment(filename, "the file name")
    stem = filename.split(".")[0]
    name = layout.check_segment(name or layout.slug(stem), "--name")
    if version is None:
        raise DefinitionError(
            f"{shown}: give --version; an http(s) URL carries no version, and the layout "
            f"{name}/<version>/{filename} needs one (a date or the model's release, say)",
            field="version")
    layout.check_segment(version, "--version")
    final = root / name / version
    _refuse_existing(final, name, version)
    promised = head_length(source, timeout)
    if promised is None:
        click.echo(f"warning: {shown} promises no length; the end of the transfer is trusted",
                   err=True)
    bar = ProgressBar(filename) if progress else None
    # Downloaded where the next run of the same add looks (hidden, one per version),
    # so a transfer that gives up is resumed by running the add again, as the
    # fetcher's message says; moved into the staging directory once whole.
    download = root / name / f".{version}.download"
    with _staging(root, name, version) as tmp:
        download.mkdir(exist_ok=True)
        try:
            got = fetch_file(source, download / filename, sha256=sha256, timeout=timeout,
                             progress=bar, notify=lambda m: click.echo(m, err=True))
        except BaseException:
            if not (download / f"{filename}.part").exists():
                shutil.rmtree(download, ignore_errors=True)   # nothing to resume
            raise
        finally:
            if bar is not None:
                bar.close()
        # The fetcher wrote <file>.sha256 in the mirror's format beside the file.
        os.rename(download / filename, tmp / filename)
        sidecar = f"{filename}{layout.SIDECAR}"
        if (download / sidecar).exists():
            os.rename(download / sidecar, tmp / sidecar)
        shutil.rmtree(download, ignore_errors=True)
        if promised is not None and got.size != promised:
            raise LlmgwError(f"{shown}: received {got.size} bytes but the server promised "
                             f"{promised}; nothing was added. Run the add again")
        _publish(tmp, final, name, version)
    return AddResult(name=name, version=version, directory=f"{name}/{version}/",
                     files=[AddedFile(path=f"{name}/{version}/{filename}", size=got.size,
                                      sha256=got.sha256)])


def add(source: str | Source, root: str | Path, *, name: str | None = None,
        version: str | None = None, sha256: str | None = None, progress: bool = False,
        hf_token: str | None = None, hub: Hub | None = None, timeout: float = 60.0,
        ) -> AddResult:
    """Add ``source`` (``hf://org/repo[@rev][/file]`` or an http(s) URL, as text or as
    the catalog's parsed value) to the mirror at ``root`` as ``<name>/<version>/``.
    Raises RefusedError if that version exists."""
    base = Path(root)
    if not base.is_dir():
        raise DefinitionError(f"mirror directory {root} does not exist; create it or give "
                              "--dir", field="dir")
    try:
        if name is not None:
            layout.check_segment(name, "--name")
        if version is not None:
            layout.check_segment(version, "--version")
    except ValueError as exc:
        raise DefinitionError(str(exc), field="source") from None
    src = decode_value(source, Source, source="source")
    match src:
        case HfSource():
            if sha256:
                raise DefinitionError("--sha256 is for an http(s) source; the Hub's own sums "
                                      "are checked for hf:// sources", field="sha256")
            if name is not None or version is not None:
                raise DefinitionError(
                    f"{src.text}: --name and --version are for an http(s) source; an hf:// "
                    f"source is put where the Nomad job fetches it from "
                    f"({layout.mirror_path(src)}). To mirror another revision, name it in "
                    "the source (hf://ORG/REPO@REVISION)", field="version" if version else "name")
            return _add_hf(src, base, progress, hub or HfHub(token=hf_token, timeout=timeout))
        case UrlSource():
            return _add_http(src, base, name, version, sha256, progress, timeout)
    raise DefinitionError(f"{src.shown!r}: mirror add takes "
                          "hf://ORG/REPO[@REVISION][/FILE] or an http(s) URL", field="source")
