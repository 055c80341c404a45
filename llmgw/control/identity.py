"""Who is asking: an admin token turned into the name recorded on every change.

Each configured token has a name, and that name is the identity recorded on
the changes made with it ("added by ops-alice"). Tokens are compared in
constant time against every configured one, so the comparison leaks neither
which token nor how much of one matched. The JSON API reads the token from
``Authorization``; the admin page from its sign-in form.
"""

from __future__ import annotations

import hmac


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
