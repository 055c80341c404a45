"""API keys: the keys file, checking a request's key, and per-key rate limits.

The keys file is JSON on the control-plane host, written by ``llmgw keys
add|revoke`` and read by the gateway, which reloads it when it changes. It
holds, per key: a name, the SHA-256 of the key, the models the key may use
(empty: all), a requests-per-minute limit (absent: none) and a priority class
(``interactive``, the default, or ``batch``: when a model is saturated, its
admission queue serves interactive requests first). The key itself
is printed once by ``keys add`` and stored nowhere.

Why a plain SHA-256 and not a slow password hash: a key is 256 bits from
``secrets``, not something a person chose, so there is no dictionary to try
and 2**256 guesses is out of reach whatever the hash costs. A slow KDF (bcrypt,
scrypt, argon2) only defends low-entropy secrets; here it would add
milliseconds to every inference request and buy nothing.

Lookup is by hash (a dict), then the stored and computed digests are compared
with ``hmac.compare_digest``: the dict lookup already compares digests of the
presented key, not the key itself, and an attacker learns nothing useful from
the timing of a digest comparison; the constant-time compare makes that
property explicit rather than an argument in a comment.

Rate limits are per gateway process (a token bucket per key, refilled at
``rpm``/60 per second, holding at most one minute's allowance). Sharing them
through the store would put a database write on every request; with several
gateway instances behind a balancer the effective limit is the sum.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import ipaddress
import logging
import os
import re
import secrets
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import msgspec

from llmgw.errors import ConfigError, DefinitionError, NotFoundError, RefusedError
from llmgw.gateway.admission import Priority

log = logging.getLogger("llmgw.gateway.keys")

KEY_PREFIX = "sk-llmgw-"
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")


class KeyEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True,
               omit_defaults=True):
    """One key as stored: never the key itself."""

    name: str
    sha256: str                     # hex digest of the key
    models: list[str] = []          # empty: every model
    rpm: int | None = None          # requests per minute; None: unlimited
    priority: Priority = "interactive"
    created_at: datetime | None = None


class KeysFile(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    version: int = 1
    keys: list[KeyEntry] = []


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def generate_key() -> str:
    """A new key: 256 random bits, with a prefix that secret scanners can match."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


# ---------------------------------------------------------------- the file


