"""The console's pages in real headless Chromium, over a whole llmgw process with traffic.

One process per module (``console_fleet.start_fleet``): two teams, three keys
and a few dozen requests through the real gateway to simulated engines, one
team over its daily budget. Each test opens pages as an operator would and
checks the figures shown against what the API and the traffic say.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from .browser import WAIT_MS, browser, errors, expect
from .conftest import ADMIN_TOKEN
from .console_fleet import Fleet, Traffic, start_fleet, until
from .walk import MAX_PAGE_BYTES, PHONE, form_problems, layout_problems

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

__all__ = ["browser", "errors"]  # fixtures, used by name

pytestmark = pytest.mark.browser

LAPTOP = {"width": 1280, "height": 900}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Fleet, Traffic]]:
    yield from start_fleet(tmp_path_factory.mktemp("console"))


@pytest.fixture
def page(browser: Browser, fleet: tuple[Fleet, Traffic], errors: list[str]) -> Iterator[Page]:
    """A signed-in page, in a zone far from UTC (the console shows the viewer's time)."""
    context = browser.new_context(viewport=LAPTOP, timezone_id="Asia/Kathmandu")
    context.set_default_timeout(WAIT_MS)
    expect.set_options(timeout=WAIT_MS)
    pg = context.new_page()
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.on("console", lambda msg: errors.append(msg.text)
          if msg.type == "error" and not msg.text.startswith("Failed to load resource")
          else None)
    base = fleet[0].url
    pg.goto(f"{base}/admin/models")
    pg.fill("#token", ADMIN_TOKEN)
    pg.click("button:has-text('Sign in')")
    expect(pg).to_have_url(f"{base}/admin/models")
    yield pg
    context.close()
    expect.set_options(timeout=None)


def test_every_console_page_is_reachable_from_the_navigation(
        page: Page, fleet: tuple[Fleet, Traffic], errors: list[str]) -> None:
    """Each console page is a link in the header and opens without a script error."""
    for label, path in (("Live", "/admin/live"), ("Replicas", "/admin/replicas"),
                        ("Playground", "/admin/playground"), ("Spend", "/admin/spend"),
                        ("Request logs", "/admin/logs"), ("Add (form)", "/admin/guided"),
                        ("Mirror", "/admin/mirror")):
        page.click(f"header nav a:has-text('{label}')")
        expect(page).to_have_url(re.compile(re.escape(path) + r"$"))
        expect(page.locator("header nav a[aria-current='page']")).to_have_text(label)
    assert errors == []


def test_the_live_view_shows_the_gateways_traffic_and_refreshes_itself(
        page: Page, fleet: tuple[Fleet, Traffic], errors: list[str]) -> None:
    """Requests per second, TTFT and replicas ready of desired appear for the model with
    traffic, the over-budget team's 429 among the requests refused before routing, and
    the table is rebuilt by the script from the JSON endpoint without a reload."""
    f, _ = fleet
    page.goto(f"{f.url}/admin/live")
    row = page.locator("#live-table tr[data-model='team-chat']")
    expect(row.locator("[data-fig=replicas]")).to_contain_text("2 / 2 ready")
    table = page.locator("#live-table")
    # A first refresh gives a window to take rates over; traffic in between shows in it.
    for key in ("ml-ci", "web-app"):
        f.chat(key)
    until(lambda: table.get_attribute("data-refreshed") is not None, "the live table refresh")
    f.chat("ml-ci", stream=True)
    first = table.get_attribute("data-refreshed")
    until(lambda: table.get_attribute("data-refreshed") != first, "a second refresh")
    expect(row.locator("[data-fig=rps]")).not_to_have_text("—")
    # The over-budget team's 429: on the model's row when its budget is checked after
    # the model is read, among the requests refused before routing otherwise.
    expect(page.locator("#live-table tr[data-model='team-chat'] [data-fig=errors], "
                        "#live-refused [data-fig=refused]").filter(has_text="429")
           ).to_have_count(1)
    expect(row.locator("[data-fig=ttft]")).not_to_have_text("— / —")
    assert errors == []


def test_the_replicas_page_shows_phase_node_restarts_the_last_event_and_the_log(
        page: Page, fleet: tuple[Fleet, Traffic], errors: list[str]) -> None:
    """Every replica is listed with its node and restarts; one replica's page shows its
    last failure and the engine's access log with the requests it served."""
    f, _ = fleet
    page.goto(f"{f.url}/admin/replicas")
    row = page.locator("tr[data-replica='team-chat-1']")
    expect(row.locator(".restarts")).to_have_text("1")
    expect(row.locator(".event")).to_contain_text("status 137")
    expect(row).to_contain_text("cpu-64c-2")
    row.locator("a").first.click()
    expect(page.locator("#replica-message")).to_contain_text("out of memory")
    expect(page.locator("#replica-log")).to_contain_text("POST /v1/chat/completions")
    assert errors == []


def test_the_playground_streams_an_answer_and_names_the_replica(
        page: Page, fleet: tuple[Fleet, Traffic], errors: list[str]) -> None:
    """Acting as a team (a short-lived key made for it), a chat streams an answer; the
    page shows TTFT, tokens per second, the replica that answered and the request as
    curl and openai Python; the made key expires by itself."""
    f, _ = fleet
    page.goto(f"{f.url}/admin/playground")
    page.fill("#pg-model", "team-chat")
    page.check("input[name=as][value=team]")
    page.select_option("#pg-team", "ml")
    page.fill("#pg-prompt", "What is a replica?")
    page.click("#pg-go")
    expect(page.locator("#pg-chat .msg-assistant .said")).to_contain_text("t0")
    expect(page.locator("#pg-ttft")).to_have_text(re.compile(r"\d+ ms|\d\.\d\d s"))
    expect(page.locator("#pg-replica")).to_have_text(re.compile(r"team-chat-[01] on cpu-64c-"))
    expect(page.locator("#pg-tokens")).to_contain_text("completion")
    expect(page.locator("#pg-curl")).to_contain_text("/v1/chat/completions")
    expect(page.locator("#pg-python")).to_contain_text('model="team-chat"')
    with f.api() as api:
        keys = api.get("/api/v1/keys", params={"team": "ml"}).json()
    minted = [k for k in keys if k["name"].startswith("playground-ml-")]
    assert len(minted) == 1
    assert minted[0]["expires_at"] is not None
    assert errors == []


def test_spend_shows_costs_budgets_and_a_team_over_its_budget_as_the_api_does(
        page: Page, fleet: tuple[Fleet, Traffic], errors: list[str]) -> None:
    """Each team's cost and tokens today agree with /api/v1/costs and the usage report;
    the over-budget team's gauge is at its limit with its reset time in the viewer's zone; each
    model's cost per million tokens is shown."""
    f, traffic = fleet
    page.goto(f"{f.url}/admin/spend")
    web = page.locator("tr[data-team='web']")
    # The gateway refuses once what is left of the budget cannot cover a request's
    # reserve, before the ledger's figure reaches the limit: the row shows both.
    expect(web.locator(".budget")).to_contain_text("of 400")
    expect(web.locator(".refused")).to_contain_text("429 × ")
    shown = int(web.locator(".refused").inner_text().split("429 × ")[1].split()[0])
    # At least the fixture's (other tests here send the team more).
    assert shown >= sum(1 for s in traffic.statuses["web-app"] if s == 429)
    # UTC on hover, the viewer's zone (Kathmandu, +05:45) in the text.
    reset = web.locator(".budget time")
    assert (reset.get_attribute("title") or "").endswith("UTC")
    assert "UTC" not in reset.inner_text()
    with f.api() as api:
        usage = {t["group"]: t for t in api.get(
            "/api/v1/usage", params={"by": "team", "granularity": "day"}).json()["totals"]}
    ml_tokens = page.locator("tr[data-team='ml'] .tokens").inner_text()
    assert int(ml_tokens.replace(",", "")) == usage["ml"]["total_tokens"]
    def costed() -> bool:
        with f.api() as api:
            return bool(api.get("/api/v1/costs").json()["total"] > 0)

    until(costed, "the cost meter's pass")
    page.reload()
    with f.api() as api:
        costs = api.get("/api/v1/costs", params={
            "since": page.locator("#spend-since").get_attribute("data-since")}).json()
    shown = page.locator("tr[data-model='team-chat'] .cost").inner_text()
    model_cost = next(m for m in costs["models"] if m["model"] == "team-chat")["cost"]
    assert abs(float(shown.replace(",", "")) - model_cost) < 0.01 + model_cost * 0.05
    expect(page.locator("tr[data-key='ml-ci']")).to_contain_text("ml")
    assert errors == []


def test_a_key_is_edited_given_an_expiry_and_rotated_keeping_its_id(
        page: Page, fleet: tuple[Fleet, Traffic], errors: list[str]) -> None:
    """From the key's page: limits naming an unknown model are refused beside the form;
    limits are saved (and reload does not repeat the post); an expiry is set in the
    viewer's zone; rotating with an hour's grace shows a new secret once; both secrets
    then work through the gateway, and the key's id is unchanged."""
    f, _ = fleet
    with f.api() as api:
        before = next(k for k in api.get("/api/v1/keys").json() if k["name"] == "ml-notebook")
    page.goto(f"{f.url}/admin/keys/ml-notebook")
    page.fill("#limits-form input[name=models]", "team-chat, no-such-model")
    page.click("#limits-form button[type=submit]")
    expect(page.locator("#limits-form-models-error")).to_contain_text("no-such-model")
    page.fill("#limits-form input[name=models]", "team-chat")
    page.fill("#limits-form input[name=rpm]", "120")
    page.click("#limits-form button[type=submit]")
    expect(page.locator("#key-limits")).to_contain_text("rpm 120")
    expect(page).to_have_url(f"{f.url}/admin/keys/ml-notebook#limits-form")
    page.fill("#expiry-form-expires_at", "2099-01-02T03:04")
    page.click("#expiry-form button[type=submit]")
    expect(page.locator("#key-expiry time")).to_have_attribute(
        "title", "2099-01-01 21:19 UTC")   # 03:04 in Kathmandu is 21:19 UTC the day before
    page.select_option("#rotate-form-grace", "3600")
    page.click("#rotate-form button[type=submit]")
    new_secret = page.locator("#new-key-value").inner_text().strip()
    assert new_secret.startswith("sk-llmgw-")
    page.reload()    # the secret was shown once, and reloading rotates nothing
    expect(page.locator("#new-key-value")).to_have_count(0)
    expect(page.locator("#previous-until")).to_be_visible()
    assert new_secret != f.keys["ml-notebook"]
    old_secret = f.keys["ml-notebook"]
    f.keys["ml-notebook-new"] = new_secret
    until(lambda: f.chat("ml-notebook-new").status_code == 200, "the new secret in force")
    assert f.chat("ml-notebook").status_code == 200      # the old one, within its grace
    with f.api() as api:
        after = next(k for k in api.get("/api/v1/keys").json() if k["name"] == "ml-notebook")
    assert after["id"] == before["id"]
    assert after["limits"] == {"models": ["team-chat"], "rpm": 120}
    assert after["previous_until"] is not None
    assert old_secret != new_secret
    assert errors == []


def test_request_logs_filter_by_key_and_status_and_open_one_request(
        page: Page, fleet: tuple[Fleet, Traffic], errors: list[str]) -> None:
    """The logging team's requests are listed; filtering by key shows only that key's,
    as many as it sent; one opens with its record and bodies."""
    f, _ = fleet
    page.goto(f"{f.url}/admin/logs")
    page.select_option("select[name=key]", "ml-ci")
    page.fill("input[name=status]", "200")
    page.click(".logs-filter button[type=submit]")
    rows = page.locator("table.request-logs tbody tr[data-log]")
    expect(rows.first).to_be_visible()
    with f.api() as api:
        logs = api.get("/api/v1/teams/ml/logs", params={"limit": 1000}).json()
    expected = [g for g in logs if g["key"] == "ml-ci"]
    assert rows.count() == min(50, len(expected))
    for key in page.locator("table.request-logs tbody td:nth-child(2)").all_inner_texts():
        assert key == "ml-ci"
    rows.first.locator("a").click()
    expect(page.locator("#entry-status")).to_have_text("200")
    expect(page.locator("#entry-request")).to_contain_text("messages")
    expect(page.locator("#entry-response")).to_contain_text("t0")
    assert errors == []


def test_the_guided_form_checks_shows_the_yaml_and_adds(
        page: Page, fleet: tuple[Fleet, Traffic], errors: list[str]) -> None:
    """A typo'd source fails the source check beside its field with no Add offered; a
    profile wanting more GPUs than a node has fails the scheduler's fit check; a good
    definition passes, its YAML is shown, and Add stores exactly that model."""
    f, _ = fleet
    page.goto(f"{f.url}/admin/guided")
    page.fill("input[name=name]", "qwen-small")
    page.fill("input[name=source]", "hf://typo/Qwen2.5-0.5B-Instruct")
    page.select_option("select[name=gpu_class]", "h100-80g")
    page.fill("input[name=gpus]", "1")
    page.click("#guided-check")
    expect(page.locator("#error-source")).to_contain_text("does not exist")
    expect(page.locator("#guided-add")).to_have_count(0)
    page.fill("input[name=source]", "hf://Qwen/Qwen2.5-0.5B-Instruct")
    page.fill("input[name=gpus]", "16")
    page.click("#guided-check")
    expect(page.locator("#guided-error")).to_contain_text("no node has 16 GPUs")
    page.fill("input[name=gpus]", "1")
    page.click("#guided-check")
    expect(page.locator("#guided-checks")).to_contain_text("can place")
    expect(page.locator("#guided-yaml")).to_contain_text("gpu_class: h100-80g")
    page.reload()    # a check is a GET: reloading repeats it and changes nothing
    expect(page.locator("#guided-checks")).to_contain_text("can place")
    page.click("#guided-add")
    expect(page).to_have_url(f"{f.url}/admin/models/qwen-small")
    with f.api() as api:
        stored = api.get("/api/v1/models/qwen-small").json()["definition"]
    assert stored["source"] == "hf://Qwen/Qwen2.5-0.5B-Instruct"
    assert stored["profiles"][0]["gpus"] == 1
    assert errors == []


def test_the_mirror_page_shows_what_is_held_used_and_removable(
        page: Page, fleet: tuple[Fleet, Traffic], errors: list[str]) -> None:
    """The coder model's directory is used by it; the old model's is not and comes with
    the command that removes it; the sizes are the files' own."""
    f, _ = fleet
    page.goto(f"{f.url}/admin/mirror")
    used = page.locator("tr[data-path='coder/2025-01']")
    expect(used).to_contain_text("coder")
    expect(used).to_contain_text("in use")
    unused = page.locator("tr[data-path='old-chat/2024-06']")
    expect(unused).to_contain_text("llmgw mirror remove old-chat/2024-06")
    expect(unused.locator("td:nth-child(2)")).to_have_text("2")
    expect(page.locator("#mirror-unused")).to_have_text("7.3KiB")
    assert errors == []


def test_the_console_pages_fit_a_phone_and_a_laptop_and_their_forms_reload(
        browser: Browser, page: Page, fleet: tuple[Fleet, Traffic], errors: list[str]) -> None:
    """With real data on them, every console page at 1280 and at 390 px: no sideways
    overflow, no text squeezed letter by letter, under 150 KB; each form's URL opens a
    page and its answer can be reloaded (``walk``, the checks every page passes)."""
    f, _ = fleet
    with f.api() as api:
        logs = api.get("/api/v1/teams/ml/logs", params={"limit": 1}).json()
    paths = ["/admin/live", "/admin/replicas", "/admin/replica?id=team-chat-1",
             "/admin/playground", "/admin/spend", "/admin/keys/ml-ci", "/admin/logs",
             f"/admin/logs/request?team=ml&id={logs[0]['id']}&at={logs[0]['at']}",
             "/admin/guided", "/admin/guided?check=1&name=q&source=hf%3A%2F%2Ftypo%2Fq"
             "&engine=vllm&gpu_class=h100-80g&gpus=1&min=1", "/admin/mirror"]
    phone = browser.new_context(viewport=PHONE, storage_state=page.context.storage_state())
    problems: list[str] = []
    try:
        small = phone.new_page()
        for path in paths:
            for size, pg in (("laptop", page), ("phone", small)):
                response = pg.goto(f.url + path)
                assert response is not None
                if len(response.body()) > MAX_PAGE_BYTES:
                    problems.append(f"{path} at {size}: {len(response.body()):,} bytes")
                problems += [f"{path} at {size}: {p}" for p in layout_problems(pg)]
            found, _ = form_problems(page, f.url, f.url + path)
            problems += [f"{path}: {p}" for p in found]
    finally:
        phone.close()
    assert not problems, "\n".join(problems)
    assert errors == []
