"""Resuming a stream that broke after it started: which streams can be, and the splice.

A retry is free only before the first byte reaches the client
(``llmgw.gateway.proxy``). After it, a broken stream can still be finished
if another replica of the same model is asked to *continue* the answer
rather than to start it again: a chat request is re-sent with the text
already delivered as a final assistant message and vLLM's
``continue_final_message: true, add_generation_prompt: false`` (the chat
template then leaves the assistant turn open instead of starting a new
one); a completion request with that text appended to its prompt. The
token budget shrinks by what was delivered (``max_tokens``,
``max_completion_tokens``, ``min_tokens``), and the new stream's events are
spliced onto the old one: the same ``id`` and ``created``, no second
``role`` delta, usage adding up the two halves. The client sees one stream
with one final ``finish_reason``.

Only what stays exact is resumed. This module decides that from the request
and from every event delivered, with no I/O:

* chat only where the engine continues a final assistant message
  (``Dialect.continues_chat`` in ``llmgw.catalog.engines``: vLLM and SGLang,
  scheduled or external; SGLang has no ``add_generation_prompt`` field and
  is not sent one). llama-cpp-python's server (0.3) declares no
  ``continue_final_message`` in ``CreateChatCompletionRequest``, ignores
  unknown fields, and renders its chat template with the generation prompt
  always added (``Jinja2ChatFormatter``): asked to continue, it would answer
  afresh after the partial message, and the client would get both; OpenAI's
  API has no such field either. Rendering the template in the gateway and
  going through the completions path was rejected too: the gateway does not
  have the model's template. Completions are resumed on every engine, since
  appending to the prompt is what a completion means.
* one choice (``n`` 1, no ``best_of``), no ``logprobs`` (the continuation's
  would be for a different prompt), no tools or functions (a tool call's
  arguments cannot be re-opened), no ``response_format`` or guided decoding
  other than plain text (a grammar would restart at its beginning), no
  ``echo`` or ``suffix``, one text prompt, and no ``continue_final_message``
  or ``add_generation_prompt`` of the client's own.
* a stream whose events carry tool calls, reasoning, logprobs or a second
  choice stops being resumable from that event on.

Tokens delivered are counted as one per event that carries text (vLLM
sends one event per decoding step), or as the engine reports them in the
stream (``stream_options.continuous_usage_stats``); before a vLLM replica
continues, its ``/tokenize`` counts the delivered text (``Dialect.tokenize``), which catches events
that carried several tokens (a lagging consumer gets them merged). Only if
that count is unavailable and events were merged can the continuation run
past ``max_tokens``, by the difference; the text itself is never duplicated
or lost, since the continuation starts from the exact text the client has.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from llmgw.catalog.engines import Engine, speaks

Kind = Literal["chat", "completions"]

_fields = msgspec.json.Decoder(dict[str, msgspec.Raw])
_encode = msgspec.json.Encoder().encode
_DONE = b"data: [DONE]"

# Request fields whose presence (with a value other than these) makes a
# continuation inexact.
_ALLOWED: dict[str, tuple[Any, ...]] = {
    "n": (None, 1),
    "best_of": (None, 1),
    "logprobs": (None, False, 0),
    "top_logprobs": (None, 0),
    "echo": (None, False),
    "suffix": (None, ""),
    "tools": (None, []),
    "functions": (None, []),
    "tool_choice": (None, "none"),
    "function_call": (None, "none"),
    "guided_json": (None,),
    "guided_regex": (None,),
    "guided_choice": (None,),
    "guided_grammar": (None,),
    "structured_outputs": (None,),
    "continue_final_message": (None, False),
    "add_generation_prompt": (None, True),
    "prompt_logprobs": (None, 0),
}


def resume_kind(path: str, body: bytes, engine: Engine | None) -> Kind | None:
    """The kind of continuation a streaming request to a replica speaking ``engine`` (None:
    OpenAI's API) allows, or None."""
    if path == "/v1/chat/completions":
        if not speaks(engine).continues_chat:
            return None
        kind: Kind = "chat"
    elif path == "/v1/completions":
        kind = "completions"
    else:
        return None
    try:
        fields = _fields.decode(body)
        for name, allowed in _ALLOWED.items():
            raw = fields.get(name)
            if raw is not None and msgspec.json.decode(raw) not in allowed:
                return None
        fmt = fields.get("response_format")
        if fmt is not None:
            value = msgspec.json.decode(fmt)
            if value is not None and (not isinstance(value, dict) or value.get("type") != "text"):
                return None
        if kind == "chat":
            messages = msgspec.json.decode(fields.get("messages", b"null"))
            return kind if isinstance(messages, list) and messages else None
        prompt = msgspec.json.decode(fields.get("prompt", b"null"))
    except (msgspec.DecodeError, TypeError):
        return None
    return kind if isinstance(prompt, str) else None


class _Delta(msgspec.Struct):
    content: str | None = None
    tool_calls: msgspec.Raw | None = None
    function_call: msgspec.Raw | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None


class _Choice(msgspec.Struct):
    index: int = 0
    delta: _Delta | None = None
    text: str | None = None
    finish_reason: str | None = None
    logprobs: msgspec.Raw | None = None


class _Usage(msgspec.Struct):
    completion_tokens: int | None = None


class _Event(msgspec.Struct):
    id: str | None = None
    created: int | None = None
    model: str | None = None
    object: str | None = None
    choices: list[_Choice] = []
    usage: _Usage | None = None


_event = msgspec.json.Decoder(_Event)
_NULL = b"null"


def _split(data: bytes) -> tuple[list[bytes], bytes]:
    """Complete SSE events (each with its blank-line terminator) and the rest.

    Lines end in LF (vLLM, llama.cpp's servers) or CRLF (the default of
    sse-starlette, which OpenAI-compatible servers in Python often use).
    """
    events: list[bytes] = []
    start = 0
    while True:
        lf = data.find(b"\n\n", start)
        crlf = data.find(b"\r\n\r\n", start)
        if crlf >= 0 and (lf < 0 or crlf < lf):
            end = crlf + 4
        elif lf >= 0:
            end = lf + 2
        else:
            return events, data[start:]
        events.append(data[start:end])
        start = end


def _data(event: bytes) -> bytes | None:
    """The payload of an event's ``data:`` line (one line: what the engines send)."""
    for line in event.split(b"\n"):
        if line.startswith(b"data:"):
            return line[5:].strip()
    return None


class Splice:
    """One resumable stream: what the client has received, and the rewriting of continuations.

    ``feed`` takes the bytes of the replica currently streaming and returns
    the bytes to pass on: whole events only, so that a break never leaves
    half an event with the client.
    """

    def __init__(self, kind: Kind, limit: int, engine: Engine | None) -> None:
        self.kind: Kind = kind
        self.limit = limit
        self.engine = engine
        self.resumes = 0
        self.text: list[str] = []
        self.tokens = 0
        self.finish: str | None = None
        self.done = False
        self.exact = True
        self.continuing = False
        self._id: str | None = None
        self._created: int | None = None
        self._model: str | None = None
        self._object: str | None = None
        self._base = 0            # tokens delivered before the current continuation
        self._tail = b""

    @property
    def resumable(self) -> bool:
        """Whether a break now can be repaired: by a continuation, or (the answer being
        complete) by ending the stream."""
        return self.exact and not self.done and \
            (self.finish is not None or self.resumes < self.limit)

    @property
    def why_not(self) -> str:
        """Why a break cannot be resumed (a metric label)."""
        if not self.exact:
            return "not_resumable"
        return "limit"

    def counted(self, tokens: int) -> None:
        """The engine's count of the tokens delivered (vLLM's ``/tokenize`` of the text): an
        event may have carried several."""
        if tokens > self.tokens:
            self.tokens = tokens
            if self.continuing:
                self._base = tokens

    def begin_continuation(self) -> None:
        """A new replica is asked to continue: what it sends is rewritten from now on."""
        self.resumes += 1
        self.continuing = True
        self._base = self.tokens
        self._tail = b""

    def feed(self, chunk: bytes) -> bytes:
        events, self._tail = _split(self._tail + chunk if self._tail else chunk)
        if not events:
            return b""
        out: list[bytes] = []
        for event in events:
            rewritten = self._one(event)
            if rewritten:
                out.append(rewritten)
        return b"".join(out)

    def _one(self, event: bytes) -> bytes | None:
        data = _data(event)
        if data is None:
            return event          # a comment or a field the client may want: passed on
        if data == b"[DONE]":
            self.done = True
            return event
        try:
            parsed = _event.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            self.exact = False
            return event
        if self._id is None:
            self._id, self._created = parsed.id, parsed.created
            self._model, self._object = parsed.model, parsed.object
        carried = False
        for choice in parsed.choices:
            if choice.index != 0 or (choice.logprobs is not None and choice.logprobs != _NULL):
                self.exact = False
            delta = choice.delta
            piece = choice.text
            if delta is not None:
                if delta.tool_calls is not None or delta.function_call is not None or \
                        delta.reasoning_content or delta.reasoning:
                    self.exact = False
                piece = delta.content
            if piece:
                self.text.append(piece)
                self.tokens += 1
                carried = True
            if choice.finish_reason is not None:
                self.finish = choice.finish_reason
                carried = True
        usage = parsed.usage
        if usage is not None and usage.completion_tokens is not None:
            self.tokens = max(self.tokens, self._base + usage.completion_tokens)
        if not self.continuing:
            return event
        if not carried and usage is None:
            return None           # the continuation's opening role event: the client had one
        return self._rewrite(data)

    def _rewrite(self, data: bytes) -> bytes:
        obj: dict[str, Any] = msgspec.json.decode(data)
        if self._id is not None:
            obj["id"] = self._id
        if self._created is not None:
            obj["created"] = self._created
        for choice in obj.get("choices") or ():
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if isinstance(delta, dict):
                delta.pop("role", None)
        usage = obj.get("usage")
        if isinstance(usage, dict) and self._base:
            # The continuation's prompt held the delivered text: count it as generated.
            prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
            if isinstance(completion, int):
                usage["completion_tokens"] = completion + self._base
            if isinstance(prompt, int):
                usage["prompt_tokens"] = max(0, prompt - self._base)
        return b"data: " + _encode(obj) + b"\n\n"

    def continuation(self, body: bytes) -> bytes:
        """``body`` (as sent to the engine) asking for the rest of the answer."""
        fields = _fields.decode(body)
        text = "".join(self.text)
        if self.kind == "chat":
            messages = msgspec.json.decode(fields["messages"])
            messages.append({"role": "assistant", "content": text})
            fields["messages"] = msgspec.Raw(_encode(messages))
            fields["continue_final_message"] = msgspec.Raw(b"true")
            if speaks(self.engine).generation_prompt_flag:
                fields["add_generation_prompt"] = msgspec.Raw(b"false")
        else:
            prompt = msgspec.json.decode(fields["prompt"])
            fields["prompt"] = msgspec.Raw(_encode(prompt + text))
        for name, floor in (("max_tokens", 1), ("max_completion_tokens", 1), ("min_tokens", 0)):
            raw = fields.get(name)
            if raw is None:
                continue
            value = msgspec.json.decode(raw)
            if isinstance(value, int) and not isinstance(value, bool):
                fields[name] = msgspec.Raw(_encode(max(floor, value - self.tokens)))
        return _encode(fields)

    def budget_spent(self, body: bytes) -> bool:
        """Whether the client's token budget was used up by what it already has."""
        fields = _fields.decode(body)
        for name in ("max_tokens", "max_completion_tokens"):
            raw = fields.get(name)
            if raw is not None:
                value = msgspec.json.decode(raw)
                if isinstance(value, int) and not isinstance(value, bool) and \
                        value <= self.tokens:
                    return True
        return False

    def ending(self) -> bytes:
        """The events that end a stream whose answer is complete but whose end was cut off."""
        out = b""
        if self.finish is None:
            choice: dict[str, Any] = (
                {"index": 0, "delta": {}, "finish_reason": "length"} if self.kind == "chat" else
                {"index": 0, "text": "", "finish_reason": "length", "logprobs": None})
            obj = {"id": self._id, "object": self._object, "created": self._created,
                   "model": self._model, "choices": [choice]}
            out = b"data: " + _encode(obj) + b"\n\n"
            self.finish = "length"
        if not self.done:
            out += _DONE + b"\n\n"
            self.done = True
        return out
