"""Instants in a query string (``since``, ``until``): RFC 3339 date-times and nothing else.

Litestar would also read a bare number as seconds since 1970, which the
OpenAPI document does not say; an API that accepts more than it documents
cannot be checked against its document, so the text is parsed here.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, TypeAlias

from litestar.params import QueryParameter

from llmgw.errors import DefinitionError

Instant: TypeAlias = Annotated[str | None, QueryParameter(format="date-time")]


def instant(text: str | None, name: str) -> datetime | None:
    """``text`` as an aware datetime (UTC when it names no offset); None stays None."""
    if text is None:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise DefinitionError(f"{name}: {text!r} is not a date and time; give one as "
                              "2026-12-01T00:00:00Z", field=name) from None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
