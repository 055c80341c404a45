"""Path and query parameters that carry the rule of the name they stand for.

A model, a team or a key is named in a path (``/models/{name}``) or a query
(``/replicas?model=``) by the same name a request body or a catalog file
writes in its ``name`` field, so the parameter takes that field's constraint
(``llmgw.catalog.rules``): ``in_path(MODEL_NAME)`` is the ``msgspec.Meta`` of
``ModelName`` restated as Litestar's parameter, which Litestar checks (400) and
states in the OpenAPI document. A name that breaks the rule is refused for
what it is, rather than looked up and answered "no such model" (404).
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from litestar.params import PathParameter, QueryParameter

from llmgw.catalog.model import MODEL_NAME
from llmgw.control.tenants import MAX_LOGS
from llmgw.tenancy import KEY_NAME, TEAM_NAME

_CONSTRAINTS = ("pattern", "min_length", "max_length", "ge", "gt", "le", "lt", "description")


def _kwargs(meta: msgspec.Meta) -> dict[str, Any]:
    return {k: getattr(meta, k) for k in _CONSTRAINTS if getattr(meta, k) is not None}


def in_path(meta: msgspec.Meta) -> PathParameter:
    """A path parameter constrained as ``meta`` constrains a field."""
    return PathParameter(**_kwargs(meta))


def in_query(meta: msgspec.Meta) -> QueryParameter:
    """A query parameter constrained as ``meta`` constrains a field."""
    return QueryParameter(**_kwargs(meta))


ModelPath = Annotated[str, in_path(MODEL_NAME)]
TeamPath = Annotated[str, in_path(TEAM_NAME)]
KeyPath = Annotated[str, in_path(KEY_NAME)]
ModelQuery = Annotated[str | None, in_query(MODEL_NAME)]
TeamQuery = Annotated[str | None, in_query(TEAM_NAME)]
LogLimit = Annotated[int, in_query(msgspec.Meta(
    ge=1, le=MAX_LOGS, description=f"How many logs, newest first: 1 to {MAX_LOGS}"))]
