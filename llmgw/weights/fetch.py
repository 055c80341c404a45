"""``llmgw fetch URL DEST``: the Nomad prestart task that brings weights to a node.

The node-local cache is filled the way the mirror is: never a partial file
under the final name. Bytes arrive in ``DEST.part``; only a complete,
verified file is renamed to ``DEST``, so an engine can never start on half a
model, and a file present under its final name needs no second look.

- **Resume.** A transfer cut in the middle leaves ``DEST.part`` and
  ``DEST.part.json`` (the URL, the validator and the length the server
  announced). The next attempt — in this process, or after the task is
  restarted — asks for ``Range: bytes=N-`` with ``If-Range``; a changed file
  answers 200 and the part starts over rather than being spliced.
- **Verification.** The sha256 given with ``--sha256``, else the mirror's
  ``<url>.sha256``. A mismatch removes the part (it cannot be resumed into
  anything good) and names both sums. Without a sum the length the server
  announced is still checked, and a server whose answers disagree about the
  length, or that keeps ending transfers before the length it promised, is
  reported rather than retried forever.
- **Credentials.** A Nomad job never carries them: its fetch task gets
  ``user:password`` in ``LLMGW_FETCH_USERINFO`` from the job's Nomad Variable
  (``llmgw.scheduler.nomad.credentials``), and ``with_userinfo`` puts it back
  into the URL in memory. ``http.client`` ignores ``user:pass@`` in a URL, so a
  mirror behind Basic auth would answer 401 with no hint why. The userinfo is
  sent as an ``Authorization: Basic`` header instead, kept on redirects within
  the same origin and dropped on redirects elsewhere. The password appears in
  no message, log line or file: ``llmgw.redact.redact_url`` shows it as ``***``.
- **One download per node.** Two replicas of a model placed on one node run
  two prestart tasks at once. An ``flock`` on ``DEST.lock`` makes the second
  wait; it then finds ``DEST`` in place and returns. The holder deletes the lock
  file before it lets go, so none is left behind; a waiter that then holds the
  lock on a file no longer at that path (deleted, or replaced by a newer
  waiter's) lets go and locks the path again, so two fetches never hold
  locks on different inodes at once.

- **The disk is not the network.** A full, read-only or unwritable cache volume is
  an ``OSError`` like a reset connection, but retrying it only wastes the attempts
  and then blames the mirror. Every write to the cache goes through ``_disk``, which
  says which path could not be written and what to do on the node (``disk_error``).

The transfer uses the standard library's ``http.client`` reading into one
reused buffer: measured on loopback from ``llmgw mirror serve`` it moved
2–3.5 GB/s against ~0.7 GB/s for httpx's streaming iterator, well above a
node's network, and the fetcher image needs nothing else.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import fcntl
import hashlib
import http.client
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote, unquote, urljoin, urlsplit, urlunsplit

import msgspec

from llmgw.errors import DefinitionError, LlmgwError, NotFoundError, UnavailableError
from llmgw.redact import redact_url
from llmgw.weights import layout

BUFFER = 1 << 20
MAX_REDIRECTS = 5
Notify = Callable[[str], None]
Progress = Callable[[int, int | None], None]


class FetchResult(msgspec.Struct, kw_only=True):
    path: str
    size: int
    sha256: str
    transferred: int    # bytes received by this run (0: already in the cache)
    verified: bool      # checked against a known sum, not only a length


class _PartMeta(msgspec.Struct, kw_only=True):
    url: str
    validator: str | None = None
    total: int | None = None


class _RetryableError(Exception):
    """A transfer went wrong in a way another attempt may fix."""


def _noop(_: str) -> None:
    return None


# -- HTTP -----------------------------------------------------------------------------------

def with_userinfo(url: str, userinfo: str | None) -> str:
    """``url`` carrying ``userinfo`` (``user:password``, percent-encoded), unless it has
    its own or there is none; only its own origin ever sees it (``_follow``)."""
    parts = urlsplit(url)
    if not userinfo or "@" in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=f"{userinfo}@{parts.netloc}"))


def _authorization(url: str) -> dict[str, str]:
    """The Basic ``Authorization`` header for the userinfo in ``url`` (RFC 7617), if any."""
    parts = urlsplit(url)
    if parts.username is None:
        return {}
    pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
    return {"Authorization": "Basic " + base64.b64encode(pair.encode("utf-8")).decode("ascii")}


def _follow(url: str, location: str) -> str:
    """Where a redirect leads. Credentials are kept only on the same origin: a
    relative Location keeps them anyway, and an absolute one back to the same
    scheme, host and port gets them again; any other host never sees them."""
    nxt = urljoin(url, location)
    here, there = urlsplit(url), urlsplit(nxt)
    if (here.username is not None and there.username is None
            and (here.scheme, here.hostname, here.port)
            == (there.scheme, there.hostname, there.port)):
        userinfo = here.netloc.rpartition("@")[0]
        nxt = urlunsplit(there._replace(netloc=f"{userinfo}@{there.netloc}"))
    return nxt


def _connection(url: str, timeout: float
                ) -> tuple[http.client.HTTPConnection, str, dict[str, str]]:
    """A connection to ``url``'s server, the request target, and the headers its
    userinfo asks for."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise DefinitionError(f"{redact_url(url)}: fetch takes an http:// or https:// URL",
                              field="url")
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.hostname, parts.port, timeout=timeout)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return conn, target, _authorization(url)


