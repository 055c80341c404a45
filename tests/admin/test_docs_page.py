"""The API docs page runs no foreign code on the admin console's origin: Redoc from the
package with its integrity hash, and one Content-Security-Policy on every page."""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from litestar.testing import AsyncTestClient

from llmgw.api.docs import content_security_policy

from .conftest import FleetBackend, make_app


@pytest.fixture
def app(tmp_path: Path, backend: FleetBackend):  # type: ignore[no-untyped-def]
    return make_app(tmp_path / "llmgw.db", backend)[0]


async def test_the_docs_page_loads_only_this_packages_redoc_pinned_by_its_hash(app) -> None:  # type: ignore[no-untyped-def]
    """No script, style, font or icon from another origin; the script's integrity is the
    hash of the bytes served at its path; Litestar's CDN renderers are not served."""
    async with AsyncTestClient(app) as client:
        page = await client.get("/api/docs")
        assert page.status_code == 200
        assert not re.search(r"(src|href)=['\"]?(https?:)?//", page.text), page.text
        [(src, integrity)] = re.findall(r"<script src='([^']+)' integrity='([^']+)'", page.text)
        assert urlsplit(src).netloc == ""
        script = await client.get(src)
        assert script.status_code == 200
        assert script.headers["content-type"].startswith("text/javascript")
        digest = base64.b64encode(hashlib.sha384(script.content).digest()).decode()
        assert integrity == f"sha384-{digest}"
        assert b"ReDoc" in script.content[:200] or b"license" in script.content[:200]
        for cdn_renderer in ("/api/docs/swagger", "/api/docs/elements", "/api/docs/rapidoc",
                             "/api/docs/redoc"):
            assert (await client.get(cdn_renderer)).status_code == 404, cdn_renderer
        assert (await client.get("/api/docs/openapi.json")).status_code == 200


async def test_every_admin_and_docs_page_carries_one_policy_from_one_function(app) -> None:  # type: ignore[no-untyped-def]
    """The docs page, its script, the admin console (whose handlers set their own
    headers) and the API answer with exactly one CSP, content_security_policy's, which
    starts from default-src 'self' and never allows inline or foreign script."""
    async with AsyncTestClient(app) as client:
        for path in ("/api/docs", "/api/docs/openapi.json", "/admin/signin", "/admin/",
                     "/healthz", "/api/v1/models"):
            r = await client.get(path)
            policies = r.headers.get_list("content-security-policy")
            assert policies == [content_security_policy(path)], (path, policies)
            directives = [d.strip() for d in policies[0].split(";")]
            assert directives[0] == "default-src 'self'"
            assert [d for d in directives if d.startswith("script-src")] == \
                ["script-src 'self'"]
            assert "frame-ancestors 'none'" in directives
            assert "object-src 'none'" in directives
    assert "unsafe-inline" not in content_security_policy("/admin/")


@pytest.mark.browser
def test_redoc_renders_the_api_under_the_policy_in_chromium(tmp_path: Path,
                                                           backend: FleetBackend) -> None:
    """In real Chromium the docs page draws the API's operations with no CSP violation,
    no script error and no request to any host but this one."""
    sync_api = pytest.importorskip("playwright.sync_api")
    from .browser import ARGS, ARTIFACTS, CHROMIUM, LAPTOP, WAIT_MS
    from .live import LiveServer

    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    app, _ = make_app(tmp_path / "llmgw.db", backend)
    errors: list[str] = []
    elsewhere: list[str] = []
    with LiveServer(app) as server, sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport=LAPTOP)
            page.set_default_timeout(WAIT_MS)
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            host = urlsplit(server.url).netloc
            # Responses, not requests: Chromium reports the attempt a policy then blocks.
            page.on("response", lambda r: elsewhere.append(r.url)
                    if urlsplit(r.url).scheme in ("http", "https")
                    and urlsplit(r.url).netloc != host else None)
            page.goto(f"{server.url}/api/docs")
            sync_api.expect(page.get_by_text("Add (or replace) a runtime model").first
                            ).to_be_visible(timeout=WAIT_MS)
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "api-docs.png"))
        finally:
            browser.close()
    # Redoc's own "by Redocly" logo is from its CDN: the policy blocks it, no request.
    blocked_logo = [e for e in errors if "cdn.redoc.ly" in e and "Content Security" in e]
    assert [e for e in errors if e not in blocked_logo] == []
    assert elsewhere == []
