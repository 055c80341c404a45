"""A node's weight cache: which revisions it holds, when each was last used, and room.

Every model replica on a Nomad node fetches its weights into one host volume
(``llmgw.scheduler.nomad.render``); this module keeps account of that directory so
that the control plane can place replicas where the weights already are, and so
that the directory stays within a bound.

* **Entries.** One entry is one fetch destination — a file, or a directory of
  shards — exactly the path the job's fetch task is given. After a fetch succeeds
  (or finds the entry already in place) ``record_use`` writes a stamp beside it,
  ``<entry>.llmgw-use``, holding its size and the time of use. A stamp is the only
  thing that makes a path an entry: a directory an operator copied in by hand is
  never counted, and never removed.
* **Tags.** ``tag`` names what an entry holds in the few characters a Nomad node's
  metadata value carries: a digest of the entry's path, which is the model's mirror
  path (``llmgw.weights.layout.mirror_path``), where a version once written never
  changes. The control plane renders the same tag into the job's affinity.
* **Eviction.** ``sweep`` removes least-recently-used entries until the total is
  within the bound. It never removes an entry that is *kept* (the control plane
  passes the entries its running and starting allocations use), one used since
  ``since`` (an allocation placed after the keep list was made has fetched, and so
  stamped, its entry), or one whose lock a fetch holds (``using``: shared while a
  fetch runs, exclusive while the sweep deletes). A kept entry over the bound stays:
  the bound yields to a replica that needs its weights.
* **Progress.** ``ProgressFile`` writes what a running fetch has on disk, its rate
  and its ETA, as JSON, at most once a second; Nomad reads it back through the client
  fs API (``/v1/client/fs/cat``), so ``ctl replicas`` can show a percentage without
  parsing a log.

Pure bookkeeping and file operations; no HTTP. The sweep runs on the node (``llmgw
cache sweep``, a task of a batch job the control plane submits), because nothing else
can see a host volume.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import msgspec

from llmgw.weights import layout

STAMP = ".llmgw-use"
LOCK = ".llmgw-lock"
TAG_LENGTH = 16
PROGRESS_INTERVAL = 1.0   # seconds between two writes of the progress file


def tag(entry: str) -> str:
    """What a node's metadata records for the entry at ``entry`` (a path in the task)."""
    return hashlib.sha256(entry.rstrip("/").encode("utf-8")).hexdigest()[:TAG_LENGTH]


class Stamp(msgspec.Struct, kw_only=True):
    path: str       # the entry, as the fetch task named it
    size: int       # bytes
    used: float     # Unix time of the last fetch that found or brought it


class Entry(msgspec.Struct, kw_only=True):
    path: str
    tag: str
    size: int
    used: float


class Report(msgspec.Struct, kw_only=True):
    """What a sweep found and did, written for the control plane to read back."""

    root: str
    entries: list[Entry]          # what the cache holds after the sweep
    evicted: list[Entry] = []
    kept_over_bound: int = 0      # bytes above the bound the sweep may not remove
    max_bytes: int | None = None
    total: int = 0


def _stamp_path(entry: Path) -> Path:
    return entry.parent / (entry.name + STAMP)


def _lock_path(entry: Path) -> Path:
    return entry.parent / (entry.name + LOCK)


def _entry_path(dest: str | Path) -> Path:
    return Path(str(dest).rstrip("/") or "/")


# What the fetcher keeps beside a file: counted as neither weights nor progress.
_BOOKKEEPING = (layout.SIDECAR, ".lock", ".part.json", STAMP, LOCK, ".tmp")


def du(path: Path) -> int:
    """Bytes of a file, or of the weights below a directory (a symbolic link: nothing;
    checksums, locks and stamps are not counted)."""
    try:
        if path.is_symlink():
            return 0
        if path.is_file():
            return path.stat().st_size
    except OSError:
        return 0
    total = 0
    for base, _, files in os.walk(path):
        for name in files:
            if name.endswith(_BOOKKEEPING):
                continue
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(base, name)).st_size
    return total


@contextlib.contextmanager
def using(dest: str | Path, *, exclusive: bool = False, wait: bool = True) -> Iterator[bool]:
    """Hold the entry's lock: shared by fetches, exclusive by the sweep. Yields whether
    it was taken (always, when ``wait``)."""
    entry = _entry_path(dest)
    entry.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(_lock_path(entry), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        try:
            fcntl.flock(fd, mode | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def record_use(dest: str | Path, *, now: float | None = None) -> Stamp:
    """Stamp the entry at ``dest`` as used now, with its size on disk."""
    entry = _entry_path(dest)
    stamp = Stamp(path=str(dest), size=du(entry), used=time.time() if now is None else now)
    target = _stamp_path(entry)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_bytes(msgspec.json.encode(stamp))
    tmp.replace(target)
    return stamp


def entries(root: str | Path) -> list[Entry]:
    """Every stamped entry under ``root`` that is still there, least recently used first."""
    found = []
    for base, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not layout.is_hidden(d)]
        for name in files:
            if not name.endswith(STAMP):
                continue
            stamp_file = Path(base) / name
            entry = stamp_file.with_name(name[: -len(STAMP)])
            try:
                stamp = msgspec.json.decode(stamp_file.read_bytes(), type=Stamp)
            except (OSError, msgspec.DecodeError, msgspec.ValidationError):
                continue
            if not entry.exists():
                stamp_file.unlink(missing_ok=True)   # removed by hand: nothing to account
                continue
            found.append(Entry(path=stamp.path, tag=tag(stamp.path), size=stamp.size,
                               used=stamp.used))
    return sorted(found, key=lambda e: (e.used, e.path))


def _remove(entry: Path) -> None:
    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry)
    else:
        entry.unlink(missing_ok=True)
        for suffix in (layout.SIDECAR, ".lock", ".part", ".part.json"):
            entry.with_name(entry.name + suffix).unlink(missing_ok=True)
    _stamp_path(entry).unlink(missing_ok=True)


