"""Sizes, durations and sources in Litestar: encoded as written, decoded by our hooks.

Litestar encodes responses and decodes request bodies with msgspec, but with
its own hooks; these tables hand it ours (``llmgw.catalog.decode``), so a body
is parsed exactly as a YAML file would be and a response shows each value the
way its author wrote it. The schema plugin documents them as they travel: a
size or a duration is a string (``24GiB``, ``15m``, in the pattern the
decoder reads) or a number (bytes, seconds); a source is a non-empty string.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from litestar import Response
from litestar.openapi.spec import OpenAPIType, Schema
from litestar.plugins import OpenAPISchemaPlugin
from litestar.typing import FieldDefinition

from llmgw.catalog.decode import dec_hook, enc_hook
from llmgw.catalog.source import Source
from llmgw.catalog.units import Duration, Size

TYPED = (Size, Duration, Source)
# How a size and a duration may be written as text (``Size.parse``, ``Duration.parse``).
SIZE_PATTERN = r"^\s*[0-9]+(\.[0-9]+)?\s*([bB]|[kKmMgGtT]([iI]?[bB])?)?\s*$"
DURATION_PATTERN = r"^\s*([0-9]+(\.[0-9]+)?(ms|s|m|h))+\s*$"
T = TypeVar("T")

TYPE_ENCODERS: dict[Any, Callable[[Any], Any]] = dict.fromkeys(TYPED, enc_hook)


def _is_typed(target: Any) -> bool:
    return isinstance(target, type) and issubclass(target, TYPED)


TYPE_DECODERS: list[tuple[Callable[[Any], bool], Callable[[Any, Any], Any]]] = [
    (_is_typed, dec_hook),
]


class TypedValuesSchema(OpenAPISchemaPlugin):
    """How a Size, a Duration and a Source appear in the OpenAPI document."""

    def is_plugin_supported_field(self, field_definition: FieldDefinition) -> bool:
        return _is_typed(field_definition.annotation)

    def to_openapi_schema(self, field_definition: FieldDefinition,
                          schema_creator: Any) -> Schema:
        if issubclass(field_definition.annotation, Source):
            return Schema(type=OpenAPIType.STRING, min_length=1)
        if issubclass(field_definition.annotation, Size):
            return Schema(one_of=[Schema(type=OpenAPIType.STRING, pattern=SIZE_PATTERN),
                                  Schema(type=OpenAPIType.INTEGER, minimum=0)])
        return Schema(one_of=[Schema(type=OpenAPIType.STRING, pattern=DURATION_PATTERN),
                              Schema(type=OpenAPIType.NUMBER, minimum=0)])


class TypedResponse(Response[T]):
    """A response that encodes sizes, durations and sources itself.

    Litestar's own hook rebuilds its table of encoders for every value it is
    handed, which made a list of 2,000 models three times slower to encode;
    the typed values are answered here first and everything else is left to
    Litestar's hook.
    """

    def render(self, content: Any, media_type: str,
               enc_hook: Callable[[Any], Any] = enc_hook) -> bytes:
        fallback = enc_hook

        def hook(value: Any) -> Any:
            if isinstance(value, TYPED):
                return value.text
            return fallback(value)

        return super().render(content, media_type, hook)
