"""Secrets in URLs, masked before a URL reaches a message, a log line, a page or a file.

A model source, a mirror URL and a database URL may each carry a password —
``https://user:secret@mirror/…``, ``postgresql://llmgw:secret@db/llmgw`` or
``…?password=secret`` — and every one of them ends up in errors shown to API
clients, in the admin page and in logs. So may an external model's
``upstream`` (``https://u:secret@api…``, ``…?key=secret``), which reaches a
tenant in every 502 that names the replica. This is the one module that
masks them, so no place has a weaker copy.

What counts as a secret: the password of ``user:password@``; a user with no
password (``https://TOKEN@host``: a token written as the user); and the value
of every query parameter whose name says it is one (``password``, ``key``,
``api_key``, ``token``, ``secret``, ``sig``… — any name holding one of
``SECRET_WORDS``). A query parameter with any other name is shown: a mirror's
``?revision=main`` is worth seeing. Credentials belong in a header the
configuration names (``upstream_auth``), where nothing shows them; this
masking is for the URL someone wrote anyway.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
from collections.abc import Iterable
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

MASK = "***"
# A query parameter whose name (lowercased) holds one of these carries a secret.
SECRET_WORDS = ("password", "passwd", "pwd", "key", "token", "secret", "sig", "auth",
                "credential", "session")


def _secret_name(name: str) -> bool:
    lowered = name.lower()
    return any(word in lowered for word in SECRET_WORDS)


def redact_url(url: str) -> str:
    """``url`` with its secrets (see the module) replaced by ``***``; a URL that cannot
    be parsed is not shown at all."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, _, hostport = netloc.rpartition("@")
            user, colon, password = userinfo.partition(":")
            if colon and password:
                netloc = f"{user}:{MASK}@{hostport}"
            elif user and user != MASK:
                netloc = f"{MASK}@{hostport}"
        query = parts.query
        if query:
            pairs = parse_qsl(query, keep_blank_values=True)
            if any(_secret_name(k) and v for k, v in pairs):
                query = urlencode([(k, MASK if _secret_name(k) and v else v) for k, v in pairs],
                                  safe="/*", quote_via=quote)
        if netloc == parts.netloc and query == parts.query:
            return url
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    except ValueError:
        return "<a URL that cannot be parsed>"


def secrets_of(url: str) -> list[str]:
    """The secrets ``url`` carries (as written and decoded), longest first, for ``scrub``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return [url]
    found: list[str] = []
    if "@" in parts.netloc:
        userinfo = parts.netloc.rpartition("@")[0]
        user, colon, password = userinfo.partition(":")
        found.append(password if colon and password else user)
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if _secret_name(name) and value:
            found.append(value)
            found.append(quote(value, safe=""))
    out = {s for f in found if f and f != MASK for s in (f, unquote(f))}
    return sorted(out, key=len, reverse=True)


def scrub(text: str, urls: list[str] | tuple[str, ...]) -> str:
    """``text`` (an error from a library, a log line) with every secret of ``urls`` masked,
    wherever in it and however the library quoted the URL."""
    for url in urls:
        text = text.replace(url, redact_url(url))
        for secret in secrets_of(url):
            text = text.replace(secret, MASK)
    return text


# Every request's ledger record names its replica; there are few replicas, and parsing
# a URL costs more than the rest of the record.
@functools.lru_cache(maxsize=1024)
def replica_id(url: str) -> str:
    """What names an upstream or a replica where a URL must not be kept (the usage
    ledger): its host and port, with no user, password, path or query."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
        if host is None:
            return "<a URL that cannot be parsed>"
        if ":" in host:
            host = f"[{host}]"
        return f"{host}:{parts.port}" if parts.port is not None else host
    except ValueError:
        return "<a URL that cannot be parsed>"


def tag_key(secrets: Iterable[str]) -> bytes:
    """The key of ``replica_tag``, from secrets every process of one deployment shares
    (its admin tokens): the gateway that tags an answer and the console that reads the
    tag compute the same key, and a client, knowing none of them, cannot."""
    material = "\0".join(sorted(secrets)).encode()
    return hmac.new(material, b"llmgw replica tag", hashlib.sha256).digest()


def replica_tag(url: str, key: bytes) -> str:
    """An opaque name of the replica at ``url`` that a client may see (the gateway's
    ``x-llmgw-replica``): the same replica gives the same tag, and neither its address
    nor, without ``key``, a guess at it can be checked against the tag."""
    digest = hmac.new(key, replica_id(url).encode(), hashlib.sha256).hexdigest()
    return "r-" + digest[:12]
