"""The admin web page, served by the control API's own app under ``/admin``.

Server-rendered HTML from Jinja templates, one small script of our own that
refreshes status fragments, no build step. It is a second face on the same
model service as the JSON API and ``llmgw ctl``, not a second implementation:
every figure comes from the API's view functions and every change goes
through ``ModelService``, so a refusal reads the same here as in the CLI.

Layout of the package:

* ``session``  — sign-in turns an admin token into a signed session cookie;
  why the signing key is derived from the tokens is argued there;
* ``csrf``     — the per-session token every form carries and every POST checks;
* ``signin``   — sign-in and sign-out, and the guard on everything else;
* ``pages``    — the read-only pages and their status fragments;
* ``actions``  — add (source check first), scale, remove, roll out;
* ``locate``   — which line of pasted YAML an error's field is on (pure);
* ``render``   — the Jinja environment (autoescaped) and the page helper;
* ``routes``   — the router, its guards, error pages and security headers.

``create_app`` mounts ``routers()`` and sets ``template_config()``.
"""

from __future__ import annotations

from llmgw.admin.render import template_config
from llmgw.admin.routes import routers

__all__ = ["routers", "template_config"]
