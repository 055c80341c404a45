"""The API's documentation page, served from this package, and the policy of every page here.

``/api/docs`` shares its origin with the admin console, whose session cookie
opens every change to the catalog and the tenants. A page there that loads
script from elsewhere — Litestar's default Redoc comes from a CDN, unpinned —
runs that script with the admin's cookies: whoever serves or alters it owns
the control plane. So the page loads only this package's copy of Redoc,
with a Subresource Integrity hash, and no font, icon or script from anywhere
else; Litestar's other renderers (Swagger UI, Elements, RapiDoc, all from
CDNs) are not served at all.

**The vendored file.** ``docs_assets/redoc.standalone.js`` is
``bundles/redoc.standalone.js`` of the npm package ``redoc`` 2.5.4, byte for
byte (MIT; ``redoc.LICENSE.txt`` is the package's licence, and
``redoc.standalone.js.LICENSE.txt`` the notices of what it bundles). Version
2 rather than 3: 3.0 is weeks old and fetches its icons from a CDN at run
time. To update it: ``npm pack redoc@VERSION``, copy the two files out of the
tarball, and change ``REDOC_VERSION``; ``REDOC_SHA384`` is computed from the
file when the module loads, and a test checks the page's integrity attribute
against the bytes served. Litestar's own renderers were the alternative that
needs no vendored file, and were rejected: every one of them also loads its
script from a CDN.

**The Content-Security-Policy** (``content_security_policy``) is sent on
every response of the control app — the API, the docs page, and the admin
console mounted in it — by one middleware (``SecurityHeadersMiddleware``),
replacing any a handler set, so there is one policy on the wire, decided
here: ``default-src 'self'``, no plugins, no framing, no ``<base>``, forms
only to this origin. The docs page alone also allows inline *styles* (Redoc
styles itself by injecting ``<style>`` elements), ``data:`` images, and a
``blob:`` worker (its search index); never inline or foreign script.
Redoc's side menu shows a "by Redocly" logo from its CDN: the policy blocks
it (a console message, no request), which is the point.
"""

from __future__ import annotations

import base64
import hashlib
import html
from pathlib import Path
from typing import Any

from litestar import Request, Response, get
from litestar.datastructures import MutableScopeHeaders
from litestar.enums import ScopeType
from litestar.openapi.plugins import OpenAPIRenderPlugin
from litestar.types import ASGIApp, Message, Receive, Scope, Send

ASSETS = Path(__file__).parent / "docs_assets"
REDOC_VERSION = "2.5.4"
REDOC_FILE = ASSETS / "redoc.standalone.js"
REDOC_PATH = f"/api/assets/redoc-{REDOC_VERSION}.standalone.js"
DOCS_PATH = "/api/docs"

_redoc = REDOC_FILE.read_bytes()
REDOC_SHA384 = "sha384-" + base64.b64encode(hashlib.sha384(_redoc).digest()).decode()

# script-src is what default-src says already; written out, it cannot be widened by
# accident when another directive is added here.
_BASE_POLICY = ("default-src 'self'", "script-src 'self'", "object-src 'none'",
                "base-uri 'none'", "frame-ancestors 'none'", "form-action 'self'")
_DOCS_EXTRA = ("style-src 'self' 'unsafe-inline'", "img-src 'self' data:",
               "worker-src 'self' blob:")


def content_security_policy(path: str) -> str:
    """The Content-Security-Policy of the response to ``path`` on the control app."""
    parts: tuple[str, ...] = _BASE_POLICY
    if path == DOCS_PATH or path.startswith(DOCS_PATH + "/"):
        parts = (*_BASE_POLICY, *_DOCS_EXTRA)
    return "; ".join(parts)


class SecurityHeadersMiddleware:
    """Puts ``content_security_policy`` (and ``nosniff``) on every HTTP response, in
    place of any Content-Security-Policy a handler set."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await self.app(scope, receive, send)
            return
        policy = content_security_policy(scope["path"])

        async def send_with_policy(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableScopeHeaders.from_message(message)
                headers["Content-Security-Policy"] = policy
                headers["X-Content-Type-Options"] = "nosniff"
            await send(message)

        await self.app(scope, receive, send_with_policy)


class VendoredRedoc(OpenAPIRenderPlugin):
    """Redoc from this package, pinned by its hash; nothing loaded from elsewhere."""

    def __init__(self) -> None:
        super().__init__(path="/", favicon="", style="")

    def render(self, request: Request[Any, Any, Any], openapi_schema: dict[str, Any]) -> bytes:
        title = html.escape(str(openapi_schema.get("info", {}).get("title", "API")))
        spec = html.escape(self.get_openapi_json_route(request), quote=True)
        # No inline script: Redoc finds the <redoc> element and its spec-url itself
        # when its script runs, which is why the script comes after it.
        return (
            "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            # No favicon request (the default would be a 404 on every visit).
            f"<title>{title}</title><link rel='icon' href='data:,'>"
            "<style>body { margin: 0 }</style></head><body>"
            f"<redoc spec-url='{spec}'></redoc>"
            f"<script src='{REDOC_PATH}' integrity='{REDOC_SHA384}' crossorigin='anonymous'>"
            "</script></body></html>"
        ).encode()


@get(REDOC_PATH, include_in_schema=False, media_type="text/javascript", sync_to_thread=False)
def redoc_script() -> Response[bytes]:
    """The vendored Redoc bundle; its path names its version, so it may be cached."""
    return Response(_redoc, media_type="text/javascript",
                    headers={"Cache-Control": "public, max-age=31536000, immutable"})
