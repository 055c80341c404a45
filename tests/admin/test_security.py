"""The admin page's locks: session, CSRF, cookie flags, escaping, no secrets shown.

Plain HTTP against the real app in process, over a real SQLite store.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from litestar.testing import AsyncTestClient

from llmgw.admin import session as sessions
from llmgw.config import AdminToken
from llmgw.control.context import AppContext

from .conftest import (
    ADMIN_TOKEN,
    INFERENCE_KEY,
    OTHER_TOKEN,
    FleetBackend,
    cpu_yaml,
    csrf_of,
    make_app,
    make_config,
    sign_in,
)

PAGES = ["/admin/models", "/admin/models/prod-chat", "/admin/fleet", "/admin/add",
         "/admin/models/prod-chat/remove", "/admin/usage", "/admin/teams"]
FRAGMENTS = ["/admin/fragments/models", "/admin/fragments/models/prod-chat",
             "/admin/fragments/fleet"]
ACTIONS = ["/admin/add", "/admin/models/prod-chat/scale", "/admin/models/prod-chat/remove",
           "/admin/models/prod-chat/rollout", "/admin/signout"]


def set_cookie_headers(response: object) -> list[str]:
    return response.headers.get_list("set-cookie")  # type: ignore[attr-defined, no-any-return]


def session_cookie_header(response: object) -> str:
    found = [h for h in set_cookie_headers(response)
             if h.startswith(f"{sessions.COOKIE}=")]
    assert found, "no session cookie was set"
    return found[0]


async def test_pages_without_a_session_redirect_to_sign_in_and_come_back(
        client: AsyncTestClient) -> None:
    """Every page answers 303 to the sign-in page, naming itself as where to return."""
    for path in PAGES:
        r = await client.get(path, follow_redirects=False)
        assert r.status_code == 303, path
        assert r.headers["location"].startswith("/admin/signin?next=")
        assert path.replace("/", "%2F") in r.headers["location"]


async def test_actions_and_fragments_without_a_session_are_401_and_change_nothing(
        client: AsyncTestClient, ctx: AppContext, backend: FleetBackend) -> None:
    """POSTs and status fragments answer 401 without a session; nothing is done."""
    for path in FRAGMENTS:
        r = await client.get(path, follow_redirects=False)
        assert r.status_code == 401, path
    for path in ACTIONS:
        r = await client.post(path, data={"yaml": cpu_yaml("sneaky"), "min": "9",
                                          "confirm": "prod-chat", "csrf": "x"},
                              follow_redirects=False)
        assert r.status_code == 401, path
    assert "sneaky" not in ctx.models.catalog
    assert ctx.models.catalog.get("prod-chat").scaling.min == 2  # type: ignore[union-attr]
    assert backend.rollouts == []


@pytest.mark.parametrize("header", [f"Bearer {INFERENCE_KEY}", f"Bearer {ADMIN_TOKEN}"])
async def test_a_bearer_header_opens_no_admin_page(client: AsyncTestClient,
                                                   header: str) -> None:
    """Neither an inference key nor the admin token as a Bearer header opens a page or
    an action: the pages take the session cookie only."""
    r = await client.get("/admin/models", headers={"Authorization": header},
                         follow_redirects=False)
    assert r.status_code == 303
    r = await client.post("/admin/models/prod-chat/rollout", headers={"Authorization": header},
                          follow_redirects=False)
    assert r.status_code == 401
    # ...while the JSON API does take the admin token, and not the inference key.
    api = await client.get("/api/v1/models", headers={"Authorization": header})
    assert api.status_code == (200 if ADMIN_TOKEN in header else 401)


async def test_an_inference_key_cannot_sign_in(client: AsyncTestClient) -> None:
    """Signing in with an inference API key is refused (401) and sets no session cookie."""
    form = await client.get("/admin/signin")
    r = await client.post("/admin/signin", data={"csrf": csrf_of(form.text),
                                                 "token": INFERENCE_KEY},
                          follow_redirects=False)
    assert r.status_code == 401
    assert "not an admin token of this server" in r.text
    assert not any(h.startswith(f"{sessions.COOKIE}=") for h in set_cookie_headers(r))
    assert (await client.get("/admin/models", follow_redirects=False)).status_code == 303


async def test_with_no_admin_token_configured_sign_in_says_how_to_configure_one(
        tmp_path: Path, backend: FleetBackend) -> None:
    """A server without admin tokens offers no sign-in form and names the setting."""
    app, _ = make_app(tmp_path / "db.sqlite", backend, make_config(tokens=[]))
    async with AsyncTestClient(app) as c:
        r = await c.get("/admin/signin")
        assert "LLMGW_ADMIN_TOKENS" in r.text
        assert 'name="token"' not in r.text


async def test_the_session_cookie_is_httponly_samesite_strict_and_scoped_to_admin(
        client: AsyncTestClient) -> None:
    """Over http the cookie is HttpOnly, SameSite=Strict, Path=/admin, and not Secure."""
    form = await client.get("/admin/signin")
    r = await client.post("/admin/signin", data={"csrf": csrf_of(form.text),
                                                 "token": ADMIN_TOKEN},
                          follow_redirects=False)
    assert r.status_code == 303
    cookie = session_cookie_header(r).lower()
    assert "httponly" in cookie
    assert "samesite=strict" in cookie
    assert "path=/admin" in cookie
    assert "secure" not in cookie
    assert ADMIN_TOKEN.lower() not in cookie


async def test_the_session_cookie_is_secure_when_served_over_https(
        tmp_path: Path, backend: FleetBackend, client: AsyncTestClient) -> None:
    """Over https, or behind a TLS proxy saying X-Forwarded-Proto: https, cookies are Secure."""
    app, _ = make_app(tmp_path / "tls.db", backend)
    async with AsyncTestClient(app, base_url="https://admin.example") as tls:
        form = await tls.get("/admin/signin")
        r = await tls.post("/admin/signin", follow_redirects=False,
                           data={"csrf": csrf_of(form.text), "token": ADMIN_TOKEN})
        assert r.status_code == 303
        assert "; secure" in session_cookie_header(r).lower()
    proxied = await client.get("/admin/signin", headers={"X-Forwarded-Proto": "https"})
    signin_cookie = [h for h in set_cookie_headers(proxied)
                     if h.startswith(f"{sessions.SIGNIN_COOKIE}=")]
    assert signin_cookie
    assert "; secure" in signin_cookie[0].lower()


async def test_a_post_without_the_sessions_csrf_token_is_403_and_changes_nothing(
        admin: AsyncTestClient, ctx: AppContext) -> None:
    """Missing, wrong, or another session's CSRF token: 403, and the scale did not happen."""
    other = await sign_in(AsyncTestClient(admin.app))  # a different session's token
    for fields in ({}, {"csrf": "forged"}, {"csrf": other}):
        r = await admin.post("/admin/models/prod-chat/scale", data={"min": "7", **fields},
                             follow_redirects=False)
        assert r.status_code == 403, fields
        assert "CSRF token" in r.text
    r = await admin.post("/admin/add", data={"yaml": cpu_yaml("nope")},
                         follow_redirects=False)
    assert r.status_code == 403
    assert "nope" not in ctx.models.catalog
    assert ctx.models.catalog.get("prod-chat").scaling.min == 2  # type: ignore[union-attr]


