"""Key expiry and rotation as the gateway's key ring applies them (no I/O)."""

from __future__ import annotations

from llmgw.gateway.keys import KeyRing, generate_key, hash_key
from llmgw.tenancy import Limits, RuntimeKey, RuntimeTeam, key_id

NOW = 1_800_000_000.0


def ring_with(**fields: object) -> tuple[KeyRing, str, str]:
    old, new = generate_key(), generate_key()
    ring = KeyRing()
    ring.replace_runtime({"ml": RuntimeTeam(name="ml", limits=Limits())}, [RuntimeKey(
        name="ci", team="ml", sha256=hash_key(new), limits=Limits(), **fields)])  # type: ignore[arg-type]
    return ring, old, new


def test_a_rotated_keys_old_secret_works_until_its_grace_ends_and_the_id_stays() -> None:
    """After a rotation both secrets open the same key (same id) until the grace period
    ends; then only the new one does."""
    old, new = generate_key(), generate_key()
    first_id = key_id(hash_key(old))
    ring = KeyRing()
    ring.replace_runtime({"ml": RuntimeTeam(name="ml", limits=Limits())}, [RuntimeKey(
        name="ci", team="ml", sha256=hash_key(new), limits=Limits(),
        previous_sha256=hash_key(old), previous_until=NOW + 3600, owner=first_id)])
    before_new, before_old = ring.lookup(new, NOW), ring.lookup(old, NOW)
    assert before_new is not None
    assert before_old is before_new
    assert before_new.id == first_id
    assert ring.lookup(old, NOW + 3600) is None
    assert ring.lookup(new, NOW + 3600) is before_new
    assert len(ring) == 1
    assert ring.by_id(first_id) is before_new


def test_an_expired_key_is_refused_from_its_expiry_on() -> None:
    """A key with expires_at opens until that instant and never after."""
    ring, _, new = ring_with(expires_at=NOW + 60)
    assert ring.lookup(new, NOW + 59.9) is not None
    assert ring.lookup(new, NOW + 60) is None


def test_a_secret_that_is_neither_current_nor_previous_is_refused() -> None:
    """The grace period opens the replaced secret only, not any other."""
    ring, old, new = ring_with(previous_sha256=hash_key("sk-llmgw-other"),
                               previous_until=NOW + 3600)
    assert ring.lookup(old, NOW) is None
    assert ring.lookup("sk-llmgw-other", NOW) is not None
    assert ring.lookup(new, NOW) is not None
