"""The console's defects an operator met, each pinned in real Chromium.

Each test drives the page as an operator does (typing, clicking, reloading,
opening a URL from the history) and checks what it shows against the API.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import pytest
import yaml

from llmgw.control.context import AppContext
from llmgw.scheduler.base import (
    PROBES_REPORT,
    SCALER_REPORT,
    ProbeReport,
    ScalerDecision,
    ScalerDecisions,
)
from llmgw.store.base import Store, UsageRecord
from llmgw.store.sqlite import SqliteStore

from .browser import WAIT_MS, browser, errors, expect, live, page, sign_in
from .conftest import ADMIN_TOKEN, cpu_yaml

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

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


def failed_requests(db: Path, model: str, statuses: list[int], team: str = "web") -> None:
    """Requests for ``model`` as the gateway's ledger records them, a second apart, the
    last just now."""
    now = time.time()
    rows = [UsageRecord(id=f"{model}-{i}-{status}", at=now - (len(statuses) - i),
                        key=f"{team}-prod", team=team, model=model, replica="", gpu_class="",
                        prompt_tokens=0 if status >= 400 else 300, cached_tokens=0,
                        completion_tokens=0 if status >= 400 else 80, status=status,
                        latency=0.02, ttft=None)
            for i, status in enumerate(statuses)]

    async def write(store: Store) -> None:
        await store.record_usage(rows)

    with_store(db, write)


def test_an_external_model_whose_upstream_is_dead_is_not_ok(
        live: tuple[str, AppContext], page: Page, errors: list[str], tmp_path: Path) -> None:
    """An external model answered 200 a while ago and then three 502s in a row: the list
    and its page say its upstream is failing, not "ok", as the API does; once a gateway's
    probe also finds its only upstream down, the page says so."""
    base, _ = live
    sign_in(page, base)
    api(page, base, "POST", "/api/v1/models?skip_source_check=true",
        {"name": "partner-llm", "upstream": ["http://10.0.7.3:8000/v1"]})
    page.goto(f"{base}/admin/models")
    expect(page.locator("tr[data-model='partner-llm'] .notes")).to_have_text("ok")
    failed_requests(tmp_path / "llmgw.db", "partner-llm", [200, 502, 502, 502])
    row = page.locator("tr[data-model='partner-llm']")
    expect(row.locator(".notes .upstream")).to_contain_text(
        "upstream failing: its last 3 requests failed (latest 502", timeout=WAIT_MS)
    expect(row.locator(".notes li.ok")).to_have_count(0)
    assert api(page, base, "GET", "/api/v1/models/partner-llm")["upstream"]["failing"] is True

    report = ProbeReport(probed={"partner-llm": 1},
                         down={"partner-llm": ["http://10.0.7.3:8000/v1"]})

    async def probed(store: Store) -> None:
        await store.put_report(PROBES_REPORT, "gw-1", msgspec.json.encode(report))

    with_store(tmp_path / "llmgw.db", probed)
    page.goto(f"{base}/admin/models/partner-llm")
    expect(page.locator("#model-status .notes .upstream")).to_contain_text(
        "every upstream fails its health probe (http://10.0.7.3:8000/v1)")
    assert errors == []


def test_a_team_over_its_budget_stands_out_with_its_reset_and_refusals_by_status(
        live: tuple[str, AppContext], page: Page, errors: list[str], tmp_path: Path) -> None:
    """research has used 212,764 of its 200,000 tokens per day and is answered 429: the
    usage page shows that budget over, with both numbers (as the API counts them) and the
    next UTC midnight as its reset; 502, 429 and 403 answers are listed by status, team
    and key with the API's counts; the teams page marks the team over budget."""
    base, _ = live
    sign_in(page, base)
    api(page, base, "POST", "/api/v1/teams",
        {"name": "research", "limits": {"tokens_per_day": 200000}})
    api(page, base, "POST", "/api/v1/teams", {"name": "web", "limits": {"rpm": 600}})
    for key, team in (("research-ci", "research"), ("web-prod", "web")):
        api(page, base, "POST", "/api/v1/keys", {"name": key, "team": team})
    now = time.time()
    midnight = datetime.fromtimestamp(now, UTC).replace(hour=0, minute=0, second=0,
                                                        microsecond=0)
    at = max(now - 5, midnight.timestamp() + 1)   # today's, whenever the test runs
    rows = [UsageRecord(id=f"r{i}", at=at, key="research-ci", team="research", model="trial",
                        replica="", gpu_class="", prompt_tokens=prompt, cached_tokens=0,
                        completion_tokens=completion, status=200, latency=0.5, ttft=0.1)
            for i, (prompt, completion) in enumerate([(150000, 40000), (20000, 2764)])]
    rows += [UsageRecord(id=f"e{i}-{status}", at=at, key=key, team=team, model="trial",
                         replica="", gpu_class="", prompt_tokens=0, cached_tokens=0,
                         completion_tokens=0, status=status, latency=0.01, ttft=None)
             for status, key, team, n in ((429, "research-ci", "research", 7),
                                          (403, "web-prod", "web", 2),
                                          (502, "web-prod", "web", 3))
             for i in range(n)]

    async def write(store: Store) -> None:
        await store.record_usage(rows)

    with_store(tmp_path / "llmgw.db", write)
    page.goto(f"{base}/admin/usage")
    over = page.locator("tr[data-budget='research//tokens_per_day']")
    expect(over).to_have_class("over")
    expect(over).to_contain_text("212,764")
    expect(over).to_contain_text("200,000")
    expect(over).to_contain_text("over: answering 429")
    reset = (midnight + timedelta(days=1)).isoformat().replace("+00:00", "Z")
    expect(over.locator("time")).to_have_attribute("datetime", reset)
    [budget] = api(page, base, "GET", "/api/v1/budgets")
    assert (budget["used"], budget["limit"], budget["over"]) == (212764, 200000, True)
    for status, team, count in ((429, "research", "7"), (403, "web", "2"), (502, "web", "3")):
        row = page.locator(f"table.statuses tr[data-status='{status}'][data-team='{team}']")
        expect(row.locator("td.num")).to_have_text(count)
    expect(page.locator("table.statuses tr[data-status='502']")).to_contain_text(
        "upstream failed")
    page.goto(f"{base}/admin/teams")
    expect(page.locator("tr[data-team='research'] .tag")).to_have_text("over budget")
    expect(page.locator("tr[data-team='web'] .tag")).to_have_count(0)
    assert errors == []