def sweep(root: str | Path, max_bytes: int | None, *, keep: Iterable[str] = (),
          since: float = float("inf")) -> Report:
    """Remove least-recently-used entries until the cache is within ``max_bytes``
    (None: remove nothing, only report), sparing kept (by path or by tag), recently used
    and locked ones."""
    kept = {str(_entry_path(k)) for k in keep}
    held = entries(root)
    total = sum(e.size for e in held)
    evicted: list[Entry] = []
    if max_bytes is not None:
        for e in list(held):
            if total <= max_bytes:
                break
            path = _entry_path(e.path)
            if str(path) in kept or e.tag in kept or e.used >= since:
                continue
            with using(path, exclusive=True, wait=False) as mine:
                if not mine:
                    continue   # a fetch is bringing or checking it right now
                _remove(path)
            held.remove(e)
            evicted.append(e)
            total -= e.size
    over = max(0, total - max_bytes) if max_bytes is not None else 0
    return Report(root=str(root), entries=held, evicted=evicted, kept_over_bound=over,
                  max_bytes=max_bytes, total=total)


class Progress(msgspec.Struct, kw_only=True):
    """A running fetch, as its progress file says: bytes on disk of ``total``."""

    url: str
    done: int
    total: int | None
    rate: float            # bytes per second since the fetch started
    started: float
    updated: float
    finished: bool = False
    # What stopped it, as ``llmgw fetch`` said it: what a control plane that cannot read
    # the task's log (that takes another capability, read-logs) shows for a failed fetch.
    error: str | None = None

    @property
    def percent(self) -> float | None:
        return 100.0 * self.done / self.total if self.total else None

    @property
    def eta(self) -> float | None:
        if not self.total or self.rate <= 0:
            return None
        return max(0.0, (self.total - self.done) / self.rate)


class Meter:
    """What a fetch into ``dest`` has on disk, of ``total``, and its rate since it began.

    The byte count is what is on disk below the destination (parts included), so a
    resumed fetch starts from what it had and a directory of shards counts as one
    total; ``total`` is the size the mirror lists, when known. The rate counts only
    what this run brought.
    """

    def __init__(self, url: str, dest: str | Path, total: int | None, *,
                 clock: object = time.time) -> None:
        self.url, self.dest, self.total = url, _entry_path(dest), total
        self._clock = clock
        self.started = self.now()
        self.base = self.on_disk()

    def now(self) -> float:
        clock = self._clock
        assert callable(clock)
        return float(clock())

    def on_disk(self) -> int:
        return du(self.dest) + self._parts()

    def read(self, now: float | None = None, *, finished: bool = False) -> Progress:
        now = self.now() if now is None else now
        done = self.on_disk()
        elapsed = max(now - self.started, 1e-9)
        total = self.total if self.total is not None else (done if finished else None)
        return Progress(url=self.url, done=done, total=total,
                        rate=max(0, done - self.base) / elapsed, started=self.started,
                        updated=now, finished=finished)

    def _parts(self) -> int:
        """A single file's part lies beside it, outside ``dest``."""
        if self.dest.is_dir():
            return 0
        return du(self.dest.with_name(self.dest.name + ".part"))


class ProgressFile:
    """A ``progress`` callback for ``llmgw.weights.fetch`` that keeps a JSON file current
    with what its ``Meter`` reads, at most once per ``interval``."""

    def __init__(self, path: str | Path, url: str, dest: str | Path, total: int | None, *,
                 clock: object = time.time, interval: float = PROGRESS_INTERVAL) -> None:
        self.path = Path(path)
        self.meter = Meter(url, dest, total, clock=clock)
        self._interval = interval
        self._last = float("-inf")

    def __call__(self, _done: int, _total: int | None) -> None:
        now = self.meter.now()
        if now - self._last >= self._interval:
            self.write(now)

    def write(self, now: float | None = None, *, finished: bool = False) -> Progress:
        p = self.meter.read(now, finished=finished)
        self._last = p.updated
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_bytes(msgspec.json.encode(p))
        tmp.replace(self.path)
        return p


def write_failure(path: str | Path, url: str, message: str,
                  last: Progress | None = None) -> None:
    """Leave ``message`` in the progress file of a fetch that failed (over its last
    progress, when it had any)."""
    now = time.time()
    p = last or Progress(url=url, done=0, total=None, rate=0.0, started=now, updated=now)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_bytes(msgspec.json.encode(msgspec.structs.replace(p, updated=now,
                                                                error=message)))
    tmp.replace(target)


def read_progress(data: bytes) -> Progress | None:
    try:
        return msgspec.json.decode(data, type=Progress)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
