"""Signing in to the admin page: an admin token in, a signed session cookie out.

The page never keeps the admin token. Signing in checks the token against the
configured ones (the same constant-time ``identify`` the JSON API uses) and
sets a cookie holding only an expiry and a CSRF token, signed with HMAC-SHA256.

**Where the signing key comes from.** Each admin token yields its own key,
``HMAC(token, "llmgw admin session v1")``, and a cookie is accepted when it
verifies under one of them; the identity shown and recorded ("added by
alice") is that token's name. Deriving the key rather than drawing a random
one per process was chosen because the API is stateless: every instance
behind a load balancer derives the same keys from the same configuration, so
a session started on one instance is good on all of them, and a restart signs
nobody out. No extra secret has to be configured, distributed or rotated, and
revoking or rotating a token ends exactly the sessions it opened — its key is
gone. The alternatives weighed: a random per-process secret breaks sign-in
behind a load balancer; a configured ``session_secret`` is one more secret to
manage and outlives the tokens it is meant to stand for.

The consequences to know: the cookie is as strong as the token behind it (an
admin token should be long and random — a short one could be guessed offline
from a captured cookie); and sessions are stateless, so signing out deletes
the cookie in that browser but a copied cookie stays valid until it expires
(``LIFETIME``). Remove the token to end every session it opened.

The cookie is ``HttpOnly`` (no script reads it), ``SameSite=Strict`` (no
other site's page can make the browser send it) and ``Secure`` when the page
is served over https (directly, or behind a proxy that says so with
``X-Forwarded-Proto: https``). Its path is ``/admin``: the JSON API never sees
it and keeps taking only the ``Authorization: Bearer`` admin token.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import msgspec
from litestar.connection import ASGIConnection
from litestar.datastructures import Cookie

COOKIE = "llmgw_admin"
FLASH_COOKIE = "llmgw_admin_flash"
# Sign-in happens before there is a session to hold a CSRF token, so its form
# uses a double-submit cookie instead (see ``llmgw.admin.csrf``).
SIGNIN_COOKIE = "llmgw_admin_signin"
COOKIE_PATH = "/admin"
LIFETIME = 12 * 3600
_KEY_LABEL = b"llmgw admin session v1"
_FLASH_LABEL = b"llmgw admin flash v1"


class _Payload(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    exp: int
    csrf: str


class _Flash(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    kind: str
    text: str
    notes: list[str] = []


@dataclass(frozen=True)
class Session:
    """A signed-in browser: who it is, and the token its forms must carry."""

    name: str
    csrf: str
    expires: int
    # The key the cookie verified under; signs this session's flash messages.
    # Never handed to a template.
    key: bytes = field(repr=False)


@dataclass(frozen=True)
class Flash:
    """A one-shot message shown on the page a successful action redirects to."""

    kind: str   # "ok", "warn" (done, with notes to read) or "error"
    text: str
    notes: tuple[str, ...] = ()


# The flash travels in a cookie, which a browser drops silently past 4 KB;
# the notes beyond these bounds are summarised rather than sent.
FLASH_NOTES = 4
FLASH_NOTE_CHARS = 500


def _key(token: str, label: bytes = _KEY_LABEL) -> bytes:
    return hmac.new(token.encode(), label, hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def seal(key: bytes, payload: bytes) -> str:
    mac = hmac.new(key, payload, hashlib.sha256).digest()
    return f"{_b64(payload)}.{_b64(mac)}"


def unseal(key: bytes, value: str) -> bytes | None:
    body, dot, mac = value.partition(".")
    if not dot:
        return None
    try:
        payload, given = _unb64(body), _unb64(mac)
    except ValueError:
        return None
    expected = hmac.new(key, payload, hashlib.sha256).digest()
    return payload if hmac.compare_digest(expected, given) else None


def issue(token: str, name: str, *, now: float | None = None) -> tuple[str, Session]:
    """A new session for the holder of ``token`` (already identified as ``name``)."""
    expires = int(now if now is not None else time.time()) + LIFETIME
    payload = _Payload(exp=expires, csrf=secrets.token_urlsafe(32))
    key = _key(token)
    value = seal(key, msgspec.json.encode(payload))
    return value, Session(name=name, csrf=payload.csrf, expires=expires, key=key)


def verify(tokens: dict[str, str], value: str | None, *,
           now: float | None = None) -> Session | None:
    """The session ``value`` stands for, or None if it is forged, expired or orphaned.

    Every configured token's key is tried (there are a handful), so a cookie
    whose token was removed from the configuration no longer opens anything.
    """
    if not value:
        return None
    found: tuple[str, bytes, bytes] | None = None
    for token, name in tokens.items():
        key = _key(token)
        payload = unseal(key, value)
        if payload is not None:
            found = (name, key, payload)
    if found is None:
        return None
    name, key, raw = found
    try:
        decoded = msgspec.json.decode(raw, type=_Payload)
    except msgspec.DecodeError:
        return None
    if decoded.exp <= (now if now is not None else time.time()):
        return None
    return Session(name=name, csrf=decoded.csrf, expires=decoded.exp, key=key)


def served_over_https(connection: ASGIConnection[Any, Any, Any, Any]) -> bool:
    """True when the browser talks https to us or to the proxy in front of us.

    Trusting ``X-Forwarded-Proto`` here can only add the Secure flag; a client
    lying about it gets a cookie its own browser will not send back over http.
    """
    if connection.url.scheme == "https":
        return True
    return connection.headers.get("x-forwarded-proto", "").lower() == "https"


def admin_cookie(connection: ASGIConnection[Any, Any, Any, Any], key: str, value: str,
            max_age: int, path: str = COOKIE_PATH) -> Cookie:
    return Cookie(key=key, value=value, path=path, max_age=max_age, httponly=True,
                  samesite="strict", secure=served_over_https(connection))


def session_cookie(connection: ASGIConnection[Any, Any, Any, Any], value: str) -> Cookie:
    return admin_cookie(connection, COOKIE, value, LIFETIME)


def expired_cookie(connection: ASGIConnection[Any, Any, Any, Any], key: str,
                   path: str = COOKIE_PATH) -> Cookie:
    """A cookie that makes the browser forget ``key``."""
    return admin_cookie(connection, key, "", 0, path)


def signin_cookie(connection: ASGIConnection[Any, Any, Any, Any], value: str) -> Cookie:
    return admin_cookie(connection, SIGNIN_COOKIE, value, 3600, path=f"{COOKIE_PATH}/signin")


def flash_key(session: Session) -> bytes:
    return hmac.new(session.key, _FLASH_LABEL, hashlib.sha256).digest()


def _bounded(notes: list[str]) -> list[str]:
    kept = [n if len(n) <= FLASH_NOTE_CHARS else n[:FLASH_NOTE_CHARS - 1] + "…"
            for n in notes[:FLASH_NOTES]]
    if len(notes) > FLASH_NOTES:
        kept.append(f"and {len(notes) - FLASH_NOTES} more; `llmgw ctl model add` prints them "
                    "all, and the server logs them")
    return kept


def seal_flash(session: Session, kind: str, text: str, notes: list[str] | None = None) -> str:
    """A message for the next page; signed so no one else can put words on it."""
    flash = _Flash(kind=kind, text=text, notes=_bounded(notes or []))
    return seal(flash_key(session), msgspec.json.encode(flash))


def flash_cookie(connection: ASGIConnection[Any, Any, Any, Any], session: Session,
                 kind: str, text: str, notes: list[str] | None = None) -> Cookie:
    return admin_cookie(connection, FLASH_COOKIE, seal_flash(session, kind, text, notes), 60)


def read_flash(session: Session, value: str | None) -> Flash | None:
    if not value:
        return None
    raw = unseal(flash_key(session), value)
    if raw is None:
        return None
    try:
        f = msgspec.json.decode(raw, type=_Flash)
    except msgspec.DecodeError:
        return None
    return Flash(kind=f.kind, text=f.text, notes=tuple(f.notes))
