"""The prefix key of a request: what identifies the prompt prefix a replica may have cached.

An engine's prefix cache holds the KV state of token blocks it has seen; a
request whose prompt starts with those blocks skips their prefill. For a chat
the stable prefix of a conversation is its opening: the system (or developer)
messages and the first user turn, resent unchanged with every later turn. So
the key of a chat request covers the messages **before the first assistant
message** — the same for every turn of one conversation, different between
conversations that share only a system prompt (which each replica then
caches once, rather than one replica carrying the whole application). For a
completion the key covers the first ``prefix_bytes`` of the prompt.

The region is hashed from its first and last ``prefix_bytes`` and its length,
so a pasted document of megabytes costs the same as a short prompt, and two
conversations with one long shared system prompt still differ by their first
user turn at the region's end.

A body of any shape routes: no messages, no system message, content as a list
of parts (text, images by URL), tool calls, empty messages; anything that
cannot be read as a prompt has no key (``None``), and the request is placed
by load alone. Message content is hashed as the client's JSON bytes: one
client resends a conversation byte for byte, which is the case that matters.

Pure: no I/O.
"""

from __future__ import annotations

import msgspec

from llmgw.gateway.ring import point

_ABSENT = msgspec.Raw()


class _Message(msgspec.Struct):
    role: object = None
    content: msgspec.Raw = _ABSENT


class _Prompt(msgspec.Struct):
    messages: msgspec.Raw = _ABSENT
    prompt: msgspec.Raw = _ABSENT


_prompt = msgspec.json.Decoder(_Prompt)
_messages = msgspec.json.Decoder(list[msgspec.Raw])
_message = msgspec.json.Decoder(_Message)


class PrefixKey(msgspec.Struct, frozen=True):
    """A prompt prefix's ring position; ``follows``: a later turn of a conversation,
    whose earlier turns the replica at ``point`` has likely cached."""

    point: int
    follows: bool


def prefix_key(body: bytes, prefix_bytes: int) -> PrefixKey | None:
    """The ring position of ``body``'s prompt prefix, or None when it has none."""
    try:
        found = _prompt.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if len(found.messages):
        return _chat_key(found.messages, prefix_bytes)
    raw = bytes(found.prompt)
    if raw in (b"", b"null", b'""', b"[]"):
        return None
    return PrefixKey(point(b"p" + raw[:prefix_bytes]), follows=False)


def _chat_key(raw: msgspec.Raw, prefix_bytes: int) -> PrefixKey | None:
    try:
        items = _messages.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    parts: list[bytes] = []
    follows = False
    for item in items:
        try:
            message = _message.decode(item)
        except (msgspec.DecodeError, msgspec.ValidationError):
            message = _Message(content=item)   # not an object: its JSON as it is
        role = message.role if isinstance(message.role, str) else ""
        if role == "assistant" and parts:
            follows = True
            break
        parts.append(role.encode() + b"\0" + bytes(message.content))
    if not parts:
        return None
    region = b"\x1e".join(parts)
    if len(region) <= 2 * prefix_bytes:
        return PrefixKey(point(b"c" + region), follows)
    return PrefixKey(point(b"c" + region[:prefix_bytes] + region[-prefix_bytes:]
                           + len(region).to_bytes(8, "big")), follows)
