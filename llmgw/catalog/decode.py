"""One decoder for every place a model is written down, and its encoder.

``decode_yaml`` reads server.yaml and ``ctl model add -f`` files; ``decode_json``
reads API bodies and stored rows; ``decode_value`` reads one value given on a
command line. All go through msgspec with the same structs and the same hooks,
so the rules (unknown fields refused, types checked, sizes, durations and
sources parsed) are identical, and all rewrite msgspec's ``$.models[2].gpus``
paths into the file name and key path a person can find.

The hooks are where text becomes a typed value — ``Size``, ``Duration``,
``Source`` — and the only place their parsers are called. ``encode`` and
``to_builtins`` turn those values back into the text they were written as;
every encoder of catalog or configuration structs goes through them.

A pattern a field must match reads as its sentence in these errors
(``llmgw.catalog.rules.explain``), not as msgspec's regex.
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

import msgspec
import yaml

from llmgw.catalog.rules import explain
from llmgw.catalog.source import Source, parse_source
from llmgw.catalog.units import Duration, Size
from llmgw.errors import ConfigError, DefinitionError
from llmgw.nesting import check_json_depth, safe_load

T = TypeVar("T")

_PARSERS: dict[type[Any], Any] = {Size: Size.parse, Duration: Duration.parse,
                                  Source: parse_source}


def dec_hook(type_: type[Any], value: Any) -> Any:
    """msgspec's decode hook: text (or a number) into a typed value; ValueError names
    what is wrong, and msgspec adds the key path."""
    parse = _PARSERS.get(type_)
    if parse is None:
        raise NotImplementedError(f"no decoder for {type_!r}")
    return parse(value)


def enc_hook(value: Any) -> Any:
    """msgspec's encode hook: a typed value back into the text it was written as."""
    if isinstance(value, Size | Duration | Source):
        return value.text
    raise NotImplementedError(f"cannot encode {type(value).__name__}")


_encoder = msgspec.json.Encoder(enc_hook=enc_hook)
_sorted_encoder = msgspec.json.Encoder(enc_hook=enc_hook, order="sorted")


def encode(value: Any, *, sort_keys: bool = False) -> bytes:
    """JSON for catalog and configuration structs, sizes and durations as written."""
    return (_sorted_encoder if sort_keys else _encoder).encode(value)


def to_builtins(value: Any, *, sort_keys: bool = False) -> Any:
    """Plain dicts, lists and scalars, with sizes, durations and sources as written."""
    return msgspec.to_builtins(value, enc_hook=enc_hook,
                               order="sorted" if sort_keys else None)
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
    reason = explain(reason)
    where = f"{source}: {path}" if path else source
    return err(f"{where}: {reason}", field=path or None)


def decode_yaml(data: bytes | str, type_: type[T], *, source: str) -> T:
    """Decode YAML text into ``type_``; ConfigError for server.yaml, else DefinitionError."""
    err = ConfigError if type_.__name__ == "ServerConfig" else DefinitionError
    try:
        # safe_load: a catalog is data; no YAML tags may construct objects,
        # and its nesting is bounded (llmgw.nesting).
        raw = safe_load(data)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        pos = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise err(f"{source}: not valid YAML{pos}: {problem}") from None
    if raw is None:
        raw = {}
    return convert(raw, type_, source=source, err=err)


def convert(raw: Any, type_: type[T], *, source: str = "value",
            err: type[DefinitionError] = DefinitionError) -> T:
    """Plain data (decoded YAML, a dict) into ``type_``, as strictly as a file is read."""
    try:
        return msgspec.convert(raw, type_, strict=True, dec_hook=dec_hook)
    except msgspec.ValidationError as exc:
        raise _error(exc, source, err) from None


_decoders: dict[type[Any], msgspec.json.Decoder[Any]] = {}


def _whole(value: Any) -> Any:
    """``value`` with every float that is a whole number made an int."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return int(value)
    if isinstance(value, dict):
        return {k: _whole(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_whole(v) for v in value]
    return value


def decode_json(data: bytes | str, type_: type[T], *, source: str = "request body",
                integral_floats: bool = False) -> T:
    """JSON into ``type_``, as strictly as a file is read; ``integral_floats``: a whole
    number written as a float (``2.0``) is read as the integer it is."""
    decoder = _decoders.get(type_)
    if decoder is None:
        decoder = _decoders[type_] = msgspec.json.Decoder(type_, dec_hook=dec_hook)
    check_json_depth(data, source=source)
    if integral_floats:
        try:
            raw = msgspec.json.decode(data)
        except msgspec.DecodeError as exc:
            raise DefinitionError(f"{source}: not valid JSON: {exc}") from None
        return convert(_whole(raw), type_, source=source)
    try:
        return decoder.decode(data)  # type: ignore[no-any-return]
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        if isinstance(exc, msgspec.ValidationError):
            raise _error(exc, source, DefinitionError) from None
        raise DefinitionError(f"{source}: not valid JSON: {exc}") from None


def decode_value(value: Any, type_: type[T], *, source: str) -> T:
    """One value given on its own (a command-line option, one field), decoded like a field
    of a file; errors name ``source`` as the field."""
    try:
        return convert(value, type_, source=source)
    except DefinitionError as exc:
        if exc.field is None:
            raise DefinitionError(exc.message, field=source) from None
        raise


def decode_model_file(data: bytes | str, *, source: str) -> Any:
    """A ``ctl model add -f`` file: one model entry, the shape of a ``models:`` item."""
    from llmgw.catalog.model import Model

    return decode_yaml(data, Model, source=source)