def read_keys_file(path: str | Path) -> KeysFile:
    """The keys in ``path``; an absent file has none. ConfigError naming the file if it is bad."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        return KeysFile()
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read the keys file: {exc.strerror}",
                          field="keys_file") from None
    if not data.strip():
        return KeysFile()
    try:
        return msgspec.json.decode(data, type=KeysFile)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ConfigError(
            f"{p}: not a valid keys file ({exc}); fix or restore it, or remove it and add "
            "the keys again with `llmgw keys add`", field="keys_file",
        ) from None


def _write_keys_file(path: Path, content: KeysFile) -> None:
    """Replace the file atomically (a reader sees the old or the new file, never half)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(msgspec.json.format(msgspec.json.encode(content), indent=2) + b"\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[KeysFile]:
    """Read-modify-write under an exclusive lock, so two ``keys add`` cannot lose one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{path}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield read_keys_file(path)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def add_key(path: str | Path, name: str, models: Sequence[str] = (),
            rpm: int | None = None, priority: Priority = "interactive") -> str:
    """Create a key named ``name``; returns the key, which is not stored anywhere."""
    if not NAME_RE.match(name):
        raise DefinitionError(
            f"key name {name!r}: use letters, digits, '_', '.', '@' or '-' "
            "(at most 64, starting with a letter or digit)", field="name")
    if rpm is not None and rpm < 1:
        raise DefinitionError(f"--rpm {rpm}: a limit must be at least 1 request per minute; "
                              "omit --rpm for no limit", field="rpm")
    p = Path(path)
    with _locked(p) as content:
        if any(k.name == name for k in content.keys):
            raise RefusedError(f"a key named {name!r} already exists in {p}; revoke it first "
                               "(`llmgw keys revoke NAME`) or choose another name")
        key = generate_key()
        entry = KeyEntry(name=name, sha256=hash_key(key), models=sorted(set(models)), rpm=rpm,
                         priority=priority, created_at=datetime.now(UTC).replace(microsecond=0))
        content.keys.append(entry)
        _write_keys_file(p, content)
    return key


def revoke_key(path: str | Path, name: str) -> None:
    p = Path(path)
    with _locked(p) as content:
        kept = [k for k in content.keys if k.name != name]
        if len(kept) == len(content.keys):
            known = ", ".join(k.name for k in content.keys) or "none"
            raise NotFoundError(f"no key named {name!r} in {p} (keys: {known})")
        content.keys = kept
        _write_keys_file(p, content)


# ---------------------------------------------------------------- checking requests


@dataclass(slots=True)
class ApiKey:
    """A key as the gateway holds it, with its rate-limit bucket."""

    name: str
    sha256: str
    models: frozenset[str] | None       # None: every model
    rpm: int | None
    priority: Priority = "interactive"
    tokens: float = 0.0
    refilled_at: float = field(default=-1.0)

    def allows(self, model: str) -> bool:
        return self.models is None or model in self.models

    def admit(self, now: float) -> float:
        """0 if a request may go now (and count it), else seconds until one may."""
        if self.rpm is None:
            return 0.0
        rate = self.rpm / 60.0
        if self.refilled_at < 0:
            self.tokens = float(self.rpm)
        else:
            self.tokens = min(float(self.rpm), self.tokens + (now - self.refilled_at) * rate)
        self.refilled_at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / rate

    def refund(self) -> None:
        """Give back the request ``admit`` counted: it was refused (403) before any work."""
        if self.rpm is not None:
            self.tokens = min(float(self.rpm), self.tokens + 1.0)


def is_loopback(listen: str) -> bool:
    """Whether ``listen`` (HOST:PORT) only accepts connections from this machine."""
    host = listen.rpartition(":")[0].strip("[]") if ":" in listen else listen
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# The identity used when inference is open (no keys file, loopback listener).
OPEN_ACCESS = ApiKey(name="", sha256="", models=None, rpm=None)


class KeyRing:
    """The keys in force, looked up by the hash of what a request presents."""

    def __init__(self, entries: Sequence[KeyEntry] = ()) -> None:
        self._by_hash: dict[str, ApiKey] = {}
        self.replace(entries)

    def replace(self, entries: Sequence[KeyEntry]) -> None:
        """Swap in a new set of keys, keeping the buckets of keys that stay."""
        old = {k.name: k for k in self._by_hash.values()}
        fresh: dict[str, ApiKey] = {}
        for e in entries:
            key = ApiKey(name=e.name, sha256=e.sha256,
                         models=frozenset(e.models) if e.models else None, rpm=e.rpm,
                         priority=e.priority)
            prev = old.get(e.name)
            if prev is not None and prev.sha256 == e.sha256 and prev.rpm == e.rpm:
                key.tokens, key.refilled_at = prev.tokens, prev.refilled_at
            fresh[e.sha256] = key
        self._by_hash = fresh

    def __len__(self) -> int:
        return len(self._by_hash)

    def named(self, name: str) -> ApiKey | None:
        return next((k for k in self._by_hash.values() if k.name == name), None)

    def lookup(self, presented: str) -> ApiKey | None:
        digest = hash_key(presented)
        key = self._by_hash.get(digest)
        if key is None or not hmac.compare_digest(key.sha256, digest):
            return None
        return key


class KeysFileWatcher:
    """Reloads a KeyRing from its file when the file changes (checked by the caller's clock).

    A change is a different (mtime, size, inode): ``keys add`` replaces the
    file by rename, so even two writes within one mtime tick differ in inode.
    A file that has become unreadable or invalid leaves the keys in force
    (logged): a typo while editing by hand must not lock every client out.
    A file that has been removed means no keys.
    """

    def __init__(self, path: str | Path, ring: KeyRing) -> None:
        self.path = Path(path)
        self.ring = ring
        self._signature: tuple[int, int, int] | None = None

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def load(self) -> None:
        """First load: a bad file is a ConfigError, raised before the gateway serves."""
        self._signature = self._stat()
        content = read_keys_file(self.path)
        self.ring.replace(content.keys)
        if self._signature is None:
            log.warning("keys file %s does not exist yet: every inference request is refused "
                        "until a key is added with `llmgw keys add NAME`", self.path)

    def changed(self) -> KeysFile | None:
        """The file's new content if it changed since last seen (file I/O only), else None."""
        signature = self._stat()
        if signature == self._signature:
            return None
        try:
            content = read_keys_file(self.path)
        except ConfigError as exc:
            log.error("keeping the keys in force: %s", exc.message)  # noqa: TRY400
            self._signature = signature
            return None
        self._signature = signature
        return content

    def apply(self, content: KeysFile) -> None:
        """Put ``content`` in force (on the event loop, where requests read the ring)."""
        self.ring.replace(content.keys)
        log.info("reloaded %d key(s) from %s", len(content.keys), self.path)

    def check(self) -> bool:
        """Reload if the file changed; True when the keys in force were replaced."""
        content = self.changed()
        if content is None:
            return False
        self.apply(content)
        return True