@contextlib.contextmanager
def _request(url: str, headers: dict[str, str], timeout: float
             ) -> Iterator[tuple[str, http.client.HTTPResponse]]:
    """GET ``url`` (following redirects); yields the final URL and the response."""
    for _ in range(MAX_REDIRECTS + 1):
        conn, target, auth = _connection(url, timeout)
        # The response holds its own reference to the socket: closing only the
        # connection leaves the descriptor open for as long as anything (an
        # error's traceback, say) still refers to the response.
        with contextlib.closing(conn):
            conn.request("GET", target,
                         headers={"Accept-Encoding": "identity", **auth, **headers})
            with conn.getresponse() as resp:
                location = resp.getheader("Location")
                if resp.status in (301, 302, 303, 307, 308) and location:
                    url = _follow(url, location)
                    continue
                yield url, resp
                return
    raise UnavailableError(f"{redact_url(url)}: more than {MAX_REDIRECTS} redirects; check the "
                           "mirror URL")


_TRANSPORT = (OSError, http.client.HTTPException)


def _nearest(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists: what decides whether it can be made."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path("/")


def not_writable(path: str | Path, strerror: str, *, owner: int, group: int, mode: int,
                 where: str | Path, uid: int) -> str:
    """The words for a cache directory this fetch cannot write: the path, who owns the
    directory that decides it, the uid the fetch runs as, and what to do on the node."""
    return (f"cannot write {path}: {strerror}; {where} is owned by uid {owner} (gid "
            f"{group}, mode {mode & 0o7777:04o}) and this fetch runs as uid {uid}. Nomad "
            "never creates or chowns a host volume's directory: on the node, give the cache "
            f"volume's host directory (its host_volume path in the Nomad client's "
            f"configuration) to uid {uid} — `sudo chown -R {uid} DIR` — or set "
            "scheduler.nomad.fetch_user to the uid that owns it, and check that the volume "
            "is not read-only")


def disk_error(path: Path, exc: OSError) -> LlmgwError:
    """A failure to write the cache, with what to do on the node. Not retried: a full or
    read-only volume stays so, and the task's restart policy tries again later."""
    said = f"cannot write {path}: {exc.strerror or exc}"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return LlmgwError(f"{said}; the node's model cache is full. Free room there: "
                          "`llmgw cache sweep` removes weights no replica uses, and "
                          "scheduler.nomad.cache_max makes llmgw keep the cache within a bound")
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        where = _nearest(path if exc.errno == errno.EROFS else path.parent)
        try:
            st = where.stat()
        except OSError:
            return LlmgwError(f"{said}; the fetch runs as uid {os.getuid()}, which must be "
                              "able to write the cache volume's host directory")
        return LlmgwError(not_writable(path, str(exc.strerror or exc), owner=st.st_uid,
                                       group=st.st_gid, mode=st.st_mode, where=where,
                                       uid=os.getuid()))
    return LlmgwError(f"{said}; check the node's disk (dmesg, df) and the cache volume")


def check_writable(dest: str | Path) -> None:
    """Before anything is downloaded: can this process create files where ``dest`` goes?
    Tried for real (a file made and removed in the nearest existing directory), since
    permission bits alone do not say it for root, ACLs or a read-only mount."""
    target = Path(dest)
    where = _nearest(target if str(dest).endswith("/") else target.parent)
    if not where.is_dir():
        return   # a file in the way: the fetch's own mkdir says so
    probe = where / f".llmgw-write-check-{os.getpid()}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise disk_error(target, exc) from None
    os.close(fd)
    probe.unlink(missing_ok=True)


@contextlib.contextmanager
def _disk(path: Path) -> Iterator[None]:
    """Writes to the cache: an OSError there is the disk's, never the network's."""
    try:
        yield
    except OSError as exc:
        raise disk_error(path, exc) from None


def _status_error(url: str, status: int, reason: str) -> LlmgwError:
    url = redact_url(url)
    if status == 404:
        return NotFoundError(f"{url}: not found on the mirror (HTTP 404); check the model's "
                             "source, or add the file with `llmgw mirror add`")
    if status == 401:
        return LlmgwError(f"{url}: the server asks for credentials (HTTP 401 {reason}); put "
                          "them in the URL as http://USER:PASSWORD@HOST/...")
    return LlmgwError(f"{url}: the server answered HTTP {status} {reason}; check the "
                      "mirror's own log for why it refuses this file")


def head_length(url: str, timeout: float = 60.0) -> int | None:
    """The Content-Length a HEAD of ``url`` promises (None: none promised)."""
    for _ in range(MAX_REDIRECTS + 1):
        conn, target, auth = _connection(url, timeout)
        try:
            with contextlib.closing(conn):   # the response too: see _request
                conn.request("HEAD", target, headers={"Accept-Encoding": "identity", **auth})
                with conn.getresponse() as resp:
                    location = resp.getheader("Location")
                    if resp.status in (301, 302, 303, 307, 308) and location:
                        url = _follow(url, location)
                        continue
                    if resp.status >= 400:
                        raise _status_error(url, resp.status, resp.reason)
                    length = resp.getheader("Content-Length")
                    return int(length) if length and length.isdigit() else None
        except _TRANSPORT as exc:
            raise UnavailableError(f"cannot reach {redact_url(url)}: {exc}") from None
    raise UnavailableError(f"{redact_url(url)}: more than {MAX_REDIRECTS} redirects; check the URL")


def read_range(url: str, start: int, length: int, timeout: float = 60.0) -> bytes:
    """Up to ``length`` bytes of ``url`` from ``start``: fewer only at the end of the file.

    The head of a GGUF file on the mirror, read at add time without moving its
    weights. A server that ignores Range is read only from the start (and only
    as far as asked); past the start it is refused, since reaching the range
    would mean downloading everything before it.
    """
    last = start + length - 1
    try:
        with _request(url, {"Range": f"bytes={start}-{last}"}, timeout) as (final, resp):
            if resp.status == 416:  # starts past the end of the file
                return b""
            if resp.status >= 400:
                raise _status_error(final, resp.status, resp.reason)
            if resp.status != 206 and start:
                raise LlmgwError(f"{redact_url(final)}: the server ignores Range requests "
                                 f"(HTTP {resp.status}), so part of the file cannot be read "
                                 "without downloading all of it")
            return resp.read(length)
    except _TRANSPORT as exc:
        raise UnavailableError(f"cannot reach {redact_url(url)}: {exc}") from None


def _mirror_sum(url: str, timeout: float) -> str | None:
    """The digest in ``<url>.sha256``, None when the mirror has none."""
    with _request(url + layout.SIDECAR, {}, timeout) as (_, resp):
        if resp.status == 404:
            return None
        body = resp.read(4096)
        if resp.status != 200:
            raise _RetryableError(f"{redact_url(url)}{layout.SIDECAR}: HTTP {resp.status} "
                                  f"{resp.reason}")
    digest = layout.parse_sidecar(body.decode("utf-8", "replace"))
    if digest is None:
        raise LlmgwError(f"{redact_url(url)}{layout.SIDECAR} holds no sha256 digest; fix or "
                         "remove it on the mirror")
    return digest


def _content_range(value: str | None) -> tuple[int | None, int | None]:
    """(first byte, total) of a Content-Range header; None where absent or '*'."""
    if not value or not value.startswith("bytes "):
        return None, None
    span, _, total = value[6:].partition("/")
    first = int(span.split("-")[0]) if span[:1].isdigit() else None
    return first, int(total) if total.isdigit() else None


# -- the part file --------------------------------------------------------------------------

class _Part:
    """``DEST.part``, its metadata and a running sha256 of what it holds."""

    def __init__(self, dest: Path, url: str) -> None:
        self.path = dest.with_name(dest.name + ".part")
        self.meta_path = dest.with_name(dest.name + ".part.json")
        url = redact_url(url)  # the password is not written to disk
        self.meta = _PartMeta(url=url)
        self.hasher = hashlib.sha256()
        try:
            old = msgspec.json.decode(self.meta_path.read_bytes(), type=_PartMeta)
        except (OSError, msgspec.DecodeError):
            old = None
        if old is not None and old.url == url and self.path.exists():
            self.meta = old
            with self.path.open("rb") as f:  # the hash must cover the bytes resumed from
                while chunk := f.read(BUFFER):
                    self.hasher.update(chunk)
        else:
            self.reset()

    @property
    def size(self) -> int:
        try:
            return self.path.stat().st_size
        except FileNotFoundError:
            return 0

    def reset(self, validator: str | None = None, total: int | None = None) -> None:
        with _disk(self.path):
            self.path.write_bytes(b"")
        self.hasher = hashlib.sha256()
        self.save(validator, total)

    def save(self, validator: str | None, total: int | None) -> None:
        self.meta = _PartMeta(url=self.meta.url, validator=validator, total=total)
        with _disk(self.meta_path):
            self.meta_path.write_bytes(msgspec.json.encode(self.meta))

    def discard(self) -> None:
        for p in (self.path, self.meta_path):
            p.unlink(missing_ok=True)


def _receive(resp: http.client.HTTPResponse, part: _Part, progress: Progress | None,
             total: int | None) -> int:
    """Append the body to the part; the number of bytes received."""
    buf = bytearray(BUFFER)
    view = memoryview(buf)
    got = 0
    done = part.size
    # Unbuffered: what was received is on disk at once, so a task killed at any
    # moment leaves a part that holds exactly the bytes its hash covers.
    with _disk(part.path):
        fd = os.open(part.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    try:
        while True:
            try:
                # readinto1: one socket read at most, so bytes reach the disk as they
                # arrive rather than once a whole buffer has filled.
                n = resp.readinto1(view)
            except _TRANSPORT as exc:
                raise _RetryableError(f"the transfer broke after {got} bytes: {exc}") from None
            if not n:
                break
            written = 0
            with _disk(part.path):
                while written < n:
                    written += os.write(fd, view[written:n])
            part.hasher.update(view[:n])
            got += n
            done += n
            if progress is not None:
                progress(done, total)
        with _disk(part.path):
            os.fsync(fd)
    finally:
        os.close(fd)
    return got


def _attempt(url: str, part: _Part, timeout: float, progress: Progress | None) -> bool:
    """One request; True when the part now holds the whole file."""
    offset = part.size
    headers: dict[str, str] = {}
    if offset:
        headers["Range"] = f"bytes={offset}-"
        if part.meta.validator:
            headers["If-Range"] = part.meta.validator
    with _request(url, headers, timeout) as (final, resp):
        if final.endswith("/") and not url.endswith("/"):
            shown = redact_url(url)
            raise DefinitionError(f"{shown} is a directory on the mirror; fetch {shown}/ to "
                                  "fetch every file in it", field="url")
        validator = resp.getheader("ETag") or resp.getheader("Last-Modified")
        length = resp.getheader("Content-Length")
        body_len = int(length) if length and length.isdigit() else None
        if resp.status == 200:
            total = body_len
            if offset:  # the range was ignored, or the file changed: start over
                part.reset(validator, total)
                offset = 0
        elif resp.status == 206:
            first, total = _content_range(resp.getheader("Content-Range"))
            if part.meta.validator and validator != part.meta.validator:
                # A server that honours Range but not If-Range sends the rest of a
                # changed file: splicing it onto the old bytes makes a file that
                # never existed. Compare the validators ourselves and start over.
                was = part.meta.validator
                part.reset()
                raise _RetryableError(f"the file changed on the server ({was}, now "
                                      f"{validator}) and it ignored If-Range; starting over")
            if first != offset or total is None:
                part.reset()
                raise _RetryableError(f"asked for bytes from {offset} and got "
                               f"Content-Range {resp.getheader('Content-Range')!r}")
        elif resp.status == 416:
            _, total = _content_range(resp.getheader("Content-Range"))
            if total is not None and total == offset and part.meta.total in (None, total):
                return True
            part.reset()
            raise _RetryableError(f"the server refused bytes={offset}- (HTTP 416) for a file of "
                           f"{total} bytes; starting over")
        elif resp.status >= 500:
            raise _RetryableError(f"HTTP {resp.status} {resp.reason}")
        else:
            raise _status_error(url, resp.status, resp.reason)
        if part.meta.total is not None and total is not None and total != part.meta.total \
                and offset:
            announced = part.meta.total
            part.reset(validator, total)
            raise _RetryableError(f"the server's answers disagree about the length: {announced} "
                           f"bytes, then {total}; starting over")
        part.save(validator, total)
        got = _receive(resp, part, progress, total)
        if body_len is not None and got < body_len:
            raise _RetryableError(f"the server promised {body_len} bytes (Content-Length) but the "
                           f"connection ended after {got}")
    size = part.size
    if total is None:
        return True  # no length announced: the end of the body is the end of the file
    if size > total:
        part.discard()
        raise LlmgwError(f"{redact_url(url)}: the server announced {total} bytes but sent "
                         f"{size}; the "
                         "partial file was removed. The server is misreporting "
                         "Content-Length; check the mirror")
    return size == total


# -- the public operation -------------------------------------------------------------------

@contextlib.contextmanager
def _locked(dest: Path, notify: Notify) -> Iterator[None]:
    lock_path = dest.with_name(dest.name + ".lock")
    while True:
        with _disk(lock_path):
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            notify(f"waiting for another fetch of {dest} (lock {lock_path} is held)")
            fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            current = os.stat(lock_path)
        except FileNotFoundError:
            current = None
        held = os.fstat(fd)
        if current is not None and (current.st_dev, current.st_ino) == (held.st_dev,
                                                                         held.st_ino):
            break
        os.close(fd)   # the holder removed it while this one waited: lock the path anew
    try:
        yield
    finally:
        # Removed while still held: a waiter finds its inode gone and starts over.
        with contextlib.suppress(FileNotFoundError):
            lock_path.unlink()
        os.close(fd)  # closing the descriptor releases the lock


def _hash_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(BUFFER):
            h.update(chunk)
    return h.hexdigest()


def _write_sidecar(dest: Path, digest: str) -> None:
    side = dest.with_name(dest.name + layout.SIDECAR)
    tmp = side.with_name(side.name + ".tmp")
    tmp.write_text(layout.format_sidecar(digest, dest.name))
    tmp.replace(side)


def _already_there(dest: Path, expected: str | None, notify: Notify) -> FetchResult | None:
    """``dest`` if it is in place and (when a sum is asked for) holds that sum."""
    if not dest.is_file():
        return None
    size = dest.stat().st_size
    side = dest.with_name(dest.name + layout.SIDECAR)
    recorded = layout.parse_sidecar(side.read_text()) if side.is_file() else None
    if expected is None:
        # Only a verified file is ever renamed to its final name.
        return FetchResult(path=str(dest), size=size, sha256=recorded or "", transferred=0,
                           verified=False)
    if recorded != expected:
        recorded = _hash_file(dest)
        if recorded != expected:
            notify(f"{dest} holds sha256 {recorded}, not {expected}; fetching it again")
            dest.unlink()
            return None
        _write_sidecar(dest, recorded)
    return FetchResult(path=str(dest), size=size, sha256=recorded, transferred=0, verified=True)


def fetch_file(url: str, dest: Path, *, sha256: str | None = None, retries: int = 8,
               backoff: float = 0.5, timeout: float = 60.0, notify: Notify = _noop,
               progress: Progress | None = None) -> FetchResult:
    """Download one file to ``dest``, resuming, verifying and renaming into place."""
    with _disk(dest.parent):
        dest.parent.mkdir(parents=True, exist_ok=True)
    expected = sha256.lower() if sha256 else None
    with _locked(dest, notify):
        done = _already_there(dest, expected, notify)
        if done is not None:
            return done
        shown = redact_url(url)
        source = "--sha256" if expected else shown + layout.SIDECAR
        need_sum = expected is None
        failures, problem = 0, ""
        problems: list[str] = []  # distinct, in order: the error tells the whole story
        part: _Part | None = None
        # Progress is a new high-water mark, not merely more than the last attempt:
        # a server that sends the same bytes, then forces a restart, makes none.
        best = 0
        while True:
            try:
                if need_sum:
                    expected = _mirror_sum(url, timeout)
                    need_sum = False
                    if expected is None:
                        notify(f"no {source} on the mirror; verifying the length only")
                if part is None:
                    part = _Part(dest, url)
                    best = part.size
                if _attempt(url, part, timeout, progress):
                    break
                problem = f"the transfer ended at byte {part.size}"
            except _RetryableError as exc:
                problem = str(exc)
            except _TRANSPORT as exc:
                problem = f"cannot reach the server: {exc}"
            if problem not in problems:
                problems.append(problem)
            if part is not None and part.size > best:
                best = part.size
                failures = 0
                continue  # progress: resume at once
            failures += 1
            if failures > retries:
                kept = (f"The partial download is kept in {part.path} and resumes on the next "
                        "run; " if part is not None and part.size else "")
                raise UnavailableError(
                    f"{shown}: giving up after {failures} attempts without progress: "
                    f"{'; then '.join(problems[-3:])}. {kept}Check that the mirror is up "
                    "and serving this file"
                )
            notify(f"{shown}: {problem}; retrying")
            time.sleep(min(backoff * 2 ** (failures - 1), 30.0))

        digest = part.hasher.hexdigest()
        size = part.size
        if expected is not None and digest != expected:
            part.discard()
            raise LlmgwError(
                f"{shown}: sha256 mismatch: expected {expected} (from {source}), got {digest} "
                f"for {size} bytes; the partial file was removed. Check the mirror's copy "
                "with `sha256sum -c` beside it, or the sum given"
            )
        with _disk(dest):
            os.replace(part.path, dest)
            _write_sidecar(dest, digest)
            part.meta_path.unlink(missing_ok=True)
            dir_fd = os.open(dest.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        return FetchResult(path=str(dest), size=size, sha256=digest, transferred=size,
                           verified=expected is not None)


class _Listing(msgspec.Struct):
    entries: list[dict[str, object]]


def _listing(url: str, timeout: float) -> _Listing:
    """The JSON listing of the mirror directory ``url`` (ending in '/')."""
    try:
        with _request(url, {"Accept": "application/json"}, timeout) as (_, resp):
            body = resp.read()
            if resp.status != 200:
                raise _status_error(url, resp.status, resp.reason)
        return msgspec.json.decode(body, type=_Listing)
    except _TRANSPORT as exc:
        raise UnavailableError(f"{redact_url(url)}: cannot read the directory listing: "
                               f"{exc}") from None
    except msgspec.DecodeError:
        raise LlmgwError(f"{redact_url(url)}: the answer is not a mirror directory listing; "
                         "is this an "
                         "`llmgw mirror serve` URL?") from None


def listed_files(url: str, timeout: float = 60.0) -> list[str]:
    """The names of the files directly in the mirror directory ``url`` (ending in '/')."""
    return sorted(str(e.get("name")) for e in _listing(url, timeout).entries
                  if e.get("type") == "file")


def _safe_name(name: object, url: str) -> str:
    if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\\" in name \
            or "\x00" in name or layout.is_hidden(name):
        raise LlmgwError(f"{redact_url(url)}: the listing names {name!r}, which is not a plain "
                         "file name; refusing to write it")
    return name


def fetch(url: str, dest: str | Path, *, sha256: str | None = None, retries: int = 8,
          backoff: float = 0.5, timeout: float = 60.0, notify: Notify = _noop,
          progress: Progress | None = None) -> list[FetchResult]:
    """Fetch a file, or a directory (a URL ending in '/': every file below it).

    A file URL with a ``dest`` that is an existing directory, or ends in '/',
    lands in that directory under its own name.
    """
    target = Path(dest)

    def one(file_url: str, file_dest: Path, digest: str | None = None) -> FetchResult:
        return fetch_file(file_url, file_dest, sha256=digest, retries=retries, backoff=backoff,
                          timeout=timeout, notify=notify, progress=progress)

    if not url.endswith("/"):
        if target.is_dir() or str(dest).endswith("/"):
            target = target / Path(urlsplit(url).path).name
        return [one(url, target, sha256)]
    if sha256:
        raise DefinitionError("--sha256 applies to one file; a directory's files are checked "
                              "against their .sha256 files on the mirror", field="sha256")
    listing = _listing(url, timeout)
    names = {str(e.get("name")) for e in listing.entries if e.get("type") == "file"}
    results: list[FetchResult] = []
    for entry in listing.entries:
        name = _safe_name(entry.get("name"), url)
        if entry.get("type") == "directory":
            results += fetch(url + quote(name) + "/", target / name, retries=retries,
                             backoff=backoff, timeout=timeout, notify=notify, progress=progress)
        elif entry.get("type") == "file":
            if name.endswith(layout.SIDECAR) and name[: -len(layout.SIDECAR)] in names:
                continue  # a checksum, used by the fetch of its file
            results.append(one(url + quote(name), target / name))
    return results


def remote_size(url: str, timeout: float = 60.0) -> int | None:
    """The bytes a fetch of ``url`` moves: a file's length, or the sum of a mirror
    directory's listed files (their checksum files left out); None when unknown."""
    if not url.endswith("/"):
        try:
            return head_length(url, timeout)
        except LlmgwError:
            return None
    try:
        entries = _listing(url, timeout).entries
    except LlmgwError:
        return None
    names = {str(e.get("name")) for e in entries if e.get("type") == "file"}
    total = 0
    for e in entries:
        name = str(e.get("name"))
        if e.get("type") == "directory":
            sub = remote_size(url + quote(name) + "/", timeout)
            if sub is None:
                return None
            total += sub
        elif e.get("type") == "file":
            if name.endswith(layout.SIDECAR) and name[: -len(layout.SIDECAR)] in names:
                continue
            size = e.get("size")
            if not isinstance(size, int):
                return None
            total += size
    return total
