"""Screenshots of every admin console page, at a laptop's and a phone's size, for the README.

    .venv/bin/python bench/console_screens.py [--out docs/console]

Runs the same whole llmgw process the console's browser tests use
(``tests/admin/console_fleet.py``: gateway, store, simulated engines, two
teams, three keys and a few dozen requests, one team over budget), drives
Debian's Chromium (``/usr/bin/chromium`` or ``LLMGW_CHROMIUM``) through
Playwright, and writes ``<page>-1280.png`` (1280×900) and ``<page>-390.png``
(390×844) of the visible window — not the full page, which keeps each file
small and shows what a person sees first.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from playwright.sync_api import Page, sync_playwright  # noqa: E402

from tests.admin.conftest import ADMIN_TOKEN  # noqa: E402
from tests.admin.console_fleet import start_fleet  # noqa: E402

SIZES = {"1280": {"width": 1280, "height": 900}, "390": {"width": 390, "height": 844}}
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
WAIT_MS = 60_000


def pages(logs: dict[str, object]) -> list[tuple[str, str]]:
    return [
        ("models", "/admin/models"), ("live", "/admin/live"), ("replicas", "/admin/replicas"),
        ("replica", "/admin/replica?id=team-chat-1"), ("playground", "/admin/playground"),
        ("spend", "/admin/spend"), ("key", "/admin/keys/ml-ci"), ("logs", "/admin/logs"),
        ("log-entry", f"/admin/logs/request?team=ml&id={logs['id']}&at={logs['at']}"),
        ("guided", "/admin/guided?check=1&name=qwen-small&source=hf%3A%2F%2FQwen%2FQwen2.5-"
                   "0.5B-Instruct&engine=vllm&gpu_class=h100-80g&gpus=1&min=1&cpu_cores=8"
                   "&memory=32GiB"),
        ("mirror", "/admin/mirror"), ("usage", "/admin/usage"), ("fleet", "/admin/fleet"),
    ]


def sign_in(page: Page, base: str) -> None:
    page.goto(f"{base}/admin/models")
    page.fill("#token", ADMIN_TOKEN)
    page.click("button:has-text('Sign in')")
    page.wait_for_url(f"{base}/admin/models")


def chat(page: Page) -> None:
    """One exchange in the playground, so its screenshot shows an answer and its figures."""
    page.fill("#pg-model", "team-chat")
    page.check("input[name=as][value=team]")
    page.select_option("#pg-team", "ml")
    page.fill("#pg-prompt", "What does a replica do?")
    page.click("#pg-go")
    page.wait_for_selector("#playground[data-answered]")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "console")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    chromium = os.environ.get("LLMGW_CHROMIUM", "/usr/bin/chromium")
    with tempfile.TemporaryDirectory() as tmp:
        fleet_gen = start_fleet(Path(tmp))
        fleet, _ = next(fleet_gen)
        try:
            with fleet.api() as api:
                logs = api.get("/api/v1/teams/ml/logs", params={"limit": 1}).json()[0]
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=chromium, args=ARGS)
                for size, viewport in SIZES.items():
                    context = browser.new_context(viewport=viewport, timezone_id="Europe/Paris")
                    context.set_default_timeout(WAIT_MS)
                    page = context.new_page()
                    sign_in(page, fleet.url)
                    for name, path in pages(logs):
                        page.goto(fleet.url + path)
                        if name == "playground":
                            chat(page)
                        if name == "live":
                            # A refresh gives rates over a window; traffic in between.
                            for key in ("ml-ci", "ml-notebook", "web-app"):
                                fleet.chat(key, stream=True)
                            page.wait_for_selector("#live-table[data-refreshed]")
                        page.wait_for_load_state("networkidle")
                        time.sleep(0.2)   # the script's rewriting of times settles
                        target = args.out / f"{name}-{size}.png"
                        page.screenshot(path=str(target))
                        print(f"{target.relative_to(ROOT)}  {target.stat().st_size:,} bytes")
                    context.close()
                browser.close()
        finally:
            fleet_gen.close()


if __name__ == "__main__":
    main()
