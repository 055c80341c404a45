"""What an engine's server needs said differently from OpenAI's wording: pure rewrites.

The gateway passes request bodies through unchanged, with one kind of
exception: a field that an engine spells its own way *and* refuses in a way
that would hurt the replica. llama-cpp-python 0.3's server accepts
``response_format`` only as ``{"type": "json_object", "schema": …}``
(``llama_types.ChatCompletionRequestResponseFormat``: type ``text`` or
``json_object``) and answers OpenAI's ``{"type": "json_schema",
"json_schema": {"schema": …}}`` with HTTP 500 — which the gateway, rightly
for a 500, counts as the replica failing and ejects it. The C++
llama-server that Nomad runs takes both forms (``tools/server/utils.hpp``,
``oaicompat_chat_params_parse``: ``json_object`` with a ``schema``, or
``json_schema``), so every llama.cpp model is sent the one both understand.
The schema is enforced either way (as a grammar), so the client gets what
it asked for.

A rewrite touches only the top-level fields it must (``dict[str, Raw]``):
every other value reaches the engine byte for byte.
"""

from __future__ import annotations

from typing import Any

import msgspec

from llmgw.catalog.engines import Engine, speaks

_fields = msgspec.json.Decoder(dict[str, msgspec.Raw])
_encode = msgspec.json.Encoder().encode


def needs_rewrite(engine: Engine | None, path: str, body: bytes) -> bool:
    """Cheap test, run on every attempt: could ``body`` need a rewrite for a replica speaking
    ``engine`` (``Dialect.schema_as_json_object``: llama.cpp, scheduled or external)?"""
    return speaks(engine).schema_as_json_object and b'"json_schema"' in body and \
        path.startswith("/v1/chat/completions")


def for_llama_cpp(body: bytes, served: str) -> bytes:
    """``body`` with ``model`` set to ``served`` and a JSON-schema response_format in the
    shape llama.cpp's servers accept."""
    fields = _fields.decode(body)
    fields["model"] = msgspec.Raw(_encode(served))
    raw = fields.get("response_format")
    if raw is not None:
        fmt: Any = msgspec.json.decode(raw)
        if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
            spec = fmt.get("json_schema") or {}
            schema = spec.get("schema") if isinstance(spec, dict) else None
            fields["response_format"] = msgspec.Raw(_encode(
                {"type": "json_object", "schema": schema if schema is not None else {}}))
    return _encode(fields)
