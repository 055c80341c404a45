"""The Hugging Face Hub: one Protocol, one adapter, errors an operator can act on.

The source check, ``llmgw mirror add`` and the planner all read from the Hub;
they do it through ``Hub`` — repository facts, one file's size, one file's
bytes or the head of one, a download — so each asks for what it needs and none knows which HTTP
client huggingface-hub uses this year. ``HfHub`` is the adapter over
huggingface-hub; tests and users point it at ``llmgw.testing.fake_hub`` (or any
mirror of the Hub's API) through its endpoint.

Every failure leaves the adapter as a ``HubError`` with a ``kind`` and a
sentence: not found (check the spelling), gated or unauthorised (a token, or
access to request), unreachable (the network, a proxy, ``HF_ENDPOINT``). The
Hub answers 401 both for a private repository and for one that does not
exist, so that message names both possibilities rather than guessing. Each
caller turns the kind into its own error class (a definition error at add
time, a 403 from the planner); the sentence is the same everywhere.

huggingface-hub is blocking; callers in the server run these methods in a
thread. The endpoint and token are read from ``HF_ENDPOINT`` and ``HF_TOKEN``
at call time unless given, not at import time as huggingface-hub itself
does, so a process (or a test) that sets them later is honoured.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal, Protocol

import msgspec

DEFAULT_ENDPOINT = "https://huggingface.co"

HubErrorKind = Literal["repository", "revision", "file", "gated", "unauthorised",
                       "unreachable", "failing"]


class HubError(Exception):
    """The Hub could not answer; ``kind`` says why and ``reason`` says it to a person."""

    def __init__(self, kind: HubErrorKind, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


class RepoFile(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    size: int | None = None
    lfs_sha256: str | None = None   # the sum the Hub records for an LFS file


class RepoInfo(msgspec.Struct, frozen=True, kw_only=True):
    repo_id: str
    sha: str | None                       # the commit the revision resolved to
    files: list[RepoFile] = []
    parameters: dict[str, int] | None = None  # safetensors elements by dtype, when asked


class Hub(Protocol):
    """What llmgw reads from the Hub. Blocking; every failure is a HubError."""

    @property
    def endpoint(self) -> str: ...

    def repo_info(self, repo_id: str, revision: str | None, *, files: bool = False,
                  parameters: bool = False) -> RepoInfo:
        """The repository at ``revision``: its commit, its files (with sizes and LFS
        sums when ``files``), its safetensors parameter counts when ``parameters``."""

    def file_size(self, repo_id: str, filename: str, revision: str | None) -> int | None:
        """Reach one file as a download would (where a gated repository refuses)."""

    def read(self, repo_id: str, filename: str, revision: str | None) -> bytes:
        """One small file's bytes (a config.json)."""

    def read_range(self, repo_id: str, filename: str, revision: str | None, start: int,
                   length: int) -> bytes:
        """Up to ``length`` bytes of a file from ``start`` (fewer only at its end): the
        head of a GGUF file, without downloading its gigabytes of weights."""

    def download(self, repo_id: str, filename: str, revision: str | None,
                 directory: Path) -> Path:
        """``filename`` into ``directory`` (its path inside the repository kept)."""


def endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", DEFAULT_ENDPOINT).rstrip("/")


def _transport_errors() -> tuple[type[BaseException], ...]:
    """The HTTP client errors huggingface-hub lets through for network trouble.

    huggingface-hub has moved between HTTP clients (requests, httpx, httpx2);
    whichever of them is installed contributes its transport error class.
    """
    found: list[type[BaseException]] = [OSError, TimeoutError]
    for module, attr in (("httpx2", "TransportError"), ("httpx", "TransportError"),
                         ("requests", "ConnectionError"), ("requests", "Timeout")):
        try:
            mod = __import__(module)
        except ImportError:
            continue
        cls = getattr(mod, attr, None)
        if isinstance(cls, type) and issubclass(cls, BaseException):
            found.append(cls)
    return tuple(found)


