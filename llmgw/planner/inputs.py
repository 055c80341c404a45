"""Where a model's config.json and parameter count come from: a local directory or the Hub.

This is the planner's only module that does I/O. A local directory must hold
``config.json``; its parameter count is read from the safetensors headers
when the shards are there (exact, by dtype), else from the index's
``total_size`` divided by the checkpoint's dtype width, else it must be
given (``--params``). On the Hub, config.json comes through
``hf_hub_download`` and the count from the repository's safetensors metadata
(``HfApi.model_info(expand=["safetensors"])``), the same total the Hub shows
as "Model size".

The Hub is the one adapter the mirror and the source check use too
(``llmgw.weights.hub``); its errors become the planner's: a gated or
unauthorised repository a 403, a missing one a 404, an unreachable Hub a 503.

``read_facts`` reads what a catalog entry's source says about its weights,
for the memory check made when a model is added: a GGUF file's header (on
this machine, on the Hub or on the mirror, a remote one a range at a time
and never more than ``HEADER_LIMIT``), or a checkpoint's config.json (and,
on the Hub or on this machine, its parameter count). It refuses with
``FactsUnavailableError`` and a sentence whenever it cannot: that check is
advice, and a source it cannot read is the source check's business, not a
reason to refuse a model.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import msgspec

from llmgw.catalog.source import (
    HF_SCHEME,
    HfSource,
    PathSource,
    PkgSource,
    Source,
    UrlSource,
    parse_source,
)
from llmgw.errors import (
    DefinitionError,
    ForbiddenError,
    LlmgwError,
    NotFoundError,
    UnavailableError,
)
from llmgw.planner.gguf import config_from_gguf, file_type_name, quantization_of
from llmgw.planner.plan import ParameterCount
from llmgw.planner.reserve import ModelFacts
from llmgw.weights.fetch import listed_files, read_range
from llmgw.weights.gguf import (
    HEADER_LIMIT,
    GgufInfo,
    HeaderTooLargeError,
    NotGgufError,
    read_gguf,
    read_gguf_head,
)
from llmgw.weights.hub import HfHub, Hub, HubError
from llmgw.weights.layout import mirror_path
from llmgw.weights.local import SourceError, resolve_pkg

_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1}
_MAX_CONFIG = 4 * 1024 * 1024  # a config.json larger than this is not one
_MAX_HEADER = 100 * 1024 * 1024  # a safetensors header larger than this is not one


class ModelInput(msgspec.Struct, frozen=True, kw_only=True):
    """A model's config.json (decoded) and parameter count, and the name it was asked by."""

    name: str
    config: dict[str, Any]
    parameters: ParameterCount | None
    repository: str | None = None  # the Hub repository id it was read from; None for a dir


_HUB_ERRORS: dict[str, type[LlmgwError]] = {
    "repository": NotFoundError, "revision": NotFoundError, "gated": ForbiddenError,
    "unauthorised": ForbiddenError, "unreachable": UnavailableError,
    "failing": UnavailableError,
}


def _hub_error(exc: HubError, repo: str) -> LlmgwError:
    if exc.kind == "file":
        return DefinitionError(
            f"{repo} has no config.json; the planner needs a Hugging Face checkpoint "
            "(a GGUF-only repository has none: plan the repository it was converted from)")
    return _HUB_ERRORS[exc.kind](exc.reason)


def hub_source(text: str) -> HfSource:
    """``org/repo[@rev]`` or ``hf://org/repo[@rev]`` as the repository it names."""
    stripped = text.strip()  # as the catalog's parser does
    try:
        src = parse_source(stripped if stripped.startswith(HF_SCHEME)
                           else f"{HF_SCHEME}{stripped}")
    except ValueError as exc:
        raise DefinitionError(
            f"{text!r} is neither a directory nor a Hub repository id ({exc}); give the path "
            "of a checkpoint directory or e.g. Qwen/Qwen2.5-14B-Instruct",
            field="source") from None
    if not isinstance(src, HfSource) or src.filename is not None:
        raise DefinitionError(
            f"{text!r} is neither a directory nor a Hub repository id (org/name); give the "
            "path of a checkpoint directory or e.g. Qwen/Qwen2.5-14B-Instruct", field="source")
    return src


