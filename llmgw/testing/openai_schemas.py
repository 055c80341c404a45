"""The structure of OpenAI's API for the operations llmgw serves, extracted from its document.

    python -m llmgw.testing.openai_schemas openapi.yaml COMMIT > openai_schemas.json

(run from a checkout of openai/openai-openapi at COMMIT; the output goes to
``tests/gateway/openai_schemas.json``).

OpenAI publishes its API as an OpenAPI document (the ``openai/openai-openapi``
repository, MIT). The gateway's conformance tests validate what llmgw answers
against it, but the document is 3 MB of mostly prose and examples for two
hundred operations llmgw does not serve, and its prose is not ours to copy.
So the repository keeps an extract instead: for each operation llmgw serves,
its parameters, request body and answers, and every component schema those
reach, reduced to structure — types, properties, ``required``, enums,
``anyOf``/``oneOf``/``allOf``, bounds, formats, defaults that are plain values
— with every description, title, summary, example and vendor extension
dropped. ``nullable: true``, the OpenAPI 3.0 spelling
some of these schemas still use, is written as what it means in JSON Schema
(``anyOf`` the schema or ``null``), so that any JSON Schema validator reads the
extract as the document intends. References are rewritten to
``#/$defs/<name>`` and every schema one
of them names is in ``$defs``, so the file validates on its own (references
stay references rather than being inlined: the Responses schemas are
recursive, a filter of filters, and cannot be written out as one tree).

This module is run by hand when the pinned document moves, never in CI; the
header of its output names the repository and commit it was made from.
``openapi_document`` turns an extract back into an OpenAPI document of just
those operations, under ``/v1`` as llmgw serves them, for tools that read
OpenAPI (the gateway's Schemathesis test).

The walk is over schema keywords, not over dictionary keys at large: the
names inside ``properties`` are kept whatever they are (a tool has a property
called ``description``), and only keywords that say nothing about structure
are left out.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from typing import Any

import yaml

REPOSITORY = "openai/openai-openapi"

# (path in OpenAI's document, method): what llmgw answers under /v1.
OPERATIONS: tuple[tuple[str, str], ...] = (
    ("/chat/completions", "post"),
    ("/completions", "post"),
    ("/embeddings", "post"),
    ("/responses", "post"),
    ("/responses/{response_id}", "get"),
    ("/responses/{response_id}", "delete"),
    ("/responses/{response_id}/input_items", "get"),
    ("/audio/transcriptions", "post"),
    ("/audio/translations", "post"),
    ("/audio/speech", "post"),
    ("/files", "get"),
    ("/files", "post"),
    ("/files/{file_id}", "get"),
    ("/files/{file_id}", "delete"),
    ("/files/{file_id}/content", "get"),
    ("/batches", "post"),
    ("/batches", "get"),
    ("/batches/{batch_id}", "get"),
    ("/batches/{batch_id}/cancel", "post"),
    ("/models", "get"),
    ("/models/{model}", "get"),
)
# Component schemas wanted beyond those the operations name: the error body every
# failure carries (the document names it only for a few statuses).
EXTRA = ("ErrorResponse",)

# Keywords whose value is a schema, a list of schemas, or a map of names to schemas.
_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "propertyNames",
        "contains", "unevaluatedProperties", "unevaluatedItems")
_MANY = ("anyOf", "oneOf", "allOf", "prefixItems")
_MAP = ("properties", "patternProperties", "$defs")
# Keywords kept as they are: they constrain the shape of a value.
_PLAIN = ("type", "required", "enum", "const", "format", "nullable", "minimum", "maximum",
          "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minLength", "maxLength",
          "pattern", "minItems", "maxItems", "uniqueItems", "minProperties", "maxProperties")


def _ref_name(ref: str) -> str:
    prefix = "#/components/schemas/"
    if not ref.startswith(prefix):
        raise ValueError(f"unexpected reference {ref!r}: only component schemas are followed")
    return ref[len(prefix):]


def _plain_value(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def structure(schema: Any, refs: set[str]) -> Any:
    """``schema`` with only its structural keywords; the component names it refers to go
    into ``refs``."""
    if isinstance(schema, bool):
        return schema
    if not isinstance(schema, dict):
        raise ValueError(f"not a schema: {schema!r}")
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "$ref":
            name = _ref_name(value)
            refs.add(name)
            out["$ref"] = f"#/$defs/{name}"
        elif key in _ONE:
            out[key] = structure(value, refs)
        elif key in _MANY:
            out[key] = [structure(v, refs) for v in value]
        elif key in _MAP:
            out[key] = {name: structure(v, refs) for name, v in value.items()}
        elif key in _PLAIN or (key == "default" and _plain_value(value)):
            out[key] = value
        elif key == "discriminator":
            kept = {k: v for k, v in value.items() if k in ("propertyName", "mapping")}
            if "mapping" in kept:
                kept["mapping"] = {k: f"#/$defs/{_ref_name(v)}"
                                   for k, v in kept["mapping"].items()}
                refs.update(_ref_name(v) for v in value["mapping"].values())
            out[key] = kept
    if out.pop("nullable", False):
        return {"anyOf": [out, {"type": "null"}]}
    return out


def _content(content: dict[str, Any] | None, refs: set[str]) -> dict[str, Any]:
    return {kind: structure(media.get("schema", {}), refs)
            for kind, media in (content or {}).items()}


def _parameter(param: dict[str, Any], refs: set[str]) -> dict[str, Any]:
    out = {"name": param["name"], "in": param["in"],
           "required": bool(param.get("required", False))}
    if "schema" in param:
        out["schema"] = structure(param["schema"], refs)
    for key in ("style", "explode"):
        if key in param:
            out[key] = param[key]
    return out


def _response(response: dict[str, Any], shared: dict[str, Any],
              refs: set[str]) -> dict[str, Any]:
    if "$ref" in response:
        response = shared[response["$ref"].rsplit("/", 1)[-1]]
    out: dict[str, Any] = {"content": _content(response.get("content"), refs)}
    headers = response.get("headers") or {}
    if headers:
        out["headers"] = {name: {"schema": structure(h.get("schema", {}), refs)}
                          for name, h in headers.items()}
    return out


def extract(document: dict[str, Any], commit: str,
            operations: Iterable[tuple[str, str]] = OPERATIONS) -> dict[str, Any]:
    """The extract of ``document`` (OpenAI's OpenAPI document, parsed) at ``commit``."""
    components = document["components"]
    schemas: dict[str, Any] = components["schemas"]
    shared: dict[str, Any] = components.get("responses", {})
    refs: set[str] = set(EXTRA)
    ops: dict[str, Any] = {}
    for path, method in operations:
        op = document["paths"][path][method]
        entry: dict[str, Any] = {
            "operationId": op["operationId"],
            "parameters": [_parameter(p, refs) for p in op.get("parameters", [])],
            "responses": {status: _response(r, shared, refs)
                          for status, r in op["responses"].items()},
        }
        body = op.get("requestBody")
        if body is not None:
            entry["requestBody"] = {"required": bool(body.get("required", False)),
                                    "content": _content(body.get("content"), refs)}
        ops[f"{method.upper()} {path}"] = entry
    defs: dict[str, Any] = {}
    pending = sorted(refs)
    while pending:
        name = pending.pop()
        if name in defs:
            continue
        found: set[str] = set()
        defs[name] = structure(schemas[name], found)
        pending.extend(sorted(found - defs.keys()))
    return {
        "source": {"repository": REPOSITORY, "commit": commit, "path": "openapi.yaml",
                   "license": "MIT", "openapi": document.get("openapi"),
                   "version": document.get("info", {}).get("version")},
        "note": ("Structure only, extracted by llmgw.testing.openai_schemas: no description, "
                 "title, example or extension of the upstream document is kept."),
        "operations": ops,
        "$defs": dict(sorted(defs.items())),
    }


def _as_components(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: (v.replace("#/$defs/", "#/components/schemas/")
                    if k == "$ref" and isinstance(v, str) else _as_components(v))
                for k, v in node.items()}
    if isinstance(node, list):
        return [_as_components(v) for v in node]
    return node


def _media(content: dict[str, Any]) -> dict[str, Any]:
    return {kind: {"schema": _as_components(schema)} for kind, schema in content.items()}


def openapi_document(extract_: dict[str, Any], prefix: str = "/v1") -> dict[str, Any]:
    """An OpenAPI 3.1 document of the extract's operations, their paths under ``prefix``,
    every request authenticated with a bearer key."""
    paths: dict[str, dict[str, Any]] = {}
    for key, op in extract_["operations"].items():
        method, path = key.split(" ", 1)
        responses = {}
        for status, response in op["responses"].items():
            shown: dict[str, Any] = {"description": ""}
            if response["content"]:
                shown["content"] = _media(response["content"])
            if response.get("headers"):
                shown["headers"] = _as_components(response["headers"])
            responses[status] = shown
        entry: dict[str, Any] = {"operationId": op["operationId"],
                                 "parameters": _as_components(op["parameters"]),
                                 "responses": responses}
        if "requestBody" in op:
            entry["requestBody"] = {"required": op["requestBody"]["required"],
                                    "content": _media(op["requestBody"]["content"])}
        paths.setdefault(prefix + path, {})[method.lower()] = entry
    source = extract_["source"]
    return {
        "openapi": "3.1.0",
        "info": {"title": f"{source['repository']} at {source['commit'][:12]}, structure of "
                          "the operations llmgw serves", "version": str(source["version"])},
        "paths": paths,
        "components": {"schemas": _as_components(extract_["$defs"]),
                       "securitySchemes": {"ApiKeyAuth": {"type": "http", "scheme": "bearer"}}},
        "security": [{"ApiKeyAuth": []}],
    }


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        raise SystemExit("usage: python -m llmgw.testing.openai_schemas OPENAPI_YAML COMMIT")
    with open(args[0], encoding="utf-8") as f:
        document = yaml.safe_load(f)
    json.dump(extract(document, args[1]), sys.stdout, indent=1, sort_keys=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
