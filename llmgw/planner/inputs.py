"""Where a model's config.json and parameter count come from: a local directory or the Hub.

This is the planner's only module that does I/O. A local directory must hold
``config.json``; its parameter count is read from the safetensors headers
when the shards are there (exact, by dtype), else from the index's
``total_size`` divided by the checkpoint's dtype width, else it must be
given (``--params``). On the Hub, config.json comes through
``hf_hub_download`` and the count from the repository's safetensors metadata
(``HfApi.model_info(expand=["safetensors"])``), the same total the Hub shows
as "Model size".

The Hub sits behind ``HubClient`` so that tests, and users planning against a
mirror, can substitute their own; ``HfHub`` is the real adapter and honours
``HF_ENDPOINT`` and ``HF_TOKEN`` at call time.
"""

from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path
from typing import Any, Protocol

import msgspec

from llmgw.errors import (
    DefinitionError,
    ForbiddenError,
    LlmgwError,
    NotFoundError,
    UnavailableError,
)
from llmgw.planner.plan import ParameterCount

_REPO_RE = re.compile(r"^(?:hf://)?(?P<repo>[\w.-]+/[\w.-]+)(?:@(?P<rev>[\w./-]+))?$")
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1}
_MAX_HEADER = 100 * 1024 * 1024  # a safetensors header larger than this is not one


class ModelInput(msgspec.Struct, frozen=True, kw_only=True):
    """A model's config.json (decoded) and parameter count, and the name it was asked by."""

    name: str
    config: dict[str, Any]
    parameters: ParameterCount | None


class HubClient(Protocol):
    def config(self, repo: str, revision: str | None) -> bytes:
        """The repository's config.json; llmgw errors for missing, gated or unreachable."""

    def parameters(self, repo: str, revision: str | None) -> ParameterCount | None:
        """The safetensors parameter total, or None when the Hub has none for the repo."""


def _hub_error(exc: Exception, repo: str) -> LlmgwError:
    from huggingface_hub import errors as hf

    if isinstance(exc, hf.GatedRepoError):
        return ForbiddenError(
            f"{repo} is gated on the Hub: accept its license on the model page with your "
            "account, then set HF_TOKEN to a token of that account")
    if isinstance(exc, hf.RevisionNotFoundError):
        return NotFoundError(f"{repo}: that revision does not exist on the Hub; check @REVISION")
    if isinstance(exc, hf.RepositoryNotFoundError):
        return NotFoundError(
            f"{repo} was not found on the Hub; check the spelling, or set HF_TOKEN if it is "
            "private")
    if isinstance(exc, hf.RemoteEntryNotFoundError):
        return DefinitionError(
            f"{repo} has no config.json; the planner needs a Hugging Face checkpoint "
            "(a GGUF-only repository has none: plan the repository it was converted from)")
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    return UnavailableError(f"cannot read {repo} from the Hub at {endpoint}: {exc}; check "
                            "the network, HF_ENDPOINT and HF_TOKEN")


class HfHub:
    """The Hugging Face Hub through huggingface-hub (blocking; call off the event loop)."""

    def __init__(self, *, endpoint: str | None = None, token: str | None = None,
                 cache_dir: str | None = None) -> None:
        self._endpoint = endpoint
        self._token = token
        self._cache_dir = cache_dir

    def _settings(self) -> tuple[str | None, str | None]:
        return (self._endpoint or os.environ.get("HF_ENDPOINT"),
                self._token or os.environ.get("HF_TOKEN"))

    def config(self, repo: str, revision: str | None) -> bytes:
        from huggingface_hub import hf_hub_download

        endpoint, token = self._settings()
        try:
            path = hf_hub_download(repo, "config.json", revision=revision, endpoint=endpoint,
                                   token=token, cache_dir=self._cache_dir)
        except Exception as exc:  # every failure becomes an llmgw error saying what to check
            raise _hub_error(exc, repo) from None
        return Path(path).read_bytes()

    def parameters(self, repo: str, revision: str | None) -> ParameterCount | None:
        from huggingface_hub import HfApi

        endpoint, token = self._settings()
        try:
            info = HfApi(endpoint=endpoint, token=token).model_info(
                repo, revision=revision, expand=["safetensors"])
        except Exception as exc:
            raise _hub_error(exc, repo) from None
        st = info.safetensors
        if st is None or not st.total:
            return None
        return ParameterCount(total=int(st.total), source="hub",
                              by_dtype={k: int(v) for k, v in st.parameters.items()})


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
                  hub: HubClient | None = None) -> ModelInput:
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
    match = _REPO_RE.match(source)
    if match is None or source.startswith((".", "/", "~")):
        raise DefinitionError(
            f"{source!r} is neither a directory nor a Hub repository id (org/name); give the "
            "path of a checkpoint directory or e.g. Qwen/Qwen2.5-14B-Instruct", field="source")
    repo, rev = match["repo"], match["rev"] or revision
    client: HubClient = hub or HfHub()
    # The repository's metadata first: it answers at once when the repo is
    # missing, gated or the Hub unreachable, where the file download would
    # first retry for half a minute.
    hub_count = client.parameters(repo, rev)
    config = _decode_config(client.config(repo, rev), f"{repo}: config.json")
    count = given or hub_count
    return ModelInput(name=repo if rev is None else f"{repo}@{rev}", config=config,
                      parameters=count)