def _decode_config(data: bytes, where: str) -> dict[str, Any]:
    try:
        raw = json.loads(data)
    except ValueError as exc:
        raise DefinitionError(f"{where}: not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise DefinitionError(f"{where}: expected a JSON object")
    return raw


def safetensors_counts(path: Path) -> dict[str, int]:
    """Elements per dtype in one .safetensors file, from its header alone."""
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise DefinitionError(f"{path}: too short to be a safetensors file")
        (size,) = struct.unpack("<Q", head)
        if size > _MAX_HEADER:
            raise DefinitionError(f"{path}: header of {size} bytes; not a safetensors file")
        try:
            header = json.loads(f.read(size))
        except ValueError:
            raise DefinitionError(f"{path}: unreadable safetensors header") from None
    counts: dict[str, int] = {}
    for name, entry in header.items():
        if name == "__metadata__" or not isinstance(entry, dict):
            continue
        n = 1
        for dim in entry.get("shape", []):
            n *= int(dim)
        dtype = str(entry.get("dtype", "?"))
        counts[dtype] = counts.get(dtype, 0) + n
    return counts


def local_parameters(directory: Path, config: dict[str, Any]) -> ParameterCount | None:
    """The count from the shards' headers, or the index's byte total; None if neither is there."""
    shards = sorted(directory.glob("*.safetensors"))
    if shards:
        counts: dict[str, int] = {}
        for shard in shards:
            for dtype, n in safetensors_counts(shard).items():
                counts[dtype] = counts.get(dtype, 0) + n
        return ParameterCount(total=sum(counts.values()), source="safetensors", by_dtype=counts)
    index = directory / "model.safetensors.index.json"
    if not index.is_file():
        return None
    meta = _decode_config(index.read_bytes(), str(index)).get("metadata") or {}
    total_size = meta.get("total_size")
    if not isinstance(total_size, int) or total_size <= 0:
        raise DefinitionError(f"{index}: metadata.total_size is missing; pass --params N",
                              field="metadata.total_size")
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    width = _DTYPE_BYTES.get(dtype)
    if width is None:
        raise DefinitionError(
            f"{index}: cannot turn {total_size} bytes into a parameter count for dtype "
            f"{dtype!r}; pass --params N", field="torch_dtype")
    return ParameterCount(total=total_size // width, source="index")


def resolve_model(source: str, *, params: int | None = None, revision: str | None = None,
                  hub: Hub | None = None) -> ModelInput:
    """Read ``source`` (a directory, ``org/repo[@rev]`` or ``hf://org/repo``) into a ModelInput."""
    given = ParameterCount(total=params, source="--params") if params is not None else None
    if params is not None and params <= 0:
        raise DefinitionError(f"--params must be positive, got {params}", field="params")
    path = Path(source).expanduser()
    if path.is_dir():
        cfg_path = path / "config.json"
        if not cfg_path.is_file():
            raise DefinitionError(
                f"{path}: no config.json; the planner reads the model's own config.json, so "
                "give a Hugging Face checkpoint directory (config.json and its safetensors)",
                field="config.json")
        config = _decode_config(cfg_path.read_bytes(), str(cfg_path))
        count = given or local_parameters(path, config)
        if count is None:
            raise DefinitionError(
                f"{path}: no parameter count: neither model.safetensors.index.json nor any "
                "*.safetensors file is there; pass --params N", field="params")
        return ModelInput(name=str(path), config=config, parameters=count)
    if source.startswith((".", "/", "~")):
        raise DefinitionError(
            f"{source!r} is neither a directory nor a Hub repository id (org/name): no "
            "directory is there; give the path of a checkpoint directory or e.g. "
            "Qwen/Qwen2.5-14B-Instruct", field="source")
    src = hub_source(source)
    repo, rev = src.repo_id, src.revision or revision
    client = hub or HfHub()
    try:
        # The repository's metadata first: it answers at once when the repo is
        # missing or the Hub unreachable, where the file download would first
        # retry for half a minute.
        info = client.repo_info(repo, rev, parameters=True)
        config = _decode_config(client.read(repo, "config.json", rev), f"{repo}: config.json")
    except HubError as exc:
        raise _hub_error(exc, repo) from None
    hub_count = (ParameterCount(total=sum(info.parameters.values()), source="hub",
                                by_dtype=info.parameters) if info.parameters else None)
    count = given or hub_count
    return ModelInput(name=repo if rev is None else f"{repo}@{rev}", config=config,
                      parameters=count, repository=repo)


class FactsUnavailableError(Exception):
    """A source's weights cannot be read for planning; the message says why."""


def _gguf_facts(info: GgufInfo | None, where: str) -> ModelFacts:
    if info is None:
        raise FactsUnavailableError(f"{where}: the GGUF header could not be walked (a damaged "
                                    "or version-1 file)")
    return ModelFacts(where=where, config=config_from_gguf(info, where=where), gguf=True,
                      file_type=file_type_name(info), quantization=quantization_of(info))


def _local_facts(path: Path, where: str) -> ModelFacts:
    if path.is_dir():
        cfg_path = path / "config.json"
        if cfg_path.is_file():
            config = _decode_config(cfg_path.read_bytes(), str(cfg_path))
            return ModelFacts(where=where, config=config,
                              parameters=local_parameters(path, config))
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) != 1:
            raise FactsUnavailableError(f"{where}: a directory with neither config.json nor "
                                        "exactly one .gguf file")
        path = ggufs[0]
    return _gguf_facts(read_gguf(path), where)


def _is_gguf(name: str) -> bool:
    return name.lower().endswith(".gguf")


def _remote_gguf(read: Callable[[int, int], bytes], where: str, limit: int) -> ModelFacts:
    return _gguf_facts(read_gguf_head(read, where, limit=limit), where)


def _mirror_directory(url: str, where: str, timeout: float, limit: int) -> ModelFacts:
    """A checkpoint's config.json, or the one GGUF file, in a mirror directory."""
    names = listed_files(url, timeout)
    if "config.json" in names:
        data = read_range(url + "config.json", 0, _MAX_CONFIG, timeout)
        return ModelFacts(where=where, config=_decode_config(data, f"{where}config.json"))
    ggufs = [n for n in names if _is_gguf(n)]
    if len(ggufs) != 1:
        raise FactsUnavailableError(f"{where}: a mirror directory with neither config.json "
                                    "nor exactly one .gguf file")
    file_url = url + quote(ggufs[0])
    return _remote_gguf(lambda start, n: read_range(file_url, start, n, timeout), where, limit)


def read_facts(source: Source, *, hub: Hub | None = None, local: bool = True,
               mirror: str | None = None, timeout: float = 10.0,
               limit: int = HEADER_LIMIT) -> ModelFacts:
    """What ``source`` says about its weights (blocking I/O; FactsUnavailableError if nothing).

    ``local``: a path or an installed package names a file on this machine (the
    embedded mode; on Nomad it would name a node's). ``mirror``: a Hub source is
    read where the nodes read it, at its place on the mirror
    (``llmgw.weights.layout.mirror_path``), not on the Hub. ``timeout`` bounds
    each request, ``limit`` the bytes of a remote GGUF header.
    """
    where = source.shown
    if isinstance(source, HfSource) and mirror:
        at = f"{mirror.rstrip('/')}/{mirror_path(source)}"
        return read_facts(parse_source(at), local=local, timeout=timeout, limit=limit)
    try:
        match source:
            case HfSource(filename=None):
                found = resolve_model(source.text, hub=hub or HfHub(timeout=timeout))
                return ModelFacts(where=where, config=found.config,
                                  parameters=found.parameters)
            case HfSource(repo_id=repo, revision=rev, filename=str(name)) if _is_gguf(name):
                client = hub or HfHub(timeout=timeout)
                return _remote_gguf(
                    lambda start, n: client.read_range(repo, name, rev, start, n), where, limit)
            case UrlSource(url=url) if source.is_directory:
                return _mirror_directory(url, where, timeout, limit)
            case UrlSource(url=url) if _is_gguf(url.split("?")[0]):
                return _remote_gguf(lambda start, n: read_range(url, start, n, timeout), where,
                                    limit)
            case PkgSource(distribution=dist) if local:
                return _local_facts(resolve_pkg(dist), where)
            case PathSource(path=text) if local:
                return _local_facts(Path(text).expanduser(), where)
    except (LlmgwError, HubError, SourceError, NotGgufError, HeaderTooLargeError,
            OSError) as exc:
        raise FactsUnavailableError(str(exc)) from None
    raise FactsUnavailableError(
        f"{where}: the planner reads a GGUF file, a Hugging Face checkpoint (hf://ORG/REPO) "
        "or, in the embedded mode, a local file or package; this source is none of those")
