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

Every rule a request's types state is in the document, taken from the types
the decoder uses (``msgspec.Meta`` on a field, ``llmgw.catalog.rules`` for
names): Litestar states a field's own constraints but drops those of a list's
items and a bound of zero, which ``_state_field_rules`` copies from msgspec's
own view of the struct (``msgspec.inspect``), and a struct whose fields
exclude each other (``EXCLUSIVE``) says so with ``not``. What remains is what
no JSON Schema can say, because it depends on the world rather than the
request: ``BEYOND_SCHEMA`` names those operations, and their 400 says what
they check.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec
import msgspec.inspect as mi
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


# Operations whose bodies are checked against facts outside the request, which no
# schema can state: a 400 for a body the schema admits is an answer, not a bug.
BEYOND_SCHEMA: dict[tuple[str, str], str] = {
    ("post", "/api/v1/models"): (
        "The definition is wrong, or cannot run here: beyond what the schema states, its "
        "source must exist and be reachable (a local path on the server's host, a Hugging "
        "Face repository or file, a mirror URL) unless skip_source_check, a profile's "
        "gpu_class must be one server.yaml defines, a fallback must name a model in the "
        "catalog, and a scheduled model and an external one each need their own fields "
        "(the message names the field)"),
    ("post", "/api/v1/plan"): (
        "The request is wrong, or the planner cannot reason about it: beyond what the "
        "schema states, config must describe an architecture the planner knows (its "
        "model_type), with the fields that architecture needs (the message names them)"),
    ("post", "/api/v1/adapters"): (
        "The adapter is wrong, or cannot be served: beyond what the schema states, its "
        "base must be a model in the catalog that serves adapters (a vLLM model with a "
        "`lora:` block), its rank at most that base's max_rank, its name no model's, and "
        "its source a LoRA adapter (adapter_config.json) a replica can load, unless "
        "skip_source_check (the message names the field)"),
    ("post", "/api/v1/source-check"): (
        "The source is not there: not found (a local path that does not exist on the "
        "server's host), gated, unauthorised or unreachable (the message says which)"),
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


def _documented(components: Components) -> Iterator[tuple[type[msgspec.Struct], Schema]]:
    """Each strict request struct with the component schema Litestar made of it."""
    strict = _strict_structs()
    for name, schema in (components.schemas or {}).items():
        struct = strict.get(name)
        if (struct is not None and isinstance(schema, Schema) and schema.properties is not None
                and set(schema.properties) <= set(struct.__struct_fields__)):
            yield struct, schema


def _unwrapped(t: Any) -> list[Any]:
    """msgspec's type ``t`` without its metadata, an optional's arms each on their own."""
    if isinstance(t, mi.Metadata):
        return _unwrapped(t.type)
    if isinstance(t, mi.UnionType):
        return [u for arm in t.types for u in _unwrapped(arm)]
    return [t]


def _rules_of(t: Any) -> dict[str, Any]:
    """The constraints msgspec checks on a value of type ``t`` (an optional's one arm), as
    Litestar's Schema names them."""
    out: dict[str, Any] = {}
    if isinstance(t, mi.UnionType):
        arms = [a for a in t.types if not isinstance(a, mi.NoneType)]
        return _rules_of(arms[0]) if len(arms) == 1 else {}
    if isinstance(t, mi.Metadata):
        out.update(_rules_of(t.type))
        description = (t.extra_json_schema or {}).get("description")
        if description:
            out["description"] = description
    elif isinstance(t, mi.StrType):
        out.update(min_length=t.min_length, max_length=t.max_length, pattern=t.pattern)
    elif isinstance(t, mi.IntType | mi.FloatType):
        out.update(minimum=t.ge, maximum=t.le, exclusive_minimum=t.gt, exclusive_maximum=t.lt)
    return {k: v for k, v in out.items() if v is not None}


def _arrays(schema: Any) -> list[Schema]:
    """``schema`` if it is an array, else its arms that are (an optional list is a oneOf)."""
    arms = getattr(schema, "one_of", None) or [schema]
    return [a for a in arms if isinstance(a, Schema) and a.type == OpenAPIType.ARRAY]


def _fill(schema: Schema, rules: dict[str, Any]) -> None:
    for attribute, value in rules.items():
        if getattr(schema, attribute) is None:
            setattr(schema, attribute, value)


def _state_field_rules(struct: type[msgspec.Struct], schema: Schema) -> None:
    """Give ``schema``'s fields every constraint msgspec checks on them and on their items.

    Litestar states a field's own constraints except a zero (``gt=0`` is dropped as if
    it were absent), and none of a list's items'.
    """
    info = mi.type_info(struct)
    assert isinstance(info, mi.StructType)
    for field in info.fields:
        mine = (schema.properties or {}).get(field.encode_name)
        if not isinstance(mine, Schema):
            continue
        arms = [t for t in _unwrapped(field.type) if not isinstance(t, mi.NoneType)]
        if len(arms) == 1:
            _fill(mine, {k: v for k, v in _rules_of(field.type).items() if k != "description"})
        lists = [t for t in arms if isinstance(t, mi.ListType)]
        for ours, theirs in zip(_arrays(mine), lists, strict=False):
            if isinstance(ours.items, Schema):
                _fill(ours.items, _rules_of(theirs.item_type))


def _state_exclusions(struct: type[msgspec.Struct], schema: Schema) -> None:
    """A struct whose ``EXCLUSIVE`` fields may not all be given: ``not`` all of them."""
    exclusive: tuple[str, ...] = getattr(struct, "EXCLUSIVE", ())
    if exclusive:
        schema.schema_not = Schema(
            required=list(exclusive),
            properties={f: Schema(schema_not=Schema(type=OpenAPIType.NULL)) for f in exclusive})


def _state_rules(components: Components) -> None:
    """Unknown fields refused, items' constraints and exclusions stated, for every request."""
    for struct, schema in _documented(components):
        schema.additional_properties = False
        _state_field_rules(struct, schema)
        _state_exclusions(struct, schema)


def tell_the_truth(app: Litestar) -> None:
    """Rewrite ``app``'s OpenAPI document to list every answer the server gives."""
    document = app.openapi_schema
    components = document.components
    if components.schemas is None:
        components.schemas = {}
    components.schemas[ERROR] = _ERROR_SCHEMA
    _state_rules(components)
    ref = Reference(f"#/components/schemas/{ERROR}")
    error = {"application/json": OpenAPIMediaType(schema=ref)}
    for path, item in (document.paths or {}).items():
        for method in ("get", "put", "post", "delete", "patch"):
            operation: Any = getattr(item, method, None)
            if operation is None:
                continue
            responses = operation.responses or {}
            for status in _answers(path, method, operation.request_body is not None):
                why = _WHY[status]
                if status == 400:
                    why = BEYOND_SCHEMA.get((method, path), why)
                responses[str(status)] = OpenAPIResponse(description=why, content=error)
            operation.responses = responses


def allowed_methods(app: Litestar, path_template: str) -> list[str]:
    """The methods the document lists for ``path_template``, and OPTIONS; [] if none."""
    item = (app.openapi_schema.paths or {}).get(path_template)
    if item is None:
        return []
    found = [m.upper() for m in ("get", "put", "post", "delete", "patch")
             if getattr(item, m, None) is not None]
    return sorted([*found, "OPTIONS"])
