"""Admin authentication for the control API.

An admin token is sent as ``Authorization: Bearer <token>``. Each configured
token has a name, and that name is the identity recorded on the changes made
with it ("added by ops-alice"). Tokens are compared in constant time against
every configured one, so the comparison leaks neither which token nor how
much of one matched.

With no admin token configured the admin API refuses every call and says how
to configure one: an open control plane is not a default anyone should get by
omission. Inference API keys (``llmgw keys``) never open admin endpoints.
"""

from __future__ import annotations

from typing import Any

from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler

from llmgw.control.context import AppContext
from llmgw.control.identity import identify
from llmgw.errors import AuthError
from llmgw.gateway.request import AUTHENTICATED


def bearer(connection: ASGIConnection[Any, Any, Any, Any]) -> str | None:
    header = connection.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def admin_guard(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
    ctx: AppContext = connection.app.state.ctx
    tokens = ctx.config.admin_token_names()
    if not tokens:
        raise AuthError(
            "no admin token is configured on this server; set LLMGW_ADMIN_TOKENS "
            "(or admin_tokens in the configuration file) and restart it")
    name = identify(tokens, bearer(connection))
    if name is None:
        raise AuthError("a valid admin token is required (Authorization: Bearer <token>)")
    connection.scope["state"]["actor"] = name
    connection.scope["state"][AUTHENTICATED] = True


def actor(connection: ASGIConnection[Any, Any, Any, Any]) -> str:
    """The identity the guard established for this request."""
    return str(connection.scope["state"].get("actor", "unknown"))
