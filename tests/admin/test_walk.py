"""Every page of the console, at a laptop's 1280×900 and a phone's 390×844, in Chromium.

The walk starts at the models page and follows every admin link it finds, so a new
page is walked as soon as the navigation (or any page) links to it. Each page is
checked by ``tests.admin.walk``: no horizontal overflow, no text squeezed a few
letters per line, under 150 KB, every marked number equal to the API's, every
form's URL a page on GET and every form's answer reloadable. The data is an
operator's: a runtime model that autoscales, an external one, two teams, three
keys and a few hundred requests in the ledger, some refused.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from llmgw.control.context import AppContext
from llmgw.store.base import UsageRecord
from llmgw.store.sqlite import SqliteStore

from .browser import ARTIFACTS, browser, errors, expect, live, open_page, sign_in
from .conftest import ADMIN_TOKEN, cpu_yaml
from .walk import (
    LAPTOP,
    MAX_PAGE_BYTES,
    PHONE,
    form_problems,
    layout_problems,
    links,
    number_problems,
)

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

__all__ = ["browser", "errors", "live"]  # fixtures, used by name

pytestmark = pytest.mark.browser

API = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
MAX_PAGES = 40


def record_traffic(db: Path) -> None:
    """A few hundred requests of two teams, some refused (429, 403) or failed (502)."""
    async def write() -> None:
        store = SqliteStore(f"sqlite:///{db}")
        await store.open()
        try:
            now = time.time()
            rows = []
            for i in range(300):
                team, key = (("research", "research-ci") if i % 3 else ("web", "web-prod"))
                status = 200 if i % 10 else (429 if i % 20 else 502)
                rows.append(UsageRecord(
                    id=f"walk-{i}", at=now - i * 30, key=key, team=team, model="trial",
                    replica="trial-0", gpu_class="", prompt_tokens=400 + i,
                    cached_tokens=100 if i % 2 else 0,
                    completion_tokens=0 if status != 200 else 120, status=status,
                    latency=0.4, ttft=0.05))
            await store.record_usage(rows)
        finally:
            await store.close()

    with ThreadPoolExecutor(1) as pool:
        pool.submit(lambda: asyncio.run(write())).result()


def operator_data(page: Page, base: str, db: Path) -> None:
    """Models, teams and keys through the API, as an operator's scripts would make them."""
    req = page.context.request
    import yaml

    trial = yaml.safe_load(cpu_yaml("trial", description="Qwen coder trial", min_=1))
    trial["scaling"]["max"] = 3
    for body in (trial, {"name": "partner-llm", "upstream": ["http://127.0.0.1:9/v1"],
                         "description": "A partner's hosted model"}):
        r = req.post(f"{base}/api/v1/models?skip_source_check=true", data=body, headers=API)
        assert r.ok, r.text()
    for team, limits in (("research", {"tokens_per_day": 200000, "models": ["trial"]}),
                         ("web", {"rpm": 600, "priority": "interactive"})):
        r = req.post(f"{base}/api/v1/teams", data={"name": team, "limits": limits},
                     headers=API)
        assert r.ok, r.text()
    for key, team in (("research-ci", "research"), ("research-nb", "research"),
                      ("web-prod", "web")):
        r = req.post(f"{base}/api/v1/keys", data={"name": key, "team": team}, headers=API)
        assert r.ok, r.text()
    record_traffic(db)


@pytest.fixture
def walker(browser: Browser, errors: list[str]) -> Iterator[dict[str, Page]]:
    pages = {"laptop": open_page(browser, errors, LAPTOP),
             "phone": open_page(browser, errors, PHONE)}
    yield pages
    for p in pages.values():
        p.context.close()
    expect.set_options(timeout=None)


def test_every_page_fits_a_phone_and_a_laptop_agrees_with_the_api_and_reloads(
        live: tuple[str, AppContext], walker: dict[str, Page], errors: list[str],
        tmp_path: Path) -> None:
    """Walk every admin page linked from the models page, at both sizes: none overflows
    sideways, wraps text letter by letter, weighs over 150 KB, shows a number the API
    disagrees with, or has a form whose URL or answer cannot be reloaded."""
    base, _ = live
    for pg in walker.values():
        sign_in(pg, base)
    operator_data(walker["laptop"], base, tmp_path / "llmgw.db")
    problems: list[str] = []
    numbers = forms = 0
    seen: list[str] = []
    todo = [f"{base}/admin/models"]
    while todo and len(seen) < MAX_PAGES:
        url = todo.pop(0)
        if url in seen:
            continue
        seen.append(url)
        for size, pg in walker.items():
            response = pg.goto(url)
            assert response is not None
            where = f"{url.removeprefix(base)} at {size}"
            if response.status != 200:
                problems.append(f"{where}: answers {response.status}")
                continue
            body = len(response.body())
            if body > MAX_PAGE_BYTES:
                problems.append(f"{where}: {body:,} bytes")
            problems += [f"{where}: {p}" for p in layout_problems(pg)]
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            name = url.removeprefix(f"{base}/admin/").replace("/", "-").replace("?", "-")
            pg.screenshot(path=str(ARTIFACTS / f"walk-{name or 'root'}-{size}.png"),
                          full_page=True)
            found, compared = number_problems(pg, base)
            problems += [f"{where}: {p}" for p in found]
            numbers += compared
            if size == "laptop":
                todo += [u for u in links(pg, base) if u not in seen and u not in todo]
        # Forms are submitted on the phone, where a refusal's problems must still fit.
        found, submitted = form_problems(walker["phone"], base, url)
        problems += [f"{url.removeprefix(base)}: {p}" for p in found]
        forms += submitted
    walked = {u.removeprefix(base).split("?")[0] for u in seen}
    for must in ("/admin/models", "/admin/models/trial", "/admin/models/partner-llm",
                 "/admin/models/prod-chat", "/admin/add", "/admin/fleet", "/admin/usage",
                 "/admin/teams", "/admin/models/trial/remove"):
        assert must in walked, f"{must} is not reachable from the navigation"
    assert not problems, "\n".join(problems)
    assert numbers >= 80, f"only {numbers} numbers were checked against the API"
    assert forms >= 10, f"only {forms} forms were submitted"
    assert errors == []