async def test_sign_in_needs_its_double_submit_cookie(client: AsyncTestClient) -> None:
    """A sign-in POST not made from our sign-in form (no matching cookie) is 403."""
    r = await client.post("/admin/signin", data={"csrf": "guess", "token": ADMIN_TOKEN},
                          follow_redirects=False)
    assert r.status_code == 403
    assert not any(h.startswith(f"{sessions.COOKIE}=") for h in set_cookie_headers(r))


async def test_a_tampered_or_foreign_cookie_opens_nothing(client: AsyncTestClient) -> None:
    """A cookie with a changed payload, or signed for a token this server does not have,
    is not a session."""
    value, _ = sessions.issue(ADMIN_TOKEN, "alice")
    payload, _, mac = value.partition(".")
    tampered = f"{payload[:-2]}AA.{mac}"
    foreign, _ = sessions.issue(OTHER_TOKEN, "mallory")
    for cookie in (tampered, foreign, "garbage", ""):
        client.cookies.set(sessions.COOKIE, cookie, path="/admin")
        r = await client.get("/admin/models", follow_redirects=False)
        assert r.status_code == 303, cookie


async def test_a_session_works_on_every_instance_and_ends_with_its_token(
        tmp_path: Path, backend: FleetBackend) -> None:
    """Two instances with one configuration accept each other's sessions; an
    instance whose configuration no longer has that token refuses them."""
    db = tmp_path / "shared.db"
    first, _ = make_app(db, backend)
    second, _ = make_app(db, backend)
    rotated, _ = make_app(db, backend, make_config(
        tokens=[AdminToken(name="alice", token=OTHER_TOKEN)]))
    async with AsyncTestClient(first) as a:
        await sign_in(a)
        cookie = a.cookies.get(sessions.COOKIE)
    assert cookie
    async with AsyncTestClient(second) as b:
        b.cookies.set(sessions.COOKIE, cookie, path="/admin")
        r = await b.get("/admin/models", follow_redirects=False)
        assert r.status_code == 200
        assert "signed in as <b>alice</b>" in r.text
    async with AsyncTestClient(rotated) as c:
        c.cookies.set(sessions.COOKIE, cookie, path="/admin")
        assert (await c.get("/admin/models", follow_redirects=False)).status_code == 303


