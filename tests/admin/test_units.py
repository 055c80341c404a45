"""The admin page's pure parts: finding an error's line in YAML, and signed sessions."""

from __future__ import annotations

import pytest

from llmgw.admin import session as sessions
from llmgw.admin.chart import nice_ticks
from llmgw.admin.locate import excerpt, key_path, line_of
from llmgw.admin.signin import safe_next

YAML = """\
name: trial
source: hf://typo/x
engine: vllm
profiles:
  - name: small
    gpus: 1
  - name: big
    gpus: two
    env:
      A: b
scaling:
  min: 1
"""


def test_key_paths_split_into_keys_and_indexes() -> None:
    """``profiles[1].env.A`` walks a key, an index, then two keys."""
    assert key_path("profiles[1].env.A") == ["profiles", 1, "env", "A"]
    assert key_path("source") == ["source"]


@pytest.mark.parametrize(("field", "line"), [
    ("source", 2),
    ("profiles[1].gpus", 8),
    ("profiles[1]", 7),
    ("profiles[1].env.A", 10),
    ("scaling.min", 12),
    ("profiles[1].memory", 7),   # absent key: its nearest parent
    ("profiles[5].gpus", 4),     # index past the end: the list
    ("fallbacks", 1),            # absent at the top: the entry itself
])
def test_an_errors_field_is_found_on_its_line(field: str, line: int) -> None:
    """A key path points at the line holding that key, or at its nearest parent."""
    assert line_of(YAML, field) == line


def test_a_yaml_syntax_error_is_found_on_its_line_and_no_field_means_no_line() -> None:
    """Broken YAML points at the line of the problem; a fieldless error at none."""
    assert line_of("name: a\nprofiles: [\n  - x: 1\n", None) == 3
    assert line_of(YAML, None) is None
    assert line_of("", "source") is None


def test_the_excerpt_flags_one_line_with_context() -> None:
    """Two lines either side of the flagged one, numbered as an editor numbers them."""
    lines = excerpt(YAML, 8)
    assert [ln.number for ln in lines] == [6, 7, 8, 9, 10]
    assert [ln.number for ln in lines if ln.flagged] == [8]
    assert excerpt(YAML, 1)[0].number == 1


def test_a_session_round_trips_and_names_its_token() -> None:
    """A cookie issued for a token verifies under the configured tokens as its name."""
    value, issued = sessions.issue("tok-a", "alice", now=1000)
    found = sessions.verify({"tok-b": "bob", "tok-a": "alice"}, value, now=2000)
    assert found is not None
    assert found.name == "alice"
    assert found.csrf == issued.csrf
    assert "tok-a" not in value


def test_a_session_expires_and_cannot_be_altered() -> None:
    """After LIFETIME, or with any byte of its payload changed, a cookie is no session."""
    value, _ = sessions.issue("tok-a", "alice", now=1000)
    tokens = {"tok-a": "alice"}
    assert sessions.verify(tokens, value, now=1000 + sessions.LIFETIME) is None
    body, _, mac = value.partition(".")
    longer = sessions._b64(sessions._unb64(body).replace(b'"exp":', b'"exp":9'))
    assert sessions.verify(tokens, f"{longer}.{mac}", now=2000) is None
    assert sessions.verify({"tok-b": "alice"}, value, now=2000) is None


def test_flash_messages_are_bound_to_the_session() -> None:
    """A flash signed for one session is not read by another."""
    _, mine = sessions.issue("tok-a", "alice")
    _, theirs = sessions.issue("tok-b", "bob")
    sealed = sessions.seal_flash(mine, "ok", "added trial")
    assert sessions.read_flash(mine, sealed) == sessions.Flash(kind="ok", text="added trial")
    assert sessions.read_flash(theirs, sealed) is None
    assert sessions.read_flash(mine, "nonsense") is None


