"""The Hugging Face Hub, as the mirror and the source check see it.

``hf://org/repo[@revision][/file]`` is parsed here, once. A revision holding
a '/' (``refs/pr/3``) is written percent-encoded (``@refs%2Fpr%2F3``) so it
cannot be mistaken for a file path.

huggingface-hub is blocking; callers in the server run these functions in a
thread. Its errors are translated in ``describe`` into what an operator can
act on: not found (check the spelling), gated or unauthorised (a token, or
access to request), unreachable (the network, a proxy, ``HF_ENDPOINT``). The
Hub answers 401 both for a private repository and for one that does not
exist, so that message names both possibilities rather than guessing.

The endpoint is read from ``HF_ENDPOINT`` at call time, not at import time as
huggingface-hub itself does, so a process (or a test) that sets it later is
honoured.
"""

from __future__ import annotations

import os
from urllib.parse import unquote

import msgspec

DEFAULT_ENDPOINT = "https://huggingface.co"


class HfSource(msgspec.Struct, frozen=True, kw_only=True):
    repo_id: str
    revision: str | None = None
    filename: str | None = None

    def __str__(self) -> str:
        rev = f"@{self.revision}" if self.revision else ""
        return f"hf://{self.repo_id}{rev}" + (f"/{self.filename}" if self.filename else "")


def parse_hf_source(source: str) -> HfSource | None:
    """The parts of an ``hf://`` source; None for another form; ValueError if malformed."""
    if not source.startswith("hf://"):
        return None
    rest = source[len("hf://"):]
    org, _, tail = rest.partition("/")
    repo_part, _, filename = tail.partition("/")
    repo, at, revision = repo_part.partition("@")
    if not org or not repo:
        raise ValueError(f"{source!r} is not hf://ORG/REPO[@REVISION][/FILE]")
    if at and not revision:
        raise ValueError(f"{source!r} has an '@' but no revision after it")
    filename = filename.strip("/")
    if ".." in filename.split("/"):
        raise ValueError(f"{source!r}: a file path inside a repository cannot hold '..'")
    return HfSource(repo_id=f"{org}/{repo}", revision=unquote(revision) if revision else None,
                    filename=filename or None)


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


def describe(exc: BaseException, src: HfSource, where: str) -> str | None:
    """What went wrong talking to the Hub at ``where``, for a person; None if ``exc``
    is not a Hub or network error (a bug, which the caller lets propagate)."""
    from huggingface_hub import errors as hf

    repo = src.repo_id
    rev = src.revision or "main"
    if isinstance(exc, hf.GatedRepoError):
        return (f"repository {repo} is gated and this server may not download it: request "
                f"access on {where}/{repo} for the account whose token the server uses "
                "(HF_TOKEN), then check again")
    if isinstance(exc, hf.RepositoryNotFoundError):
        return (f"repository {repo} was not found on {where}, or it is private and the "
                "server's token (HF_TOKEN) cannot see it; check the spelling of ORG/REPO")
    if isinstance(exc, hf.RevisionNotFoundError):
        return f"revision {rev!r} was not found in {repo}; check the branch, tag or commit"
    if isinstance(exc, hf.EntryNotFoundError):
        return (f"file {src.filename!r} was not found in {repo} at revision {rev!r}; check "
                "the file name against the repository's files")
    if isinstance(exc, hf.HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else None
        if status in (401, 403):
            return (f"{where} refused access to {repo} (HTTP {status}): unauthorised; give the "
                    "server a token with read access (HF_TOKEN)")
        return f"{where} answered HTTP {status} for {repo}; the Hub is unreachable or failing"
    if isinstance(exc, TRANSPORT_ERRORS):
        return (f"cannot reach the Hugging Face Hub at {where}: {exc or type(exc).__name__}; "
                "check the network, a proxy, or HF_ENDPOINT")
    return None