async def test_sign_out_forgets_the_cookie(admin: AsyncTestClient) -> None:
    """Signing out expires the session cookie; the next page asks to sign in again."""
    page = await admin.get("/admin/models")
    r = await admin.post("/admin/signout", data={"csrf": csrf_of(page.text)},
                         follow_redirects=False)
    assert r.status_code == 303
    assert "max-age=0" in session_cookie_header(r).lower()
    assert (await admin.get("/admin/models", follow_redirects=False)).status_code == 303


async def test_after_sign_in_only_admin_paths_are_followed(client: AsyncTestClient) -> None:
    """``next`` pointing off the site (//host, a full URL) falls back to the models page."""
    for target in ("//evil.example/admin/", "https://evil.example/", "/api/v1/models"):
        form = await client.get("/admin/signin", params={"next": target})
        assert 'name="next" value="/admin/models"' in form.text
        r = await client.post("/admin/signin", follow_redirects=False, data={
            "csrf": csrf_of(form.text), "token": ADMIN_TOKEN, "next": target})
        assert r.headers["location"] == "/admin/models"
        client.cookies.clear()


async def test_markup_anywhere_a_person_typed_it_is_escaped(admin: AsyncTestClient) -> None:
    """A <script> description is shown escaped on every page, and so is markup echoed
    back in an error message (an unknown field name)."""
    evil = "<script>alert('pwned')</script>"
    page = await admin.get("/admin/add")
    r = await admin.post("/admin/add", data={
        "csrf": csrf_of(page.text), "yaml": cpu_yaml("trial", description=evil)})
    assert r.status_code == 200
    for path in ("/admin/models", "/admin/models/trial", "/admin/fragments/models"):
        html = (await admin.get(path)).text
        assert "<script>alert" not in html, path
        assert "&lt;script&gt;alert(" in html, path
    r = await admin.post("/admin/add", data={
        "csrf": csrf_of(page.text),
        "yaml": cpu_yaml("trial2", extra='"<img src=x onerror=alert(1)>": 1\n')})
    assert r.status_code == 200  # the refused form's page, after its redirect
    assert r.url.path == "/admin/add"
    assert "<img src=x" not in r.text
    assert "&lt;img src=x onerror=alert(1)&gt;" in r.text


async def test_no_secret_reaches_the_html(admin: AsyncTestClient) -> None:
    """Neither the admin token, the session cookie nor its signing key is in any page."""
    cookie = admin.cookies.get(sessions.COOKIE)
    assert cookie
    key = sessions._key(ADMIN_TOKEN)
    secrets = [ADMIN_TOKEN, cookie, cookie.partition(".")[2], key.hex(),
               sessions._b64(key)]
    paths = ["/admin/signin", *PAGES, *FRAGMENTS, "/admin/static/admin.js"]
    for path in paths:
        html = (await admin.get(path)).text
        for secret in secrets:
            assert secret not in html, (path, secret[:6])


async def test_pages_forbid_framing_and_foreign_scripts(admin: AsyncTestClient) -> None:
    """Every admin page sends a CSP allowing only its own script, no framing, no caching."""
    for path in ["/admin/signin", *PAGES]:
        r = await admin.get(path)
        csp = r.headers["content-security-policy"]
        assert "script-src 'self'" in csp
        assert "frame-ancestors 'none'" in csp
        assert re.search(r"no-store", r.headers["cache-control"])
