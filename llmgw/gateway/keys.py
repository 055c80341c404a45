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

A runtime key may expire, and may have been rotated: ``ApiKey.valid_for``
accepts its current secret until it expires and the secret a rotation
replaced until the grace period chosen then ends (``llmgw.tenancy``). Keys
with neither take the lookup's old path, with no clock read.

Rate limits are per gateway process (a token bucket per key, refilled at
``rpm``/60 per second, holding at most one minute's allowance). Sharing them
through the store would put a database write on every request; with several
gateway instances behind a balancer the effective limit is the sum.
"""

from __future__ import annotations

import contextlib
import fcntl
import hmac
import ipaddress
import logging
import os
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import msgspec

from llmgw.errors import ConfigError, DefinitionError, NotFoundError, RefusedError
from llmgw.store.base import OwnerId
from llmgw.tenancy import (
    BUDGET_FIELDS,
    DEFAULT_LOG_DAYS,
    FILE_TEAM,
    KEY_PREFIX,
    BudgetField,
    KeyEntry,
    KeysFile,
    Limits,
    Priority,
    RuntimeKey,
    RuntimeTeam,
    check_key_name,
    effective,
    generate_key,
    hash_key,
    key_id,
    read_keys_file,
)

log = logging.getLogger("llmgw.gateway.keys")

# The keys file's format and reader live in llmgw.tenancy (the control plane reads
# it too); they are also this module's, where the gateway and `llmgw keys` find them.
__all__ = ["KEY_PREFIX", "OPEN_ACCESS", "ApiKey", "KeyEntry", "KeyRing", "KeysFile",
           "KeysFileWatcher", "add_key", "generate_key", "hash_key", "is_loopback",
           "read_keys_file", "revoke_key"]


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
    check_key_name(name)
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
    team: str = FILE_TEAM
    # A runtime key's own budgets and its team's (``budgets``); None for file keys.
    limits: Limits | None = None
    team_limits: Limits | None = None
    budgeted: bool = False          # the key or its team has a token budget
    log_requests: str = "off"       # the team's request logs: off, metadata or bodies
    log_days: int = DEFAULT_LOG_DAYS
    # The team's request-rate bucket, shared by its keys; None: no team limit.
    team_gate: ApiKey | None = None
    tokens: float = 0.0
    refilled_at: float = field(default=-1.0)
    # A runtime key's id once rotated (its first secret's); "": key_id(sha256).
    owner_id: str = ""
    expires_at: float | None = None         # refused from then on
    previous_sha256: str | None = None      # a rotation's old secret, accepted ...
    previous_until: float | None = None     # ... until then

    @property
    def id(self) -> str:
        """The key's immutable id (``tenancy.key_id``, kept through rotations); "" for
        open access."""
        if self.owner_id:
            return self.owner_id
        return key_id(self.sha256) if self.sha256 else ""

    def valid_for(self, digest: str, now: float) -> bool:
        """Whether a presented secret of SHA-256 ``digest`` opens this key at ``now``: the
        current secret until the key expires, the replaced one until its grace ends."""
        if self.expires_at is not None and now >= self.expires_at:
            return False
        if hmac.compare_digest(self.sha256, digest):
            return True
        return (self.previous_sha256 is not None and self.previous_until is not None
                and now < self.previous_until
                and hmac.compare_digest(self.previous_sha256, digest))

    @property
    def owner(self) -> OwnerId:
        """Who owns what this key creates: the one way an endpoint names the caller to the
        store's owner checks (``keys.ApiKey.owner``)."""
        return OwnerId(self.id)

    def allows(self, model: str) -> bool:
        return self.models is None or model in self.models

    def admit(self, now: float) -> float:
        """0 if a request may go now (and count it), else seconds until one may."""
        gate = self.team_gate
        if gate is not None:
            wait = gate.admit(now)
            if wait > 0:
                return wait
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
    """The keys in force, looked up by the hash of what a request presents.

    Two sources: the keys file's entries and the runtime teams and keys from
    the store. The file wins a conflict of name or hash; the runtime key is
    left out (logged once per change).
    """

    def __init__(self, entries: Sequence[KeyEntry] = ()) -> None:
        self._by_hash: dict[str, ApiKey] = {}
        # Rotated keys by the secret they replaced, while it is still accepted.
        self._previous: dict[str, ApiKey] = {}
        self._by_id: dict[str, ApiKey] = {}
        self._file: list[KeyEntry] = list(entries)
        self._teams: dict[str, RuntimeTeam] = {}
        self._runtime: list[RuntimeKey] = []
        self._rebuild()

    def replace(self, entries: Sequence[KeyEntry]) -> None:
        """Swap in a new set of file keys, keeping the buckets of keys that stay."""
        self._file = list(entries)
        self._rebuild()

    def replace_runtime(self, teams: dict[str, RuntimeTeam], keys: Sequence[RuntimeKey]) -> None:
        """Swap in the runtime teams and keys, keeping the buckets of those that stay."""
        self._teams = dict(teams)
        self._runtime = list(keys)
        self._rebuild()

    def team(self, name: str) -> RuntimeTeam | None:
        return self._teams.get(name)

    def teams(self) -> list[RuntimeTeam]:
        """The runtime teams in force (the keys file has none: its keys carry no budget)."""
        return list(self._teams.values())

    def _rebuild(self) -> None:
        old = {k.name: k for k in self._by_hash.values()}
        old_gates = {k.team_gate.name: k.team_gate for k in self._by_hash.values()
                     if k.team_gate is not None}
        fresh: dict[str, ApiKey] = {}
        names: set[str] = set()
        for e in self._file:
            key = ApiKey(name=e.name, sha256=e.sha256,
                         models=frozenset(e.models) if e.models else None, rpm=e.rpm,
                         priority=e.priority)
            _keep_bucket(key, old.get(e.name))
            fresh[e.sha256] = key
            names.add(e.name)
        gates: dict[str, ApiKey] = {}
        previous: dict[str, ApiKey] = {}
        for r in self._runtime:
            team = self._teams.get(r.team)
            if team is None:
                continue
            if r.name in names or r.sha256 in fresh:
                log.warning("runtime key %r is ignored: the keys file has a key of that name "
                            "or value, and the file wins", r.name)
                continue
            limits = effective(team.limits, r.limits)
            gate = gates.get(team.name)
            if gate is None and team.limits.rpm is not None:
                gate = gates[team.name] = ApiKey(name=team.name, sha256="", models=None,
                                                 rpm=team.limits.rpm)
                _keep_bucket(gate, old_gates.get(team.name))
            key = ApiKey(name=r.name, sha256=r.sha256,
                         models=frozenset(limits.models) if limits.models is not None else None,
                         rpm=limits.rpm, priority=limits.priority or "interactive",
                         team=team.name, limits=r.limits, team_limits=team.limits,
                         budgeted=r.limits.has_budget() or team.limits.has_budget(),
                         log_requests=team.limits.log_requests or "off",
                         log_days=team.limits.log_retention_days or DEFAULT_LOG_DAYS,
                         team_gate=gate, owner_id=r.owner or "", expires_at=r.expires_at,
                         previous_sha256=r.previous_sha256, previous_until=r.previous_until)
            _keep_bucket(key, old.get(r.name))
            fresh[r.sha256] = key
            if r.previous_sha256 is not None and r.previous_sha256 not in fresh:
                previous[r.previous_sha256] = key
            names.add(r.name)
        self._by_hash = fresh
        self._previous = previous
        self._by_id = {k.id: k for k in fresh.values()}
        self._budget_fields = {f for limits in [*(t.limits for t in self._teams.values()),
                                                *(r.limits for r in self._runtime)]
                               for f in BUDGET_FIELDS if limits.budget(f) is not None}

    def __len__(self) -> int:
        return len(self._by_hash)

    def cost_budgeted(self) -> bool:
        """Whether any runtime team in force has a cost budget."""
        return any(t.limits.has_cost_budget() for t in self._teams.values())

    def budget_fields(self) -> set[BudgetField]:
        """The budget periods any runtime team or key in force sets."""
        return self._budget_fields

    def named(self, name: str) -> ApiKey | None:
        return next((k for k in self._by_hash.values() if k.name == name), None)

    def by_id(self, id: str) -> ApiKey | None:
        """The key in force whose id is ``id``: never another key that took its name."""
        return self._by_id.get(id)

    def owners(self) -> dict[str, str]:
        """The id of each key in force, by name (the keys file's and the runtime ones)."""
        return {k.name: k.id for k in self._by_hash.values()}

    def lookup(self, presented: str, now: float | None = None) -> ApiKey | None:
        """The key a presented secret opens at ``now`` (wall-clock seconds, default now):
        None for an unknown, expired or revoked one, or a rotated-away secret past its
        grace period."""
        digest = hash_key(presented)
        key = self._by_hash.get(digest) or self._previous.get(digest)
        if key is None:
            return None
        if key.expires_at is None and key.previous_sha256 is None:
            # The common case, and the hot path: no clock read.
            return key if hmac.compare_digest(key.sha256, digest) else None
        return key if key.valid_for(digest, time.time() if now is None else now) else None


def _keep_bucket(key: ApiKey, prev: ApiKey | None) -> None:
    if prev is not None and prev.sha256 == key.sha256 and prev.rpm == key.rpm:
        key.tokens, key.refilled_at = prev.tokens, prev.refilled_at


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
