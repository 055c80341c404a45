"""Secrets in URLs, masked before a URL reaches a message, a log line, a page or a file.

A model source, a mirror URL and a database URL may each carry a password —
``https://user:secret@mirror/…``, ``postgresql://llmgw:secret@db/llmgw`` or
``…?password=secret`` — and every one of them ends up in errors shown to API
clients, in the admin page and in logs. This is the one function that masks
them, so no place has a weaker copy.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

MASK = "***"


def redact_url(url: str) -> str:
    """``url`` with the password of its ``user:password@`` and any ``password=`` query
    parameter replaced by ``***``; a URL that cannot be parsed is not shown at all."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, _, hostport = netloc.rpartition("@")
            if ":" in userinfo:
                netloc = f"{userinfo.split(':', 1)[0]}:{MASK}@{hostport}"
        query = parts.query
        if query and "password" in query:
            pairs = parse_qsl(query, keep_blank_values=True)
            query = urlencode([(k, MASK if k == "password" else v) for k, v in pairs],
                              safe="/*", quote_via=quote)
        if netloc == parts.netloc and query == parts.query:
            return url
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    except ValueError:
        return "<a URL that cannot be parsed>"
