"""Post, redirect, get: every form of the admin page answers with a redirect.

A page rendered as the answer to a POST cannot be reloaded: the browser
offers to send the form again (a second "create key" fails with "already
exists", a second roll-out replaces the replicas again), and its URL, opened
later or shared, is a POST-only route. So no form's answer here is a page.
Each one is a 303 to the GET page the form lives on, carrying what that page
must show in a short-lived cookie the next page consumes:

* success: the flash message (``llmgw.admin.session``);
* refusal: ``Refused``, the form's id, what was typed and every problem found
  (by field), so the page shows the form filled in as it was sent with each
  error beside its field (encrypted like a key: a pasted definition may hold
  an upstream's password);
* a new API key: ``Secret``, encrypted, shown once beside the form that asked
  for it.

**Why the key travels encrypted in a cookie.** The key must reach the GET
page, and the server keeps only its hash. Kept in this process's memory it
would be lost on any other instance behind a load balancer; kept in the
store, the plain key would sit in the database. In a cookie it lives only in
the browser that asked for it, for ``SECRET_LIFETIME`` seconds, until the
next page consumes it — encrypted, because cookies reach disk and proxies'
logs: AES-256-GCM (``cryptography``) under a key derived from the session's
by HMAC-SHA256, with a random 96-bit nonce per cookie, then sealed with the
session's flash MAC like every other cookie of the console. A cipher written
from hash functions was rejected: the standard library's HMAC can make one,
but an operator auditing the console should find a named, reviewed AEAD.

**Size.** A browser drops a cookie past 4 KB without a word, so what is
typed is compressed before sealing (``MAX_COOKIE``); a form that is still too
big (a model definition of several kilobytes) is answered with its page
directly, the one exception, as before.

A GET on a URL that only takes a POST (a bookmark, a reloaded old tab, a
link pasted from the history) redirects to the page holding that form:
``landing`` makes that route for each action.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from litestar import Request, get
from litestar.connection import ASGIConnection
from litestar.datastructures import Cookie
from litestar.handlers import HTTPRouteHandler
from litestar.response import Redirect

from llmgw.admin.session import Session, admin_cookie, expired_cookie, flash_key, seal, unseal

FORM_COOKIE = "llmgw_admin_form"
_NONCE = 12  # bytes: GCM's standard nonce (NIST SP 800-38D)
SECRET_COOKIE = "llmgw_admin_secret"  # noqa: S105 - a cookie name, not a secret
# Long enough for a slow redirect on a loaded machine; short enough that an
# unread key does not linger in a browser profile.
FORM_LIFETIME = 120
SECRET_LIFETIME = 120
# A cookie's name, value and attributes must fit in 4096 bytes.
MAX_COOKIE = 3600
# Fields never carried back to a form: the CSRF token is the page's own, and a
# token or key typed into a form is not written into a cookie.
NOT_CARRIED = frozenset({"csrf", "token", "key"})
_SECRET_LABEL = b"llmgw admin secret v1"


class _Refused(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    form: str
    values: dict[str, str]
    errors: list[tuple[str, str]]


class _Secret(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    form: str
    label: str
    sealed: bytes


@dataclass(frozen=True)
class FormState:
    """What a form shows: the values it was sent with and each problem, by field.

    The empty state (``FormState.blank(id)``) is what a form shows when nothing was
    carried back to it: its defaults and no error.
    """

    form: str
    values: Mapping[str, str] = field(default_factory=dict)
    errors: Sequence[tuple[str, str]] = ()

    @classmethod
    def blank(cls, form: str) -> FormState:
        return cls(form=form)

    @property
    def refused(self) -> bool:
        return bool(self.errors)

    def value(self, name: str, default: object = "") -> str:
        """What was typed into ``name``, or ``default`` (the value in force) when nothing
        was carried back."""
        if self.refused:
            return self.values.get(name, "")
        return "" if default is None else str(default)

    def error(self, name: str) -> list[str]:
        """The problems found with field ``name``."""
        return [message for f, message in self.errors if f == name]

    def others(self, names: Sequence[str]) -> list[str]:
        """The problems about no field among ``names`` (the whole form's)."""
        return [message for f, message in self.errors if f not in names]


@dataclass(frozen=True)
class Shown:
    """A secret to show once, beside the form ``form``: ``label`` says what it is."""

    form: str
    label: str
    secret: str


# -- sealing ----------------------------------------------------------------------

def _secret_key(session: Session) -> bytes:
    return hmac.new(session.key, _SECRET_LABEL, hashlib.sha256).digest()


def _encrypt(session: Session, plain: bytes) -> bytes:
    nonce = secrets.token_bytes(_NONCE)
    return nonce + AESGCM(_secret_key(session)).encrypt(nonce, plain, None)


def _decrypt(session: Session, sealed: bytes) -> bytes | None:
    try:
        return AESGCM(_secret_key(session)).decrypt(sealed[:_NONCE], sealed[_NONCE:], None)
    except InvalidTag:
        return None


def seal_refused(session: Session, state: FormState) -> str:
    """Encrypted too: what was typed may hold a credential (an upstream URL's password
    in a pasted definition)."""
    body = _Refused(form=state.form, errors=list(state.errors),
                    values={k: v for k, v in state.values.items() if k not in NOT_CARRIED})
    return seal(flash_key(session),
                _encrypt(session, zlib.compress(msgspec.json.encode(body), 9)))


def open_refused(session: Session, value: str | None) -> FormState | None:
    raw = unseal(flash_key(session), value) if value else None
    plain = _decrypt(session, raw) if raw is not None else None
    if plain is None:
        return None
    try:
        body = msgspec.json.decode(zlib.decompress(plain), type=_Refused)
    except (zlib.error, msgspec.DecodeError, msgspec.ValidationError):
        return None
    return FormState(form=body.form, values=body.values, errors=body.errors)


def seal_secret(session: Session, shown: Shown) -> str:
    body = _Secret(form=shown.form, label=shown.label,
                   sealed=_encrypt(session, shown.secret.encode()))
    return seal(flash_key(session), msgspec.json.encode(body))


def open_secret(session: Session, value: str | None) -> Shown | None:
    raw = unseal(flash_key(session), value) if value else None
    if raw is None:
        return None
    try:
        body = msgspec.json.decode(raw, type=_Secret)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    plain = _decrypt(session, body.sealed)
    if plain is None:
        return None
    try:
        secret = plain.decode()
    except UnicodeDecodeError:
        return None
    return Shown(form=body.form, label=body.label, secret=secret)


def refused_cookie(connection: ASGIConnection[Any, Any, Any, Any], session: Session,
                   state: FormState) -> Cookie | None:
    """The cookie carrying ``state`` back to its form; None when it would not fit."""
    value = seal_refused(session, state)
    if len(value) > MAX_COOKIE:
        return None
    return admin_cookie(connection, FORM_COOKIE, value, FORM_LIFETIME)


def secret_cookie(connection: ASGIConnection[Any, Any, Any, Any], session: Session,
                  shown: Shown) -> Cookie:
    return admin_cookie(connection, SECRET_COOKIE, seal_secret(session, shown), SECRET_LIFETIME)


def back_to(to: str, cookie: Cookie) -> Redirect:
    """The answer to a refused form: to its page, with what it was sent and why not."""
    return Redirect(to, status_code=303, cookies=[cookie])


@dataclass
class Carried:
    """What the page a form redirected to shows, read from (and clearing) the cookies."""

    refused: FormState | None = None
    shown: Shown | None = None
    cookies: list[Cookie] = field(default_factory=list)

    def form(self, form_id: str) -> FormState:
        if self.refused is not None and self.refused.form == form_id:
            return self.refused
        return FormState.blank(form_id)

    def secret(self, form_id: str) -> Shown | None:
        return self.shown if self.shown is not None and self.shown.form == form_id else None


def carried(request: Request[Any, Any, Any], session: Session | None) -> Carried:
    """Read and consume what a redirect carried; a page shows it once."""
    out = Carried()
    if session is None:
        return out
    if FORM_COOKIE in request.cookies:
        out.refused = open_refused(session, request.cookies.get(FORM_COOKIE))
        out.cookies.append(expired_cookie(request, FORM_COOKIE))
    if SECRET_COOKIE in request.cookies:
        out.shown = open_secret(session, request.cookies.get(SECRET_COOKIE))
        out.cookies.append(expired_cookie(request, SECRET_COOKIE))
    return out


# -- GET on a POST-only URL ----------------------------------------------------------

def landing(path: str, to: str) -> HTTPRouteHandler:
    """A GET route at ``path`` (a form's action) redirecting to ``to``, the page holding
    that form; ``to`` may name the path's parameters (``/admin/models/{name}``)."""

    async def go(request: Request[Any, Any, Any]) -> Redirect:
        return Redirect(to.format(**request.path_params), status_code=303)

    return get(path, name=f"landing {path}")(go)
