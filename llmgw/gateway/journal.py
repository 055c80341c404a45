"""The usage ledger's journal: each record on local disk before the client has its answer.

Every gateway process (unless ``gateway.journal`` is off) appends each usage
record to a file of its own in its journal directory (``journal_location``)
before the last byte of the request's answer is handed to the server
(``Gateway._final``), and deletes a file only once the store holds every
record in it. A process that starts adopts the files of processes that are
gone and ships them first; the store keeps a record id once, so a record
shipped twice (its acknowledgement lost, or two processes adopting the same
file) is counted once.

**What a SIGKILL can lose: nothing that was answered.** A record reaches the
file with one ``write(2)`` on the event loop, no fsync: the bytes are then
the kernel's, and killing the process cannot take them back. Every answer
that makes a record (any answer once the request was admitted, the
gateway's own 502s and 504s included) passes the journaling ``send`` that
writes the record before it hands on the last byte, so a request whose
answer's last byte reached the client has its record in the file. The
reverse can happen, within one step of the event loop: a kill after the
write and before the byte leaves is a record of an answer the client did
not get whole. A request that ends without an answer (the client went away)
is recorded after. What fsync adds is survival of a crash of the *machine*:
the ledger's loop syncs the files from a thread every ``ledger_interval``
(``sync``), so a power loss can lose the records of at most the last one.

The alternatives weighed: a writer thread with group commit every few ms
(the request path hands it the record and moves on) would leave the records
of that window in memory when the process is killed, so answered requests
would be lost unless every answer waited for its commit — an await, a thread
hop and a few ms per request. A SQLite file per process costs a
transaction per record, or the same window if batched. One small ``write``
is ~2 µs and is what the gateway's own logging does on the loop already.

**Bounded by the disk, and the bound is stated.** The files hold at most
``gateway.journal_max`` (1 GiB, about 3.5 million records); a record that
would go past it, or whose write fails (a full disk, an I/O error), is not
journaled: kept in memory while the memory buffer has room
(``gateway.ledger_buffer``), dropped when it has none, and counted in
``llmgw_gateway_ledger_unjournaled_records`` (the drops also in
``llmgw_gateway_ledger_dropped_records``). Memory does not bound an outage:
past ``ledger_buffer`` records, newer records are in the journal only (a new
file, "disk-only") and are read back, a file at a time, when the store has
taken what is in memory.

**Files.** ``ledger-<id>.lock`` is held (``flock``) by its process for its
life; ``ledger-<id>-<n>.jnl`` are its segments, one JSON array per line
(``UsageRecord``), shipped in the order of ``n``; the last is emptied in place
once the store holds all it had and it reached ``EMPTY_AT`` (1 MiB), so it
may also hold records already written, which a restart ships again and the
store skips. A lock that can be taken
belongs to a process that is gone: its segments are adopted, and the lock
file is removed with the last of them. A line that cannot be decoded (the
tail of a write cut by a crash of the machine) is logged and skipped.

Request logs (a team's bodies, up to megabytes each) are not journaled: they
wait in memory as before.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import msgspec

from llmgw.config import GatewayConfig
from llmgw.errors import ConfigError
from llmgw.store.base import Store, UsageRecord

log = logging.getLogger("llmgw.gateway.ledger")

PREFIX = "ledger-"
# A segment whose records are all in the store is emptied once it is this large.
EMPTY_AT = 1024 * 1024
SEGMENT = ".jnl"
LOCK = ".lock"

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(UsageRecord).decode


def journal_location(gateway: GatewayConfig, store: Store) -> Path | None:
    """The directory of this deployment's journals on this host; None with the journal off.

    The default is the store's own directory here (``Store.state_dir``): a journal
    holds records for one database, and a process that adopts a dead one's files ships
    them to its own store, so two deployments must never share a directory.
    """
    if not gateway.journal:
        return None
    if gateway.journal_dir is not None:
        return Path(gateway.journal_dir)
    return store.state_dir / "journal"


@dataclass(slots=True)
class Segment:
    path: Path
    # The records of this segment in the ledger's memory and not yet written
    # (for a disk-only segment: the records in its file).
    left: int = 0
    size: int = 0
    disk_only: bool = False
    # Another process's: its records are not in this process's pending tokens.
    adopted: bool = False
    # The adopted owner's lock, removed with its last segment.
    owner_lock: tuple[int, Path] | None = None


class Journal:
    """One process's journal segments in ``directory``, and those it adopted."""

    def __init__(self, directory: str | Path, *, max_bytes: int, ident: str,
                 segment_records: int,
                 on_unjournaled: Callable[[int], object] | None = None) -> None:
        self.dir = Path(directory)
        self.max_bytes = max_bytes
        self.ident = ident
        # A disk-only segment is closed after this many records, so reading one back
        # holds no more than the memory buffer would.
        self.segment_records = max(1, segment_records)
        self._on_unjournaled = on_unjournaled
        self.bytes = 0
        self.unjournaled = 0
        self.replayed = 0
        self._seq = 0
        self._segments: deque[Segment] = deque()
        self._fd = -1
        self._sync_lock = threading.Lock()
        self._unsynced: list[int] = []      # fds of closed segments, for ``sync`` to close
        self._dirty = False
        # A segment was created or deleted since the last ``sync``: the directory too.
        self._renamed = False
        # Segments of processes that are gone, waiting to be read back.
        self._adopted: deque[Segment] = deque()
        self._lock_fd = self._open_dir()
        self._new_segment(disk_only=False)

    # ------------------------------------------------------------ start

    def _open_dir(self) -> int:
        """Create the directory, take this process's lock; ConfigError naming it if not."""
        lock = self.dir / f"{PREFIX}{self.ident}{LOCK}"
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise ConfigError(
                f"gateway.journal_dir: {self.dir} cannot be written ({exc.strerror}); the "
                "usage ledger journals every record there before answering, so make it a "
                "directory this user may write (gateway.journal_dir), or turn "
                "gateway.journal off to keep records in memory only",
                field="gateway.journal_dir") from None
        fcntl.flock(fd, fcntl.LOCK_EX)
        return fd

    def adopt(self) -> int:
        """Queue the segments of every process that is gone; the segments found.

        Called by the ledger's loop (at its start, then now and then), not when the
        journal opens: a process that never runs the loop (the control process
        beside gateway workers) must not hold another's records it never ships.
        """
        owners: dict[str, list[Path]] = {}
        held = {s.path for s in self._adopted} | {s.path for s in self._segments}
        for path in self.dir.glob(f"{PREFIX}*{SEGMENT}"):
            owner, _, _ = path.name[len(PREFIX):-len(SEGMENT)].rpartition("-")
            owners.setdefault(owner, []).append(path)
        for path in self.dir.glob(f"{PREFIX}*{LOCK}"):
            owners.setdefault(path.name[len(PREFIX):-len(LOCK)], [])
        owners.pop(self.ident, None)
        found = 0
        for owner, paths in owners.items():
            if any(p in held for p in paths):
                continue
            lock_path = self.dir / f"{PREFIX}{owner}{LOCK}"
            try:
                fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            except OSError as exc:
                log.error("cannot open %s to adopt its journal (%s); its records wait "  # noqa: TRY400
                          "for a process that can", lock_path, exc.strerror)
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)        # a live process's, or adopted by one
                continue
            paths.sort(key=_seq_of)
            if not paths:
                os.close(fd)
                with contextlib.suppress(OSError):
                    os.unlink(lock_path)
                continue
            for p in paths:
                try:
                    size = p.stat().st_size
                except FileNotFoundError:
                    size = 0
                self.bytes += size
                self._adopted.append(Segment(p, size=size, disk_only=True, adopted=True))
            self._adopted[-1].owner_lock = (fd, lock_path)
            found += len(paths)
            log.info("adopting %d journal segment(s) of gateway process %s in %s",
                     len(paths), owner, self.dir)
        return found

    # ------------------------------------------------------------ the request path

    @property
    def spilling(self) -> bool:
        """Whether new records go to disk only (memory is full, or older files wait)."""
        return self._segments[-1].disk_only

    def append(self, rec: UsageRecord) -> bool:
        """Write ``rec`` to the current segment; False (and counted) if it could not be."""
        line = _encode(rec) + b"\n"
        current = self._segments[-1]
        if current.disk_only and current.left >= self.segment_records:
            self._new_segment(disk_only=True)
            current = self._segments[-1]
        if self.bytes + len(line) > self.max_bytes:
            return self._refused(f"it holds {self.bytes} bytes, gateway.journal_max is "
                                 f"{self.max_bytes}")
        try:
            n = os.write(self._fd, line)
        except OSError as exc:
            return self._refused(exc.strerror or str(exc))
        if n != len(line):
            # A short write to a file is a full disk; take the partial line back.
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, current.size)
            return self._refused("the disk is full")
        current.size += n
        self.bytes += n
        self._dirty = True
        if current.disk_only:
            current.left += 1
        return True

    def kept(self) -> None:
        """A record went to memory as part of the current segment (journaled or not)."""
        self._segments[-1].left += 1

    def _refused(self, why: str) -> bool:
        if not self.unjournaled:
            log.error("usage records cannot be journaled in %s (%s); they wait in memory "
                      "only until the store takes them", self.dir, why)
        self.unjournaled += 1
        if self._on_unjournaled is not None:
            self._on_unjournaled(1)
        return False

    def spill(self) -> None:
        """Memory is full: the records from now on are in the journal only."""
        if not self.spilling:
            self._new_segment(disk_only=True)

    # ------------------------------------------------------------ the ledger's loop

    def written(self, n: int) -> None:
        """The ``n`` oldest records in memory are in the store: delete finished segments."""
        segments = self._segments
        while n and segments:
            head = segments[0]
            if head.disk_only:
                break
            take = min(n, head.left)
            head.left -= take
            n -= take
            if head.left == 0 and len(segments) > 1:
                self._delete(segments.popleft())
            elif take == 0:
                break

    def load_next(self) -> tuple[list[UsageRecord], bool] | None:
        """Memory is empty: the next disk-only segment's records (and whether adopted),
        now counted as in memory; None when none waits.

        An adopted segment goes first: it is put at the head of this process's
        segments, before the current one, as the records it brings are now the
        oldest in memory."""
        self._collect()
        target: Segment | None
        if self._adopted:
            target = self._adopted.popleft()
            self._segments.appendleft(target)
        else:
            target = next((s for s in self._segments if s.disk_only), None)
            if target is None:
                return None
            if target is self._segments[-1]:
                self._new_segment(disk_only=False)
        records = self._read(target.path)
        target.disk_only = False
        target.left = len(records)
        if target.adopted:
            self.replayed += len(records)
        if not records:
            # Nothing to ship: it goes now (the loop below would never reach it).
            self._segments.remove(target)
            self._delete(target)
        return records, target.adopted

    def drained(self) -> None:
        """Memory and disk hold nothing unwritten: start the current segment afresh."""
        current = self._segments[-1]
        if len(self._segments) == 1:
            # The usual case, every cycle: emptied in place, one syscall rather than a
            # new file and an unlink, and only past EMPTY_AT: a truncate that drops
            # dirty pages took 0.6 ms, more than the records of a 200 ms cycle cost to
            # write. A restart ships what is left again, which the store skips.
            if current.size >= EMPTY_AT:
                try:
                    os.ftruncate(self._fd, 0)
                except OSError as exc:
                    log.warning("emptying the journal segment %s failed (%s); starting "
                                "another", current.path, exc.strerror)
                    self._new_segment(disk_only=False)
                    self._collect()
                    return
                self.bytes -= current.size
                current.size = 0
            return
        self._new_segment(disk_only=False)
        self._collect()

    def _collect(self) -> None:
        """Delete the leading segments that hold nothing unwritten."""
        segments = self._segments
        while len(segments) > 1 and not segments[0].disk_only and segments[0].left == 0:
            self._delete(segments.popleft())

    def sync(self) -> None:
        """fsync what was written (blocking: call it from a thread)."""
        with self._sync_lock:
            closing, self._unsynced = self._unsynced, []
            dirty, self._dirty = self._dirty, False
            renamed, self._renamed = self._renamed, False
            fd = self._fd
        for old in closing:
            with contextlib.suppress(OSError):
                os.fdatasync(old)
            os.close(old)
        if dirty and fd >= 0:
            with contextlib.suppress(OSError):
                os.fdatasync(fd)
        if renamed:
            # The segments' names, so a crash of the machine finds the files too (and
            # not the deleted ones); a write alone changes no name, and costs no commit.
            with contextlib.suppress(OSError):
                dir_fd = os.open(self.dir, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    os.fsync(dir_fd)
                finally:
                    os.close(dir_fd)

    def close(self) -> None:
        """Release this process's files; what is unwritten stays for the next start.
        Again: nothing (a gateway may be closed twice)."""
        if self._lock_fd < 0:
            return
        self.sync()
        with self._sync_lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
        for s in self._adopted:
            if s.owner_lock is not None:
                os.close(s.owner_lock[0])
        unwritten = [s for s in self._segments if s.left or s.disk_only]
        if not unwritten:
            for s in list(self._segments):
                self._delete(s)
            self._segments.clear()
            with contextlib.suppress(OSError):
                os.unlink(self.dir / f"{PREFIX}{self.ident}{LOCK}")
        for s in self._segments:
            if s.owner_lock is not None:
                os.close(s.owner_lock[0])
        os.close(self._lock_fd)
        self._lock_fd = -1

    # ------------------------------------------------------------ files

    def _new_segment(self, *, disk_only: bool) -> None:
        self._seq += 1
        path = self.dir / f"{PREFIX}{self.ident}-{self._seq}{SEGMENT}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        with self._sync_lock:
            if self._fd >= 0:
                self._unsynced.append(self._fd)
            self._fd = fd
            self._dirty = True
            self._renamed = True
        self._segments.append(Segment(path, disk_only=disk_only))

    def _delete(self, segment: Segment) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(segment.path)
        with self._sync_lock:
            self._renamed = True
        self.bytes -= segment.size
        if segment.owner_lock is not None:
            fd, lock_path = segment.owner_lock
            with contextlib.suppress(FileNotFoundError):
                os.unlink(lock_path)
            os.close(fd)

    def _read(self, path: Path) -> list[UsageRecord]:
        try:
            data = path.read_bytes()
        except OSError as exc:
            log.error("journal segment %s cannot be read (%s); its records are lost",  # noqa: TRY400
                      path, exc.strerror)
            return []
        out: list[UsageRecord] = []
        bad = 0
        for line in data.splitlines():
            if not line:
                continue
            try:
                out.append(_decode(line))
            except (msgspec.DecodeError, msgspec.ValidationError):
                bad += 1
        if bad:
            log.error("journal segment %s: %d line(s) cannot be read and are skipped "
                      "(cut by a crash of the machine?)", path, bad)
        return out


def _seq_of(path: Path) -> int:
    try:
        return int(path.name[:-len(SEGMENT)].rpartition("-")[2])
    except ValueError:
        return 0
