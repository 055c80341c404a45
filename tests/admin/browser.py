"""Shared pieces of the browser tests: real headless Chromium against the real app.

Chromium is Debian's (/usr/bin/chromium, or LLMGW_CHROMIUM), driven by
Playwright for Python; no browser is downloaded. A test module imports the
fixtures it uses from here (``from .browser import browser, page, errors, live``)
and marks itself ``pytestmark = pytest.mark.browser``. Screenshots go under
artifacts/admin/ (not committed).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from llmgw.control.context import AppContext

from .conftest import ADMIN_TOKEN, FleetBackend, make_app
from .live import LiveServer

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

try:
    from playwright import sync_api
except ImportError:
    if os.environ.get("LLMGW_TEST_REQUIRE_ALL"):
        raise
    pytest.skip("Playwright is not installed: pip install -e '.[test]'", allow_module_level=True)
expect = sync_api.expect

CHROMIUM = os.environ.get("LLMGW_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts" / "admin"
LAPTOP = {"width": 1366, "height": 768}
WAIT_MS = 30_000


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        message = f"no Chromium at {CHROMIUM}; apt-get install chromium (or set LLMGW_CHROMIUM)"
        if os.environ.get("LLMGW_TEST_REQUIRE_ALL"):
            pytest.fail(message)
        pytest.skip(message)
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@pytest.fixture
def live(tmp_path: Path, backend: FleetBackend) -> Iterator[tuple[str, AppContext]]:
    app, ctx = make_app(tmp_path / "llmgw.db", backend)
    with LiveServer(app) as server:
        yield server.url, ctx


@pytest.fixture
def errors() -> list[str]:
    """Script errors and console errors (a CSP violation is one) seen by the page."""
    return []


def open_page(browser: Browser, errors: list[str],
              viewport: dict[str, int] | None = None) -> Page:
    """A page in a new context of ``viewport`` (a laptop's by default) that records
    script errors, console errors (a CSP violation is one) and failed static files
    in ``errors``. Close it with ``page.context.close()``."""
    context = browser.new_context(viewport=viewport or LAPTOP)  # type: ignore[arg-type]
    # Actions take the context's timeout, but expect() has its own, 5 s by
    # default: too short for a navigation on a loaded 2-core machine.
    context.set_default_timeout(WAIT_MS)
    expect.set_options(timeout=WAIT_MS)
    pg = context.new_page()
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    # A refused form answers 4xx on purpose, which Chromium logs as a failed
    # load; what must not fail is the page's own script, style and icon.
    pg.on("console", lambda msg: errors.append(msg.text)
          if msg.type == "error" and not msg.text.startswith("Failed to load resource")
          else None)
    pg.on("response", lambda r: errors.append(f"{r.status} {r.url}")
          if "/admin/static/" in r.url and r.status >= 400 else None)
    return pg


@pytest.fixture
def page(browser: Browser, errors: list[str]) -> Iterator[Page]:
    pg = open_page(browser, errors)
    yield pg
    pg.context.close()
    expect.set_options(timeout=None)  # Playwright's default again, for other modules


def shot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def sign_in(page: Page, base: str) -> None:
    page.goto(f"{base}/admin/models")
    expect(page).to_have_url(re.compile(r"/admin/signin\?next="))
    shot(page, "01-signin")
    page.fill("#token", ADMIN_TOKEN)
    page.click("button:has-text('Sign in')")
    expect(page).to_have_url(f"{base}/admin/models")


