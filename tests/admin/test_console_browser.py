"""The console's defects an operator met, each pinned in real Chromium.

Each test drives the page as an operator does (typing, clicking, reloading,
opening a URL from the history) and checks what it shows against the API.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import pytest
import yaml

from llmgw.control.context import AppContext
from llmgw.scheduler.base import SCALER_REPORT, ScalerDecision, ScalerDecisions
from llmgw.store.base import Store
from llmgw.store.sqlite import SqliteStore

from .browser import browser, errors, expect, live, page, sign_in
from .conftest import ADMIN_TOKEN, cpu_yaml

if TYPE_CHECKING:
    from playwright.sync_api import Page

__all__ = ["browser", "errors", "live", "page"]  # fixtures, used by name

pytestmark = pytest.mark.browser

API = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def with_store(db: Path, work: Callable[[Store], Coroutine[Any, Any, None]]) -> None:
    """Run ``work`` on a second connection to the live server's store, from a thread of
    its own (Playwright's sync API runs an event loop in this one)."""
    async def run() -> None:
        store = SqliteStore(f"sqlite:///{db}")
        await store.open()
        try:
            await work(store)
        finally:
            await store.close()

    with ThreadPoolExecutor(1) as pool:
        pool.submit(lambda: asyncio.run(run())).result()


def api(page: Page, base: str, method: str, path: str, body: object = None) -> Any:
    r = page.context.request.fetch(f"{base}{path}", method=method, headers=API, data=body)
    assert r.ok, r.text()
    return r.json() if r.text() else None


def add_autoscaling(page: Page, base: str) -> None:
    """A runtime model scaling between 1 and 4 replicas."""
    trial = yaml.safe_load(cpu_yaml("trial", min_=1))
    trial["scaling"]["max"] = 4
    api(page, base, "POST", "/api/v1/models?skip_source_check=true", trial)


def test_raising_min_keeps_autoscaling_and_the_page_says_why_that_count(
        live: tuple[str, AppContext], page: Page, errors: list[str], tmp_path: Path) -> None:
    """The scale form opens with the max in force (4); raising min to 2 keeps max 4 (the
    API agrees); a min above it is refused with both numbers and the form keeps them; the
    hint says what the scaler does; the page gives the desired count and the scaler's
    reason, as `ctl replicas` words it."""
    base, _ = live
    sign_in(page, base)
    add_autoscaling(page, base)
    decisions = ScalerDecisions(models={"trial": ScalerDecision(
        desired=3, kind="load", reason="40 requests on 2 ready replicas against a target of "
        "16 per replica: 2 → 3", since=12.0)})

    async def publish(store: Store) -> None:
        await store.put_report(*SCALER_REPORT, msgspec.json.encode(decisions))

    with_store(tmp_path / "llmgw.db", publish)
    page.goto(f"{base}/admin/models/trial")
    expect(page.locator("#scale-form input[name=min]")).to_have_value("1")
    expect(page.locator("#scale-form input[name=max]")).to_have_value("4")
    expect(page.locator("#scale-hint")).to_contain_text("the gateway's scaler adds replicas")
    expect(page.locator("#scale-hint")).not_to_contain_text("nothing scales it up")
    expect(page.locator("#desired")).to_contain_text(
        "scaler (load): 40 requests on 2 ready replicas")

    page.fill("#scale-form input[name=min]", "2")
    page.click("#scale-form button[type=submit]")
    expect(page.locator(".flash.ok")).to_have_text("trial: scaling 2 (max 4)")
    assert api(page, base, "GET", "/api/v1/models/trial")["scaling"]["max"] == 4
    expect(page.locator("#scale-form input[name=max]")).to_have_value("4")

    page.fill("#scale-form input[name=min]", "6")
    page.fill("#scale-form input[name=max]", "")
    page.click("#scale-form button[type=submit]")
    expect(page.locator("#scale-form-min-error")).to_have_text(
        "model 'trial': min 6 is above its max 4 in force; give max 6 or more with it "
        "(changing min keeps the max)")
    expect(page.locator("#scale-form input[name=min]")).to_have_value("6")
    assert api(page, base, "GET", "/api/v1/models/trial")["scaling"]["min"] == 2
    assert errors == []


def test_a_new_key_survives_no_reload_and_its_urls_are_pages(
        live: tuple[str, AppContext], page: Page, errors: list[str]) -> None:
    """Creating a key lands on a GET page showing the key once, beside the key form, with
    a copy button that copies it; reloading neither re-posts nor shows it again; opening
    the form's URL (or any action's) gives a page, never JSON."""
    base, _ = live
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    sign_in(page, base)
    api(page, base, "POST", "/api/v1/teams", {"name": "research"})
    page.goto(f"{base}/admin/teams")
    page.fill("#key-form input[name=name]", "research-ci")
    posts: list[str] = []
    page.on("request", lambda r: posts.append(r.url) if r.method == "POST" else None)
    page.click("#key-form button[type=submit]")
    secret = page.locator("#key-form-title ~ #new-key code.key")
    expect(secret).to_contain_text("sk-llmgw-")
    key = secret.inner_text().strip()
    expect(page).to_have_url(re.compile(r"/admin/teams(#new-key)?$"))
    page.click("#new-key button.copy")
    expect(page.locator("#new-key .copied")).to_have_text("copied")
    assert page.evaluate("() => navigator.clipboard.readText()") == key

    posts.clear()
    page.reload()
    assert posts == []
    expect(page.locator("#new-key")).to_have_count(0)
    expect(page.locator(".error-box")).to_have_count(0)
    assert key not in page.content()
    expect(page.locator("tr[data-key='research-ci']")).to_contain_text("research")

    for action in ("/admin/keys", "/admin/teams", "/admin/models/prod-chat/scale",
                   "/admin/keys/research-ci/revoke"):
        response = page.goto(f"{base}{action}")
        assert response is not None
        assert response.status == 200, action
        assert response.headers["content-type"].startswith("text/html"), action
        expect(page.locator("h1")).to_be_visible()
    assert errors == []


def test_the_team_form_offers_what_ctl_sets_and_keeps_everything_on_a_refusal(
        live: tuple[str, AppContext], page: Page, errors: list[str]) -> None:
    """The team form has request logs and cost budgets, the key form its own limits; a
    team naming a model the catalog lacks, with a bad rpm, is refused with both problems
    beside their fields and every value kept; corrected, it is created as the API shows."""
    base, _ = live
    sign_in(page, base)
    page.goto(f"{base}/admin/teams")
    for name in ("log_requests", "log_retention_days", "cost_per_day", "cost_per_month",
                 "tokens_per_minute", "priority", "models"):
        expect(page.locator(f"#team-form [name={name}]")).to_have_count(1)
    for name in ("models", "rpm", "tokens_per_day", "priority"):
        expect(page.locator(f"#key-form [name={name}]")).to_have_count(1)
    page.fill("#team-form-name", "research")
    page.fill("#team-form-models", "prod-chat, prod-chta")
    page.fill("#team-form-rpm", "sixty")
    page.fill("#team-form-tokens_per_day", "200000")
    page.select_option("#team-form-log_requests", "metadata")
    page.fill("#team-form-cost_per_day", "40")
    page.click("#team-form button[type=submit]")
    expect(page.locator("#team-form-models-error")).to_contain_text(
        "'prod-chta' is not in the catalog")
    expect(page.locator("#team-form-rpm-error")).to_contain_text("'sixty' is not a whole number")
    expect(page.locator("#team-form-errors li")).to_have_count(2)
    expect(page.locator("#team-form-models")).to_have_attribute("aria-invalid", "true")
    for field, value in (("name", "research"), ("models", "prod-chat, prod-chta"),
                         ("rpm", "sixty"), ("tokens_per_day", "200000"),
                         ("log_requests", "metadata"), ("cost_per_day", "40")):
        expect(page.locator(f"#team-form-{field}")).to_have_value(value)
    assert api(page, base, "GET", "/api/v1/teams") == []

    page.fill("#team-form-models", "prod-chat")
    page.fill("#team-form-rpm", "60")
    page.click("#team-form button[type=submit]")
    expect(page.locator(".flash.ok")).to_have_text("created team research")
    [team] = api(page, base, "GET", "/api/v1/teams")
    assert team["limits"] == {"models": ["prod-chat"], "rpm": 60, "tokens_per_day": 200000,
                              "log_requests": "metadata", "cost_per_day": 40.0}
    assert errors == []


def test_revoking_a_key_asks_for_its_name(
        live: tuple[str, AppContext], page: Page, errors: list[str]) -> None:
    """One click on Revoke does nothing but ask for the key's name; typing it revokes."""
    base, _ = live
    sign_in(page, base)
    api(page, base, "POST", "/api/v1/teams", {"name": "web"})
    api(page, base, "POST", "/api/v1/keys", {"name": "web-prod", "team": "web"})
    page.goto(f"{base}/admin/teams")
    row = page.locator("tr[data-key='web-prod']")
    row.locator("button:has-text('Revoke')").click()
    expect(page.locator("#revoke-key-web-prod-problem-1")).to_contain_text(
        "type the key's name, web-prod, to revoke it")
    assert [k["name"] for k in api(page, base, "GET", "/api/v1/keys")] == ["web-prod"]
    page.fill("#revoke-key-web-prod-confirm", "web-prod")
    page.locator("#revoke-key-web-prod button").click()
    expect(page.locator(".flash.ok")).to_have_text("revoked key web-prod")
    assert api(page, base, "GET", "/api/v1/keys") == []
    assert errors == []


def test_a_declared_model_offers_only_what_can_be_done_and_says_why(
        live: tuple[str, AppContext], page: Page, errors: list[str]) -> None:
    """The declared model's page has no Scale form and no Remove button, and says why
    (change it in the server's configuration); roll out and prefetch stay. An external
    model offers no scale, roll out or prefetch, and its remove page speaks of its
    upstream, not of replicas."""
    base, _ = live
    sign_in(page, base)
    page.goto(f"{base}/admin/models/prod-chat")
    expect(page.locator("#scale-form")).to_have_count(0)
    expect(page.locator("#scale-not-offered")).to_contain_text(
        "declared in the server's configuration: change its scaling there")
    expect(page.locator("#remove a.button")).to_have_count(0)
    expect(page.locator("#remove-not-offered")).to_contain_text("remove it there")
    expect(page.locator("#rollout button")).to_have_count(1)
    expect(page.locator("#prefetch-form")).to_have_count(1)

    api(page, base, "POST", "/api/v1/models?skip_source_check=true",
        {"name": "partner-llm", "upstream": ["http://10.0.7.3:8000/v1"]})
    page.goto(f"{base}/admin/models/partner-llm")
    for section in ("scale", "rollout", "prefetch"):
        expect(page.locator(f"#{section} form")).to_have_count(0)
        expect(page.locator(f"#{section} .why-not")).to_contain_text("external")
    page.click("#remove a.button")
    expect(page).to_have_url(f"{base}/admin/models/partner-llm/remove")
    expect(page.locator("#remove-what")).to_contain_text("http://10.0.7.3:8000/v1")
    expect(page.locator("main")).not_to_contain_text("replica")
    assert errors == []