def test_a_flashs_notes_are_bounded_to_fit_a_cookie() -> None:
    """Ten long warnings become four, cut to 500 characters, and a line saying where the
    rest are: a cookie past 4 KB is dropped by the browser and the page would say nothing."""
    _, mine = sessions.issue("tok-a", "alice")
    notes = [f"profile p{i} " + "x" * 600 for i in range(10)]
    sealed = sessions.seal_flash(mine, "warn", "added trial", notes)
    assert len(sealed) < 4000
    flash = sessions.read_flash(mine, sealed)
    assert flash is not None
    assert [len(n) for n in flash.notes[:4]] == [500] * 4
    assert flash.notes[0].startswith("profile p0 ")
    assert flash.notes[0].endswith("…")
    assert flash.notes[4].startswith("and 6 more; `llmgw ctl model add` prints them all")


@pytest.mark.parametrize(("given", "goes"), [
    ("/admin/models/trial", "/admin/models/trial"),
    ("//evil.example/admin/", "/admin/models"),
    ("/admin/\\evil", "/admin/models"),
    ("https://evil.example/admin/", "/admin/models"),
    (None, "/admin/models"),
])
def test_only_admin_paths_are_followed_after_sign_in(given: str | None, goes: str) -> None:
    """``next`` is followed only to a path of this site's admin page."""
    assert safe_next(given) == goes


@pytest.mark.parametrize(("peak", "ticks"), [
    (0, [0, 1]), (7, [0, 2, 4, 6, 8]), (212_764, [0, 100_000, 200_000, 300_000]),
    (1_000, [0, 500, 1_000]),
])
def test_the_charts_y_ticks_are_round_and_cover_the_peak(peak: int, ticks: list[int]) -> None:
    """Steps of 1, 2 or 5 times a power of ten, from 0 to the first tick at or above it."""
    assert nice_ticks(peak) == ticks


def test_a_refused_form_and_a_new_key_travel_encrypted_and_bound_to_the_session() -> None:
    """What a redirect carries opens under its own session only, and neither the typed
    text nor the key is readable in the cookie."""
    from llmgw.admin.prg import (
        FormState,
        Shown,
        open_refused,
        open_secret,
        seal_refused,
        seal_secret,
    )

    _, mine = sessions.issue("t0ken-alice-0123456789", "alice")
    _, other = sessions.issue("t0ken-bob-9876543210", "bob")
    password = "hunter2-upstream"
    state = FormState("add-form", {"yaml": f"upstream: [https://u:{password}@x/v1]"},
                      [("upstream", "bad")])
    cookie = seal_refused(mine, state)
    assert password not in cookie
    assert password not in sessions.unseal(sessions.flash_key(mine), cookie).decode("latin-1")
    assert open_refused(mine, cookie) == state
    assert open_refused(other, cookie) is None
    key = "sk-llmgw-" + "ab" * 24
    sealed = seal_secret(mine, Shown("key-form", "key ci", key))
    assert key not in sealed
    assert open_secret(mine, sealed) == Shown("key-form", "key ci", key)
    assert open_secret(other, sealed) is None


def test_a_sealed_value_altered_under_a_valid_mac_does_not_open() -> None:
    """The cipher authenticates on its own: a body changed and re-sealed with the session's
    flash MAC (what a leaked MAC key would allow) is refused, not decrypted to garbage."""
    import msgspec

    from llmgw.admin.prg import Shown, open_secret, seal_secret

    _, mine = sessions.issue("t0ken-alice-0123456789", "alice")
    sealed = seal_secret(mine, Shown("key-form", "key ci", "sk-llmgw-" + "cd" * 24))
    body = msgspec.json.decode(sessions.unseal(sessions.flash_key(mine), sealed))
    raw = bytearray(msgspec.json.decode(msgspec.json.encode(body["sealed"]), type=bytes))
    raw[-1] ^= 1
    body["sealed"] = bytes(raw)
    forged = sessions.seal(sessions.flash_key(mine), msgspec.json.encode(body))
    assert open_secret(mine, forged) is None
