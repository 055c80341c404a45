"""The control API's OpenAPI document, made to say what the server does.

Litestar derives the document from the handlers' signatures, which know the
happy path only: it lists 200 and, where a handler has parameters, a 400 in
Litestar's own error shape. The server answers more than that and in another
shape — every error is ``{"error": {...}}`` (``llmgw.api.errors``), a missing
or wrong admin token is 401, an unknown model 404, a refused change 409, an
unreachable store or scheduler 503 — and it refuses request bodies the
derived schemas would admit: unknown fields (every request struct forbids
them), a size or a duration not written the way the decoder reads them.

``tell_the_truth`` rewrites the generated document in place, once, when the
app is built, so the document served at ``/api/docs`` and the checked-in
``api/openapi.json`` are the same and a client generated from either expects
what it will get. Schemathesis checks the two against each other in CI
(``tests/control/test_openapi_conformance.py``).
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Litestar
from litestar.openapi.spec import (
    Components,
    OpenAPIMediaType,
    OpenAPIResponse,
    OpenAPIType,
    Reference,
    Schema,
)

from llmgw.catalog import model as catalog_model
from llmgw.control import actions

ERROR = "Error"

_ERROR_SCHEMA = Schema(
    type=OpenAPIType.OBJECT, required=["error"], additional_properties=False,
    properties={"error": Schema(
        type=OpenAPIType.OBJECT, required=["message", "type", "param", "code"],
        properties={
            "message": Schema(type=OpenAPIType.STRING, description="What went wrong, where, "
                                                                   "and what to do"),
            "type": Schema(type=OpenAPIType.STRING, description="The kind of error"),
            "param": Schema(one_of=[Schema(type=OpenAPIType.STRING),
                                    Schema(type=OpenAPIType.NULL)],
                            description="The field at fault, if one is"),
            "code": Schema(type=OpenAPIType.INTEGER, description="The HTTP status"),
        })},
)

_WHY = {
    400: "The request is wrong: a field, a definition, the body (the message says which)",
    401: "No admin token, or not a valid one",
    404: "No model (or other named thing) by that name",
    409: "A valid change that is not allowed here (a declared model, a fallback in use, "
         "a name already taken, an external model for a scheduler action)",
    413: "The request body is larger than 1 MiB",
    503: "The store or the scheduler cannot be reached; retry later",
}


# Creating what exists is refused; a key names a team that may not exist.
_CREATES = {"/api/v1/teams": [409], "/api/v1/keys": [404, 409]}


def _answers(path: str, method: str, has_body: bool) -> list[int]:
    """The error statuses ``method path`` can answer."""
    if not path.startswith("/api/v1/"):
        return [503] if path == "/readyz" else []
    out = [400, 401, 503]
    named = "{name}" in path or path == "/api/v1/replicas"
    if named:
        out.append(404)
    if named and (method != "get" or path.endswith("/prefetch")):
        out.append(409)
    if method == "post":
        out.extend(_CREATES.get(path, []))
    if has_body:
        out.append(413)
    return sorted(set(out))


def _strict_structs() -> dict[str, type[msgspec.Struct]]:
    """Request structs that refuse unknown fields, by the name the document gives them."""
    from llmgw import tenancy
    from llmgw.api import models, plan, sourcecheck
    from llmgw.control import tenants

    found: dict[str, type[msgspec.Struct]] = {}
    for module in (catalog_model, models, actions, plan, sourcecheck, tenancy, tenants):
        for value in vars(module).values():
            if (isinstance(value, type) and issubclass(value, msgspec.Struct)
                    and value.__struct_config__.forbid_unknown_fields):
                found.setdefault(value.__name__, value)
    return found


def _refuse_unknown_fields(components: Components) -> None:
    strict = _strict_structs()
    for name, schema in (components.schemas or {}).items():
        struct = strict.get(name)
        if (struct is not None and isinstance(schema, Schema) and schema.properties is not None
                and set(schema.properties) <= set(struct.__struct_fields__)):
            schema.additional_properties = False


def tell_the_truth(app: Litestar) -> None:
    """Rewrite ``app``'s OpenAPI document to list every answer the server gives."""
    document = app.openapi_schema
    components = document.components
    if components.schemas is None:
        components.schemas = {}
    components.schemas[ERROR] = _ERROR_SCHEMA
    _refuse_unknown_fields(components)
    ref = Reference(f"#/components/schemas/{ERROR}")
    error = {"application/json": OpenAPIMediaType(schema=ref)}
    for path, item in (document.paths or {}).items():
        for method in ("get", "put", "post", "delete", "patch"):
            operation: Any = getattr(item, method, None)
            if operation is None:
                continue
            responses = operation.responses or {}
            for status in _answers(path, method, operation.request_body is not None):
                responses[str(status)] = OpenAPIResponse(description=_WHY[status],
                                                         content=error)
            operation.responses = responses


def allowed_methods(app: Litestar, path_template: str) -> list[str]:
    """The methods the document lists for ``path_template``, and OPTIONS; [] if none."""
    item = (app.openapi_schema.paths or {}).get(path_template)
    if item is None:
        return []
    found = [m.upper() for m in ("get", "put", "post", "delete", "patch")
             if getattr(item, m, None) is not None]
    return sorted([*found, "OPTIONS"])
