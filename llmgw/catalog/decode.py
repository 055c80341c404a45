"""One decoder for every place a model is written down.

``decode_yaml`` reads server.yaml and ``ctl model add -f`` files; ``decode_json``
reads API bodies and stored rows. Both go through msgspec with the same
structs, so the rules (unknown fields refused, types checked) are identical,
and both rewrite msgspec's ``$.models[2].gpus`` paths into the file name and
key path a person can find.
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

import msgspec
import yaml

from llmgw.errors import ConfigError, DefinitionError

T = TypeVar("T")
_AT = re.compile(r" - at `\$(?P<path>[^`]*)`$")


def _split(msg: str) -> tuple[str, str]:
    """msgspec's message and the key path it points at (without the ``$.``)."""
    match = _AT.search(msg)
    if not match:
        return msg, ""
    return msg[: match.start()], match.group("path").lstrip(".")


def _error(exc: msgspec.ValidationError | msgspec.DecodeError, source: str,
           err: type[DefinitionError]) -> DefinitionError:
    reason, path = _split(str(exc))
    unknown = re.match(r"Object contains unknown field `([^`]*)`", reason)
    if unknown:
        path = f"{path}.{unknown.group(1)}" if path else unknown.group(1)
        reason = "unknown field; check the spelling against the documented keys"
    where = f"{source}: {path}" if path else source
    return err(f"{where}: {reason}", field=path or None)


def decode_yaml(data: bytes | str, type_: type[T], *, source: str) -> T:
    """Decode YAML text into ``type_``; ConfigError for server.yaml, else DefinitionError."""
    err = ConfigError if type_.__name__ == "ServerConfig" else DefinitionError
    try:
        # safe_load: a catalog is data; no YAML tags may construct objects.
        raw = yaml.safe_load(data)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        pos = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise err(f"{source}: not valid YAML{pos}: {problem}") from None
    if raw is None:
        raw = {}
    return convert(raw, type_, source=source, err=err)


def convert(raw: Any, type_: type[T], *, source: str,
            err: type[DefinitionError] = DefinitionError) -> T:
    try:
        return msgspec.convert(raw, type_, strict=True)
    except msgspec.ValidationError as exc:
        raise _error(exc, source, err) from None


_decoders: dict[type[Any], msgspec.json.Decoder[Any]] = {}


def decode_json(data: bytes | str, type_: type[T], *, source: str = "request body") -> T:
    decoder = _decoders.get(type_)
    if decoder is None:
        decoder = _decoders[type_] = msgspec.json.Decoder(type_)
    try:
        return decoder.decode(data)  # type: ignore[no-any-return]
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        if isinstance(exc, msgspec.ValidationError):
            raise _error(exc, source, DefinitionError) from None
        raise DefinitionError(f"{source}: not valid JSON: {exc}") from None


def decode_model_file(data: bytes | str, *, source: str) -> Any:
    """A ``ctl model add -f`` file: one model entry, the shape of a ``models:`` item."""
    from llmgw.catalog.model import Model

    return decode_yaml(data, Model, source=source)
