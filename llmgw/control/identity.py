"""Who is asking: an admin token turned into the name recorded on every change.

Each configured token has a name, and that name is the identity recorded on
the changes made with it ("added by ops-alice"). Tokens are compared in
constant time against every configured one, so the comparison leaks neither
which token nor how much of one matched. The JSON API reads the token from
``Authorization``; the admin page from its sign-in form.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

import msgspec

from llmgw.config import ServerConfig

Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def identify(tokens: dict[str, str], presented: str | None) -> str | None:
    """The name of the admin token ``presented``, or None; constant time per token."""
    if presented is None:
        return None
    found = None
    given = presented.encode()
    for token, name in tokens.items():
        if hmac.compare_digest(token.encode(), given):
            found = name
    return found


def bearer_of(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The token of an ``Authorization: Bearer`` header in raw ASGI headers."""
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() or None if scheme.lower() == "bearer" else None
    return None


def is_private(path: str, config: ServerConfig) -> bool:
    """Whether ``path`` needs an admin token under ``metrics: {public: false}``."""
    if config.metrics.public:
        return False
    return path in {"/metrics", "/api/docs"} or path.startswith("/api/docs/")


async def refuse_unless_admin(scope: MutableMapping[str, Any], send: Send,
                              config: ServerConfig) -> bool:
    """For a private path without an admin token, answer 401 and return True."""
    if identify(config.admin_token_names(), bearer_of(scope["headers"])) is not None:
        return False
    body = msgspec.json.encode({"error": {
        "message": f"{scope['path']} needs an admin token (Authorization: Bearer <token>): "
                   "metrics.public is false in this server's configuration",
        "type": "unauthorized", "param": None, "code": 401}})
    await send({"type": "http.response.start", "status": 401, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"www-authenticate", b"Bearer")]})
    await send({"type": "http.response.body", "body": body})
    return True
