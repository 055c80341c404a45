"""The console's page walk: every page, at a laptop's and a phone's width, checked the
same way (``check_page``). Any browser test can call it on the page it has open.

What a page must pass:

* **no horizontal overflow**: the document is no wider than the window (a wide
  table scrolls inside its own box), the header spans the window, and no text is
  wrapped a few letters per line;
* **labels**: every field a person fills in has a label a screen reader reads;
* **weight**: the HTML under ``MAX_PAGE_BYTES``;
* **numbers agree with the API**: every number marked with ``data-api`` (the
  ``api_number`` helper of ``llmgw.admin.render``) equals the value at its
  ``data-api-path`` in the JSON the API answers at ``data-api``;
* **forms can be reloaded**: a GET on every form's action lands on an HTML page
  (never a JSON 405), and a form submitted as it stands (its typed fields emptied,
  so it is refused, or harmless) ends on a page loaded by GET, which passes the
  layout checks with its problems shown. A form marked ``data-destructive`` (the
  last step of removing a model) is not submitted.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin, urlsplit

from .conftest import ADMIN_TOKEN

if TYPE_CHECKING:
    from playwright.sync_api import Page, Request

LAPTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}
MAX_PAGE_BYTES = 150_000
# Fewer characters than this per line, over three lines or more, is text squeezed into
# a column too narrow for it.
MIN_CHARS_PER_LINE = 4

# The layout checks, run in the page. Returns a list of problems, each naming the
# element (tag, id or class, and its text) so a failure says where to look.
_LAYOUT = """() => {
  const out = [];
  const name = (el) => el.tagName.toLowerCase() + (el.id ? "#" + el.id : "")
    + (typeof el.className === "string" && el.className
       ? "." + el.className.trim().split(/\\s+/).join(".") : "");
  const width = window.innerWidth;
  const doc = document.documentElement;
  if (doc.scrollWidth > width + 1) {
    const culprits = [];
    for (const el of document.body.querySelectorAll("*")) {
      const r = el.getBoundingClientRect();
      if (r.right <= width + 1 || r.width === 0) continue;
      let p = el.parentElement, clipped = false;
      while (p && p !== document.body) {
        const o = getComputedStyle(p).overflowX;
        if (o === "auto" || o === "scroll" || o === "hidden") { clipped = true; break; }
        p = p.parentElement;
      }
      if (!clipped) culprits.push(name(el) + " to " + Math.round(r.right) + "px");
      if (culprits.length >= 5) break;
    }
    out.push("the page is " + doc.scrollWidth + "px wide in a " + width + "px window: "
             + culprits.join(", "));
  }
  const header = document.querySelector("header.top");
  if (header && header.getBoundingClientRect().width < doc.scrollWidth - 1) {
    out.push("the header is " + Math.round(header.getBoundingClientRect().width)
             + "px wide on a " + doc.scrollWidth + "px page");
  }
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  let node;
  while ((node = walker.nextNode())) {
    const text = node.textContent.trim();
    if (text.length < 8) continue;
    const el = node.parentElement;
    if (!el || el.closest("svg, pre, code.key, textarea, script, style, [hidden]")) continue;
    const range = document.createRange();
    range.selectNodeContents(node);
    const tops = new Set();
    for (const r of range.getClientRects()) if (r.width > 0) tops.add(Math.round(r.top));
    const lines = tops.size;
    if (lines >= 3 && text.length / lines < __MIN__) {
      out.push(name(el) + " wraps '" + text.slice(0, 30) + "' over " + lines + " lines");
    }
  }
  for (const field of document.querySelectorAll(
      "input:not([type=hidden]), select, textarea")) {
    const labelled = field.getAttribute("aria-label") || field.getAttribute("aria-labelledby")
      || (field.id && document.querySelector("label[for='" + CSS.escape(field.id) + "']"))
      || field.closest("label");
    if (!labelled) out.push(name(field) + " (" + (field.name || "?") + ") has no label");
  }
  return out;
}""".replace("__MIN__", str(MIN_CHARS_PER_LINE))

_NUMBERS = """() => Array.from(document.querySelectorAll("[data-api]")).map((el) => ({
  api: el.dataset.api, path: el.dataset.apiPath, value: el.dataset.value,
  text: el.textContent.trim()}))"""

_FORMS = """() => Array.from(document.querySelectorAll("form[method=post]")).map((f, i) => ({
  index: i, action: f.getAttribute("action"), id: f.id,
  destructive: f.hasAttribute("data-destructive")}))"""


def _at(answer: Any, path: list[Any]) -> Any:
    """The value at ``path``: keys, indexes, or {field: value, ...} for the one list item
    with those values."""
    for step in path:
        if isinstance(step, dict):
            found = [item for item in answer
                     if all(item.get(f) == wanted for f, wanted in step.items())]
            assert len(found) == 1, f"{len(found)} items with {step} in the API's answer"
            answer = found[0]
        else:
            answer = answer[step]
    return answer


def _number(text: str) -> float | None:
    cleaned = text.replace(",", "").replace("\u2009", "").strip()
    return float(cleaned) if re.fullmatch(r"-?\d+(\.\d+)?", cleaned) else None


def layout_problems(page: Page) -> list[str]:
    problems: list[str] = page.evaluate(_LAYOUT)
    return problems


def number_problems(page: Page, base: str) -> tuple[list[str], int]:
    """Problems with the marked numbers of the page, and how many were compared."""
    out: list[str] = []
    answers: dict[str, Any] = {}
    marked = page.evaluate(_NUMBERS)
    for n in marked:
        if n["api"] not in answers:
            r = page.context.request.get(urljoin(base, n["api"]),
                                         headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
            assert r.ok, f"{n['api']} answered {r.status}"
            answers[n["api"]] = r.json()
        expected = _at(answers[n["api"]], json.loads(n["path"]))
        shown = _number(n["text"])
        if shown is None:  # formatted (a size, a share): the raw value rides along
            shown = float(n["value"]) if n["value"] else None
        if expected is None:
            if shown is not None:
                out.append(f"{n['api']} {n['path']}: the page shows {n['text']}, the API null")
        elif shown is None or abs(shown - float(expected)) > 1e-6 * max(1.0, abs(expected)):
            out.append(f"{n['api']} {n['path']}: the page shows {n['text']!r}, "
                       f"the API {expected!r}")
    return out, len(marked)


def form_problems(page: Page, base: str, url: str) -> tuple[list[str], int]:
    """GET every form's action, and submit each (but destructive ones and sign-out);
    the problems, and how many forms were submitted."""
    out: list[str] = []
    forms = page.evaluate(_FORMS)
    for f in forms:
        action = urljoin(url, f["action"])
        r = page.context.request.get(action)
        kind = r.headers.get("content-type", "")
        if r.status != 200 or not kind.startswith("text/html"):
            out.append(f"GET {f['action']} answers {r.status} {kind}, not a page")
    submitted = 0
    for f in forms:
        if f["destructive"] or f["action"].endswith("/signout"):
            continue
        submitted += 1
        page.goto(url)
        navigations: list[Request] = []

        def seen(req: Request, into: list[Request] = navigations) -> None:
            if req.is_navigation_request() and req.frame == page.main_frame:
                into.append(req)

        page.on("request", seen)
        try:
            with page.expect_navigation(wait_until="load"):
                page.evaluate("""(i) => {
                  const f = document.querySelectorAll("form[method=post]")[i];
                  f.noValidate = true;
                  f.querySelectorAll("input:not([type=hidden]), textarea").forEach((el) => {
                    if (el.type !== "number") el.value = "";
                  });
                  f.requestSubmit();
                }""", f["index"])
        finally:
            page.remove_listener("request", seen)
        if not navigations:
            out.append(f"submitting {f['id'] or f['action']} did not navigate")
            continue
        last = navigations[-1]
        if last.method != "GET":
            out.append(f"submitting {f['id'] or f['action']} ends on a {last.method} answer "
                       f"({urlsplit(last.url).path}): reloading it would post again")
            continue
        response = page.reload()
        if response is None or response.status != 200:
            out.append(f"reloading after {f['id'] or f['action']} answers "
                       f"{response.status if response else 'nothing'}")
            continue
        # The page a refused form leads to, its problems shown, must fit as well.
        out += [f"after {f['id'] or f['action']}: {p}" for p in layout_problems(page)]
    return out, submitted


def links(page: Page, base: str) -> list[str]:
    """The admin pages this page links to (same origin, GET pages, no static files)."""
    hrefs: list[str] = page.evaluate(
        "() => Array.from(document.querySelectorAll('a[href]')).map((a) => a.href)")
    out = []
    for h in hrefs:
        parts = urlsplit(h)
        if not h.startswith(base) or not parts.path.startswith("/admin/"):
            continue
        if parts.path.startswith(("/admin/static/", "/admin/signin", "/admin/fragments/")):
            continue
        out.append(f"{base}{parts.path}" + (f"?{parts.query}" if parts.query else ""))
    return out
