"""The admin page in real headless Chromium, against the real app on loopback.

Fixtures and helpers are in ``tests.admin.browser``. Each page visited is saved
as a screenshot under artifacts/admin/ (not committed) at a laptop's 1366×768.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from llmgw.control.context import AppContext
from llmgw.control.reservation import reservation_checker
from tests.planner.gguf_headers import gemma_gguf

from .browser import WAIT_MS, browser, errors, expect, live, page, shot, sign_in
from .conftest import FleetBackend, cpu_yaml

if TYPE_CHECKING:
    from playwright.sync_api import Page

__all__ = ["browser", "errors", "live", "page"]  # fixtures, used by name

pytestmark = pytest.mark.browser


def test_sign_in_add_scale_see_stale_roll_out_and_remove(
        live: tuple[str, AppContext], backend: FleetBackend, page: Page,
        errors: list[str]) -> None:
    """The whole operator flow works in Chromium: sign in; a typo'd source is shown
    beside its line and nothing is added; add; scale; a stale replica and a memory
    warning appear by themselves; roll out; the fleet; remove after confirming."""
    base, ctx = live
    pg = page
    backend.waiting["prod-chat"] = "no node has 4 free cores and 8.0GiB free right now"
    backend.placement_failures["prod-chat"] = (
        "no node with 2 free NVIDIA H100 80GB HBM3 on fabric ib-a")
    sign_in(pg, base)
    expect(pg.locator("tr[data-model='prod-chat']")).to_contain_text("declared")
    expect(pg.locator("tr[data-model='prod-chat']")).to_contain_text("waiting for capacity")
    shot(pg, "02-models")

    pg.click("nav >> text=Add a model")
    expect(pg).to_have_url(f"{base}/admin/add")
    pg.fill("#yaml", cpu_yaml("trial", source="hf://typo/Qwen2.5-Coder-7B"))
    pg.click("#add-form button[type=submit]")
    error = pg.locator("#add-error")
    expect(error).to_have_attribute("data-field", "source")
    flagged = pg.locator("ol.yaml-excerpt li.flagged")
    expect(flagged).to_contain_text("source: hf://typo/Qwen2.5-Coder-7B")
    expect(flagged.locator("#field-error")).to_contain_text("does not exist on the Hugging Face")
    expect(pg.locator("#yaml")).to_have_value(re.compile("hf://typo/Qwen2.5-Coder-7B"))
    shot(pg, "03-add-source-error")
    assert "trial" not in ctx.models.catalog

    pg.fill("#yaml", cpu_yaml("trial", description="Qwen coder, trial for the editor plugin"))
    pg.click("#add-form button[type=submit]")
    expect(pg).to_have_url(f"{base}/admin/models/trial")
    expect(pg.locator(".flash.ok")).to_have_text("added trial; scaling 1 (max 1)")
    expect(pg.locator("dl.facts")).to_contain_text("by alice")

    pg.fill("#scale-form input[name=min]", "3")
    pg.fill("#scale-form input[name=max]", "3")
    pg.click("#scale-form button[type=submit]")
    expect(pg.locator(".flash.ok")).to_have_text("trial: scaling 3 (max 3)")
    expect(pg.locator("#model-status .count")).to_have_text("3/3 ready")
    shot(pg, "04-model-scaled")

    # The scheduler now reports one replica on an older profile, and one
    # replica above its memory: the page shows both without being reloaded.
    marker = pg.evaluate("() => { window.__same_page = true; return 1; }")
    assert marker == 1
    backend.stale.add("trial")
    backend.hungry.add("trial")
    stale_row = pg.locator("tr[data-replica='trial-0']")
    expect(stale_row.locator(".stale-flag")).to_have_text("stale profile", timeout=WAIT_MS)
    expect(stale_row.locator(".memory-flag")).to_contain_text("exceeds", timeout=WAIT_MS)
    expect(pg.locator("#model-status .notes")).to_contain_text("1 replica on a stale profile")
    assert pg.evaluate("() => window.__same_page") is True
    shot(pg, "05-model-stale")

    pg.click("nav >> text=Models")
    row = pg.locator("tr[data-model='trial']")
    expect(row).to_contain_text("added by alice")
    expect(row.locator(".notes .stale")).to_have_text("1 replica on a stale profile")
    expect(row.locator(".notes .memory")).to_contain_text("(and 2 more)")
    shot(pg, "06-models-status")
    row.locator("a", has_text="trial").click()

    pg.click("button:has-text('Roll out current profile')")
    expect(pg.locator(".flash.ok")).to_contain_text("replicas of trial are being replaced")
    assert backend.rollouts == ["trial"]
    expect(pg.locator(".stale-flag")).to_have_count(0)

    pg.click("nav >> text=Fleet")
    expect(pg.locator("tr[data-pool='h100-80g/ib-a']")).to_contain_text("11 / 16")
    expect(pg.locator("tr[data-node='gpu-h100-b1']")).to_contain_text("0 / 8")
    shot(pg, "07-fleet")

    pg.goto(f"{base}/admin/models/trial")
    pg.click("text=Remove…")
    expect(pg).to_have_url(f"{base}/admin/models/trial/remove")
    shot(pg, "08-remove-confirm")
    assert "trial" in ctx.models.catalog  # asking is not removing
    pg.click("button:has-text('Remove trial')")
    expect(pg).to_have_url(f"{base}/admin/models")
    expect(pg.locator(".flash.ok")).to_have_text("removed trial")
    expect(pg.locator("tr[data-model='trial']")).to_have_count(0)
    shot(pg, "09-removed")

    pg.click("button:has-text('Sign out')")
    expect(pg).to_have_url(re.compile(r"/admin/signin"))
    pg.goto(f"{base}/admin/models")
    expect(pg).to_have_url(re.compile(r"/admin/signin\?next="))
    assert errors == []


def test_a_reservation_below_the_need_is_warned_about_after_adding(
        live: tuple[str, AppContext], page: Page, errors: list[str], tmp_path: Path) -> None:
    """The model is added, and the message after adding shows the warning beneath it in
    the warning style."""
    base, ctx = live
    gguf = tmp_path / "gemma.gguf"
    gguf.write_bytes(gemma_gguf(tail=0))
    ctx.reservation_check = reservation_checker(embedded=True)
    sign_in(page, base)
    page.goto(f"{base}/admin/add")
    page.fill("#yaml", cpu_yaml("gemma", source=str(gguf)).replace("memory: 8GiB",
                                                                    "memory: 256MiB"))
    page.click("#add-form button[type=submit]")
    expect(page).to_have_url(f"{base}/admin/models/gemma")
    flash = page.locator(".flash.warn")
    expect(flash.locator("p")).to_have_text("added gemma; scaling 1 (max 1)")
    expect(flash.locator("li")).to_have_text([
        "profile cpu reserves 256.0MiB but one replica needs 1008.7MiB of host memory "
        "(weights 405.2MiB, KV cache for 4096 tokens 72.0MiB, runtime 531.5MiB); raise memory "
        "to at least 1008.7MiB, or lower context"])
    shot(page, "12-added-with-warning")
    assert errors == []


def test_markup_in_a_description_is_shown_as_text_and_never_runs(
        live: tuple[str, AppContext], page: Page) -> None:
    """A description holding <script> and an onerror handler renders inert, as text."""
    base, _ = live
    evil = "<script>window.__pwned = 1</script><img src=x onerror='window.__pwned = 2'>"
    sign_in(page, base)
    page.goto(f"{base}/admin/add")
    page.fill("#yaml", cpu_yaml("inert", description=evil))
    page.click("#add-form button[type=submit]")
    expect(page).to_have_url(f"{base}/admin/models/inert")
    expect(page.locator("p.desc.lead")).to_have_text(evil)
    page.goto(f"{base}/admin/models")
    expect(page.locator("tr[data-model='inert'] .desc")).to_have_text(evil)
    shot(page, "11-escaped")
    assert page.evaluate("() => window.__pwned") is None
    assert page.locator("tr[data-model='inert'] img").count() == 0


def test_an_expectation_waits_as_long_as_an_action_does(page: Page) -> None:
    """expect() without a timeout waits up to WAIT_MS, not Playwright's 5 s default,
    so a slow navigation on a loaded machine is not a failure."""
    page.set_content("<p id='late'></p>")
    page.evaluate("() => setTimeout(() => { document.getElementById('late').dataset.ready = "
                  "'yes'; }, 6000)")
    expect(page.locator("#late")).to_have_attribute("data-ready", "yes")


def test_prefetch_from_the_model_page_shows_each_nodes_progress(
        live: tuple[str, AppContext], backend: FleetBackend, page: Page,
        errors: list[str]) -> None:
    """Fetching weights ahead from the model page asks the scheduler for that many nodes,
    says so, and the refreshed status shows each node's share done and the nodes holding
    the weights."""
    base, _ = live
    sign_in(page, base)
    page.goto(f"{base}/admin/models/prod-chat")
    page.fill("#prefetch-form input[name=count]", "2")
    page.click("#prefetch-form button[type=submit]")
    expect(page.locator(".flash.ok")).to_have_text("fetching prod-chat's weights onto 2 nodes")
    assert backend.prefetched == {"prod-chat": 2}
    row = page.locator("tr[data-prefetch-node='cpu-64c-3']")
    expect(row).to_contain_text("fetching", timeout=WAIT_MS)
    expect(row).to_contain_text("37%")
    expect(page.locator(".prefetch-warm")).to_contain_text("cpu-64c-1")
    shot(page, "10-prefetch")
    page.click("nav >> text=Fleet")
    expect(page.locator("tr[data-node='cpu-64c-1'] td.warm")).to_have_text("prod-chat")
    expect(page.locator("tr[data-node='gpu-h100-a1'] td.warm")).to_have_text("—")
    assert errors == []


def test_the_usage_page_shows_its_chart_and_switches_grouping(
        live: tuple[str, AppContext], page: Page, tmp_path: Path, errors: list[str]) -> None:
    """The server-rendered SVG chart draws in Chromium with no script error or CSP
    violation; its bars name the team on hover; the form switches to models by day."""
    import asyncio
    import time
    from concurrent.futures import ThreadPoolExecutor

    from llmgw.store.base import UsageRecord
    from llmgw.store.sqlite import SqliteStore

    async def record() -> None:
        store = SqliteStore(f"sqlite:///{tmp_path / 'llmgw.db'}")
        await store.open()
        try:
            now = time.time()
            await store.record_usage([UsageRecord(
                id=f"r{i}", at=now, key=f"{team}-key", team=team, model=model, replica="r",
                gpu_class="", prompt_tokens=500, cached_tokens=0, completion_tokens=100 * i,
                status=200, latency=0.1, ttft=None)
                for i, (team, model) in enumerate([("research", "big"), ("web", "small"),
                                                    ("research", "small")])])
        finally:
            await store.close()

    base, _ = live
    sign_in(page, base)
    # Playwright's sync API runs an event loop in this thread: write from another one.
    with ThreadPoolExecutor(1) as pool:
        pool.submit(lambda: asyncio.run(record())).result()
    page.click("nav a:has-text('Usage')")
    expect(page).to_have_url(f"{base}/admin/usage")
    chart = page.locator("#usage-chart svg.usage-chart")
    expect(chart).to_be_visible()
    expect(page.locator("rect.segment[data-group='research']")).to_have_count(1)
    assert "research: 1,200 tokens" in page.locator(
        "rect.segment[data-group='research'] title").text_content()  # type: ignore[operator]
    box = chart.bounding_box()
    assert box is not None
    assert box["width"] > 300
    expect(page.locator("tr[data-group='web']")).to_contain_text("600")
    shot(page, "12-usage")
    page.select_option("select[name=by]", "model")
    page.select_option("select[name=granularity]", "day")
    page.click("form.usage-filter button")
    expect(page).to_have_url(re.compile(r"by=model&granularity=day"))
    expect(page.locator("rect.segment[data-group='small']")).to_have_count(1)
    shot(page, "13-usage-models")
    page.click("nav a:has-text('Teams & keys')")
    page.fill("#team-form input[name=name]", "research")
    page.fill("#team-form input[name=tokens_per_day]", "2000000")
    page.click("#team-form button")
    expect(page.locator("tr[data-team='research']")).to_contain_text("tokens per day 2,000,000")
    page.fill("#key-form input[name=name]", "research-ci")
    page.click("#key-form button")
    expect(page.locator("#new-key code.key")).to_contain_text("sk-llmgw-")
    expect(page.locator("tr[data-key='research-ci']")).to_contain_text("research")
    shot(page, "14-new-key")
    assert errors == []