TRANSPORT_ERRORS = _transport_errors()


def hub_error(kind: HubErrorKind, repo: str, revision: str | None, filename: str | None,
              where: str, *, status: int | None = None, detail: str = "") -> HubError:
    """The HubError of ``kind``, said the way an operator can act on it."""
    rev = revision or "main"
    reasons: dict[HubErrorKind, str] = {
        "gated": (f"repository {repo} is gated and this server may not download it: request "
                  f"access on {where}/{repo} for the account whose token the server uses "
                  "(HF_TOKEN), then try again"),
        "repository": (f"repository {repo} was not found on {where}, or it is private and the "
                       "server's token (HF_TOKEN) cannot see it; check the spelling of "
                       "ORG/REPO"),
        "revision": (f"revision {rev!r} was not found in {repo}; check the branch, tag or "
                     "commit"),
        "file": (f"file {filename!r} was not found in {repo} at revision {rev!r}; check the "
                 "file name against the repository's files"),
        "unauthorised": (f"{where} refused access to {repo} (HTTP {status}): unauthorised; "
                         "give the server a token with read access (HF_TOKEN)"),
        "failing": (f"{where} answered HTTP {status} for {repo}; the Hub is unreachable or "
                    "failing"),
        "unreachable": (f"cannot reach the Hugging Face Hub at {where}: {detail}; check the "
                        "network, a proxy, or HF_ENDPOINT"),
    }
    return HubError(kind, reasons[kind])


