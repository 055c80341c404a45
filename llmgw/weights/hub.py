"""The Hugging Face Hub, as the mirror and the source check see it.

``hf://org/repo[@revision][/file]`` is parsed once, by the catalog's decoder
(``llmgw.catalog.source.HfSource``); this module only talks to the Hub.

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

from llmgw.catalog.source import HfSource

DEFAULT_ENDPOINT = "https://huggingface.co"


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