def test_the_usage_chart_fills_its_box_has_ticks_marks_now_and_reads_local_times(
        live: tuple[str, AppContext], browser: Browser, errors: list[str],
        tmp_path: Path) -> None:
    """In a browser in Kolkata (UTC+5:30): the chart fills its box at 1280 and 390 px,
    its y axis has round ticks beyond 0 and the maximum, the current hour is labelled
    "now", hour labels read in local time (HH:30), and the span's times read as local
    ISO-like text with the UTC text on hover."""
    base, _ = live
    now = time.time()
    rows = [UsageRecord(id=f"c{i}", at=now - i * 3600, key="research-ci", team="research",
                        model="trial", replica="", gpu_class="", prompt_tokens=1000 * (i + 1),
                        cached_tokens=0, completion_tokens=500, status=200, latency=0.5,
                        ttft=0.1) for i in range(6)]

    async def write(store: Store) -> None:
        await store.record_usage(rows)

    with_store(tmp_path / "llmgw.db", write)
    for viewport in ({"width": 1280, "height": 900}, {"width": 390, "height": 844}):
        context = browser.new_context(viewport=viewport,  # type: ignore[arg-type]
                                      timezone_id="Asia/Kolkata")
        context.set_default_timeout(WAIT_MS)
        pg = context.new_page()
        pg.on("pageerror", lambda exc: errors.append(str(exc)))
        try:
            sign_in(pg, base)
            pg.goto(f"{base}/admin/usage")
            chart = pg.locator("#usage-chart svg.usage-chart")
            expect(chart).to_be_visible()
            box, figure = chart.bounding_box(), pg.locator("#usage-chart").bounding_box()
            assert box is not None
            assert figure is not None
            assert box["width"] >= figure["width"] - 24, (box, figure)   # its padding
            ticks = pg.locator("svg.usage-chart text.tick").all_text_contents()
            assert len(ticks) >= 3, ticks
            assert ticks[0] == "0", ticks
            assert any(t.endswith("k") for t in ticks), ticks
            expect(pg.locator("svg.usage-chart text.now-label")).to_have_text("now")
            labels = pg.locator("svg.usage-chart text.time")
            expect(labels.first).to_have_attribute("data-local", "1")
            shown = labels.evaluate_all("(ts) => ts.map((t) => t.firstChild.textContent)")
            assert shown
            assert all(re.fullmatch(r"\d\d:30", t) for t in shown), shown
            since = pg.locator("main p.hint time").first
            expect(since).to_have_attribute("data-local", "1")
            utc = since.get_attribute("datetime")
            assert utc is not None
            local = datetime.fromisoformat(utc).astimezone(timezone(timedelta(hours=5.5)))
            expect(since).to_have_text(local.strftime("%Y-%m-%d %H:%M GMT+5:30"))
            expect(since).to_have_attribute(
                "title", datetime.fromisoformat(utc).strftime("%Y-%m-%d %H:%M UTC"))
            assert "+00:00" not in pg.locator("main").inner_text()
        finally:
            context.close()
    assert errors == []