def translate(exc: BaseException, repo: str, revision: str | None, filename: str | None,
              where: str) -> HubError | None:
    """``exc`` from huggingface-hub as a HubError; None if it is not a Hub or network error
    (a bug, which the caller lets propagate)."""
    from huggingface_hub import errors as hf

    kind: HubErrorKind
    status = None
    if isinstance(exc, hf.GatedRepoError):
        kind = "gated"
    elif isinstance(exc, hf.RepositoryNotFoundError):
        kind = "repository"
    elif isinstance(exc, hf.RevisionNotFoundError):
        kind = "revision"
    elif isinstance(exc, hf.EntryNotFoundError):
        kind = "file"
    elif isinstance(exc, hf.HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else None
        kind = "unauthorised" if status in (401, 403) else "failing"
    elif isinstance(exc, TRANSPORT_ERRORS):
        kind = "unreachable"
    else:
        return None
    return hub_error(kind, repo, revision, filename, where, status=status,
                     detail=str(exc) or type(exc).__name__)


# The Hub's X-Error-Code header, which huggingface-hub turns into its exception classes.
_ERROR_CODES: dict[str, HubErrorKind] = {
    "GatedRepo": "gated", "RepoNotFound": "repository", "RevisionNotFound": "revision",
    "EntryNotFound": "file",
}


class HfHub:
    """``Hub`` through huggingface-hub."""

    def __init__(self, *, endpoint: str | None = None, token: str | None = None,
                 timeout: float = 10.0, cache_dir: str | None = None) -> None:
        self._endpoint = endpoint
        self._token = token
        self._timeout = timeout
        self._cache_dir = cache_dir

    @property
    def endpoint(self) -> str:
        return (self._endpoint or endpoint()).rstrip("/")

    def _token_now(self) -> str | None:
        return self._token or os.environ.get("HF_TOKEN") or None

    def _fail(self, exc: BaseException, repo: str, revision: str | None,
              filename: str | None = None) -> HubError:
        found = translate(exc, repo, revision, filename, self.endpoint)
        if found is None:
            raise exc
        return found

    def repo_info(self, repo_id: str, revision: str | None, *, files: bool = False,
                  parameters: bool = False) -> RepoInfo:
        from huggingface_hub import HfApi

        api = HfApi(endpoint=self.endpoint, token=self._token_now())
        try:
            if parameters:
                info = api.model_info(repo_id, revision=revision, timeout=self._timeout,
                                      expand=["sha", "siblings", "safetensors"])
            else:
                info = api.model_info(repo_id, revision=revision, timeout=self._timeout,
                                      files_metadata=files)
        except Exception as exc:  # every failure becomes a HubError saying what to check
            raise self._fail(exc, repo_id, revision) from None
        listed = [RepoFile(path=s.rfilename, size=s.size,
                           lfs_sha256=s.lfs.sha256 if s.lfs else None)
                  for s in info.siblings or []]
        counts = None
        st = getattr(info, "safetensors", None)
        if parameters and st is not None and st.total:
            counts = {k: int(v) for k, v in st.parameters.items()}
        return RepoInfo(repo_id=repo_id, sha=info.sha, files=listed, parameters=counts)

    def file_size(self, repo_id: str, filename: str, revision: str | None) -> int | None:
        from huggingface_hub import get_hf_file_metadata, hf_hub_url

        url = hf_hub_url(repo_id, filename, revision=revision, endpoint=self.endpoint)
        try:
            meta = get_hf_file_metadata(url, token=self._token_now(), timeout=self._timeout,
                                        endpoint=self.endpoint)
        except Exception as exc:
            raise self._fail(exc, repo_id, revision, filename) from None
        return meta.size

    def read(self, repo_id: str, filename: str, revision: str | None) -> bytes:
        from huggingface_hub import hf_hub_download

        try:
            path = hf_hub_download(repo_id, filename, revision=revision,
                                   endpoint=self.endpoint, token=self._token_now(),
                                   cache_dir=self._cache_dir, etag_timeout=self._timeout)
        except Exception as exc:
            raise self._fail(exc, repo_id, revision, filename) from None
        return Path(path).read_bytes()

    def read_range(self, repo_id: str, filename: str, revision: str | None, start: int,
                   length: int) -> bytes:
        # huggingface-hub has no ranged read, so this is one GET with a Range header
        # through httpx, to the URL huggingface-hub would use and with its token.
        # httpx drops the token when the Hub redirects to its storage on another host.
        import httpx
        from huggingface_hub import hf_hub_url

        url = hf_hub_url(repo_id, filename, revision=revision, endpoint=self.endpoint)
        headers = {"Range": f"bytes={start}-{start + length - 1}"}
        token = self._token_now()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        out = bytearray()
        try:
            with httpx.stream("GET", url, headers=headers, timeout=self._timeout,
                              follow_redirects=True) as resp:
                if resp.status_code == 416:  # starts past the end of the file
                    return b""
                if resp.status_code >= 400:
                    code = resp.headers.get("X-Error-Code", "")
                    kind: HubErrorKind = _ERROR_CODES.get(code) or (
                        "unauthorised" if resp.status_code in (401, 403) else "failing")
                    raise hub_error(kind, repo_id, revision, filename, self.endpoint,
                                    status=resp.status_code)
                if resp.status_code != 206 and start:
                    raise HubError("failing", (
                        f"{self.endpoint} ignored a Range request for {filename!r} in "
                        f"{repo_id} (HTTP {resp.status_code}); a part of the file cannot "
                        "be read without downloading all of it"))
                for chunk in resp.iter_bytes():
                    out += chunk
                    if len(out) >= length:
                        break
        except httpx.TransportError as exc:
            raise hub_error("unreachable", repo_id, revision, filename, self.endpoint,
                            detail=str(exc) or type(exc).__name__) from None
        return bytes(out[:length])

    def download(self, repo_id: str, filename: str, revision: str | None,
                 directory: Path) -> Path:
        from huggingface_hub import hf_hub_download

        try:
            path = hf_hub_download(repo_id, filename, revision=revision, local_dir=directory,
                                   endpoint=self.endpoint, token=self._token_now(),
                                   etag_timeout=self._timeout)
        except Exception as exc:
            raise self._fail(exc, repo_id, revision, filename) from None
        return Path(path)
