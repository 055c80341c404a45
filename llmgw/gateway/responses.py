"""The Responses API in terms of chat completions, and back: pure translation, no I/O.

A model whose replicas do not speak ``/v1/responses`` (llama.cpp's embedded
server, most upstreams) still serves it: the gateway turns the request into
a chat completion, and the engine's answer — one JSON object, or a stream of
``chat.completion.chunk`` events — into a Response object or the Responses
event sequence (``response.created``, ``response.output_item.added``,
``response.output_text.delta``, …, ``response.completed``). Everything here
is a function of its arguments (and of fresh random ids), so every rule is
tested without a server; ``responses_api`` does the waiting.

What crosses faithfully: messages of every role (``developer`` becomes
``system``, which every chat template knows), text and image parts,
``function_call`` and ``function_call_output`` items as ``tool_calls`` and
``tool`` messages, function tools and ``tool_choice``, ``text.format``
(JSON object and JSON schema; llama.cpp's embedded server knows only
``json_object`` with a ``schema``, so that is what it is sent),
``max_output_tokens``, sampling settings, logprobs. A field this module does
not know is passed to the engine unchanged (``top_k``, ``seed``,
``min_p``…), as the gateway does for every other endpoint. What chat
completions cannot carry is refused with 400 naming the field rather than
silently dropped: built-in tools (web search, file search…), file inputs,
item references, background mode, stored prompts. ``reasoning``, ``metadata``,
``truncation``, ``include`` and the like shape nothing a chat engine does:
they are echoed in the Response and not sent.

Bodies are handled as decoded JSON (dicts), not structs: a field the module
does not know must reach the engine exactly as written, and Responses input
items are a union whose members need not carry their tag (``{"role":
"user", "content": "hi"}`` is a message). ``null`` is the default wherever
OpenAI's document allows it (``store``, ``stream``, ``tool_choice``,
``parallel_tool_calls``, …), as it is for OpenAI.

What goes back is what OpenAI's schemas require, whatever the chat engine
said: every output text part has ``logprobs`` (empty unless asked for),
usage has its cached and cache-write counts, function tools are echoed
with ``strict`` and ``parameters``, a field the request did not set is
answered with its default or left out, never ``null`` where the schema has
no null (``user``, ``usage`` before there is any), and a failed response's
``error.code`` is one of the document's codes (``server_error`` unless the
engine said ``rate_limit_exceeded``).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from typing import Any

import msgspec

from llmgw.catalog.engines import Engine, speaks
from llmgw.gateway.errors import InvalidRequestError

Json = dict[str, Any]

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.decode

# Request fields this module reads or deliberately does not send; every other
# field passes to the engine unchanged.
_CONSUMED = frozenset({
    "model", "input", "instructions", "previous_response_id", "store", "stream", "tools",
    "tool_choice", "max_output_tokens", "text", "top_logprobs", "parallel_tool_calls",
    "temperature", "top_p", "user", "metadata", "reasoning", "truncation", "include",
    "service_tier", "prompt_cache_key", "safety_identifier", "stream_options", "background",
    "max_tool_calls", "conversation", "prompt",
})


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


def _bad(message: str, field: str) -> InvalidRequestError:
    return InvalidRequestError(f"{field}: {message}", field=field)


# ---------------------------------------------------------------- request


def input_items(raw: Json) -> list[Json]:
    """The request's ``input`` as a list of items (a bare string is one user message)."""
    value = raw.get("input")
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    if not isinstance(value, list):
        raise _bad("a string or a list of input items is required", "input")
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise _bad("each input item must be an object", f"input[{i}]")
    return list(value)


def check_request(raw: Json) -> None:
    """Refuse what no model behind this gateway can do, whatever its engine."""
    if raw.get("background"):
        raise _bad("background responses are not supported by this gateway; send the request "
                   "with stream: true, or without background, and wait for the answer",
                   "background")
    if raw.get("conversation") is not None:
        raise _bad("conversations are not supported; chain responses with "
                   "previous_response_id", "conversation")
    if raw.get("prompt") is not None:
        raise _bad("stored prompts are not supported; send the instructions and input",
                   "prompt")
    previous = raw.get("previous_response_id")
    if previous is not None and not isinstance(previous, str):
        raise _bad("must be the id of a stored response (a string)", "previous_response_id")
    store = raw.get("store")
    if store is not None and not isinstance(store, bool):
        raise _bad("must be true, false or null", "store")


def stores(raw: Json) -> bool:
    """Whether the response to ``raw`` is kept: ``store`` true, absent or null (the default)."""
    return raw.get("store") is not False


def _text_of(parts: list[Any], where: str) -> str:
    texts = []
    for j, part in enumerate(parts):
        if isinstance(part, dict) and part.get("type") in ("input_text", "output_text", "text"):
            texts.append(str(part.get("text", "")))
        else:
            raise _bad("only text parts can be sent here", f"{where}[{j}]")
    return "".join(texts)


def _chat_part(part: Any, where: str) -> Json:
    if not isinstance(part, dict):
        raise _bad("a content part must be an object", where)
    kind = part.get("type")
    if kind in ("input_text", "output_text"):
        return {"type": "text", "text": part.get("text", "")}
    if kind == "refusal":
        return {"type": "text", "text": part.get("refusal", "")}
    if kind == "input_image":
        url = part.get("image_url")
        if not isinstance(url, str):
            raise _bad("an image by file_id cannot be sent to a chat engine; give image_url "
                       "(an https or data: URL)", where)
        image: Json = {"url": url}
        if part.get("detail") is not None:
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    if kind == "input_audio":
        return {"type": "input_audio", "input_audio": part.get("input_audio")}
    raise _bad(f"content of type {kind!r} cannot be sent to a chat engine (text, images "
               "and audio can)", where)


def _message(item: Json, where: str) -> Json:
    role = item.get("role")
    if role not in ("user", "assistant", "system", "developer"):
        raise _bad("role must be user, assistant, system or developer", f"{where}.role")
    content = item.get("content")
    if isinstance(content, str):
        body: Any = content
    elif isinstance(content, list):
        parts = [_chat_part(p, f"{where}.content[{j}]") for j, p in enumerate(content)]
        if all(p["type"] == "text" for p in parts):
            body = "".join(p["text"] for p in parts)
        else:
            body = parts
    else:
        raise _bad("must be a string or a list of content parts", f"{where}.content")
    return {"role": "system" if role == "developer" else role, "content": body}


def chat_messages(items: list[Json], instructions: Any = None) -> list[Json]:
    """Responses input items as chat messages; consecutive function calls share one message."""
    messages: list[Json] = []
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    elif isinstance(instructions, list):
        items = [*instructions, *items]
    elif instructions is not None and not isinstance(instructions, str):
        raise _bad("must be a string", "instructions")
    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            messages.append(_message(item, where))
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"),
                                 "arguments": item.get("arguments", "")}}
            if not isinstance(call["id"], str) or not isinstance(item.get("name"), str):
                raise _bad("a function_call needs call_id and name", where)
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
                if last.get("content") == "":
                    last["content"] = None
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            if isinstance(output, list):
                output = _text_of(output, f"{where}.output")
            if not isinstance(item.get("call_id"), str) or not isinstance(output, str):
                raise _bad("a function_call_output needs call_id and a text output", where)
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": output})
        elif kind == "reasoning":
            continue   # a chat engine cannot take reasoning back; its answer stands alone
        else:
            raise _bad(f"items of type {kind!r} cannot be sent to a chat engine (messages, "
                       "function_call and function_call_output can)", where)
    return messages


def _tools(tools: Any) -> list[Json]:
    if not isinstance(tools, list):
        raise _bad("must be a list", "tools")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else tool
            raise _bad(f"the built-in tool {kind!r} is not available here: this model is "
                       "reached through chat completions, which carry function tools only",
                       f"tools[{i}]")
        function = {k: tool[k] for k in ("name", "description", "parameters", "strict")
                    if k in tool}
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, str):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    raise _bad("only auto, none, required or a function can be chosen for this model",
               "tool_choice")


def _response_format(text: Any, engine: Engine | None) -> Json | None:
    if not isinstance(text, dict):
        raise _bad("must be an object", "text")
    fmt = text.get("format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        assert isinstance(fmt, dict)
        if speaks(engine).schema_as_json_object:
            # llama-cpp-python 0.3 accepts only {"type": "json_object", "schema": …}
            # (llama_types.ChatCompletionRequestResponseFormat).
            return {"type": "json_object", "schema": fmt.get("schema")}
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    raise _bad("type must be text, json_object or json_schema", "text.format")


def chat_request(raw: Json, items: list[Json], served: str, engine: Engine | None) -> Json:
    """The chat completion request that answers the Responses request ``raw``.

    ``items`` is the whole conversation to send (earlier turns resolved from
    ``previous_response_id``, then this request's input).
    """
    body: Json = {k: v for k, v in raw.items() if k not in _CONSUMED}
    body["model"] = served
    body["messages"] = chat_messages(items, raw.get("instructions"))
    if raw.get("tools"):
        body["tools"] = _tools(raw["tools"])
    if raw.get("tool_choice") is not None:
        body["tool_choice"] = _tool_choice(raw["tool_choice"])
    if raw.get("parallel_tool_calls") is not None and raw.get("tools"):
        body["parallel_tool_calls"] = raw["parallel_tool_calls"]
    for src, dst in (("max_output_tokens", "max_tokens"), ("temperature", "temperature"),
                     ("top_p", "top_p"), ("user", "user")):
        if raw.get(src) is not None:
            body[dst] = raw[src]
    if raw.get("text") is not None:
        fmt = _response_format(raw["text"], engine)
        if fmt is not None:
            body["response_format"] = fmt
    top = raw.get("top_logprobs")
    include = raw.get("include") or []
    if top or "message.output_text.logprobs" in include:
        body["logprobs"] = True
        if top:
            body["top_logprobs"] = top
    if raw.get("stream"):
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


def passthrough_request(raw: Json, items: list[Json] | None, served: str) -> Json:
    """The request for an engine that serves ``/v1/responses`` itself.

    The gateway keeps the conversation (engines keep theirs per process, and
    vLLM not at all unless ``VLLM_ENABLE_RESPONSES_API_STORE`` is set), so a
    previous response is resolved here into the input and the engine is told
    not to store anything.
    """
    body = dict(raw)
    body["model"] = served
    body["store"] = False
    body.pop("previous_response_id", None)
    if items is not None:
        body["input"] = items
    return body


# ---------------------------------------------------------------- response


def _echoed_tool(tool: Any) -> Any:
    """A tool as a Response echoes it: a function tool with its ``strict`` and ``parameters``
    (null when not given), which OpenAI's FunctionTool requires."""
    if isinstance(tool, dict) and tool.get("type") == "function":
        return {"strict": None, "parameters": None, **tool}
    return tool


def skeleton(raw: Json, *, id: str, created_at: int, model: str) -> Json:
    """A Response ``in_progress`` for ``raw``: every field echoed from the request, a field
    it left out or set to null as its default."""
    parallel = raw.get("parallel_tool_calls")
    out = {
        "id": id, "object": "response", "created_at": created_at, "status": "in_progress",
        "background": False, "error": None, "incomplete_details": None,
        "instructions": raw.get("instructions"), "max_output_tokens": raw.get("max_output_tokens"),
        "model": model, "output": [],
        "parallel_tool_calls": True if parallel is None else parallel,
        "previous_response_id": raw.get("previous_response_id"),
        "reasoning": raw.get("reasoning"), "store": stores(raw),
        "temperature": raw.get("temperature"),
        "text": raw.get("text") or {"format": {"type": "text"}},
        "tool_choice": raw.get("tool_choice") or "auto",
        "tools": [_echoed_tool(t) for t in raw.get("tools") or []],
        "top_logprobs": raw.get("top_logprobs"), "top_p": raw.get("top_p"),
        "truncation": raw.get("truncation") or "disabled",
        "metadata": raw.get("metadata") or {},
    }
    if isinstance(raw.get("user"), str):
        out["user"] = raw["user"]
    return out


def usage(chat_usage: Any) -> Json | None:
    """Responses usage for a chat completion's; the counts an engine does not report (a
    prefix cache's writes, reasoning) are 0, as OpenAI's ResponseUsage requires them."""
    if not isinstance(chat_usage, dict):
        return None
    prompt = int(chat_usage.get("prompt_tokens") or 0)
    completion = int(chat_usage.get("completion_tokens") or 0)
    details = chat_usage.get("prompt_tokens_details") or {}
    reasoning = (chat_usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
    return {"input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": int(details.get("cached_tokens") or 0),
                                     "cache_write_tokens":
                                         int(details.get("cache_write_tokens") or 0)},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": int(reasoning)},
            "total_tokens": int(chat_usage.get("total_tokens") or prompt + completion)}


def complete_usage(found: Any) -> None:
    """Fill in the detail counts OpenAI's ResponseUsage requires that an engine's own
    Responses usage left out (vLLM reports no cache writes)."""
    if not isinstance(found, dict):
        return
    inputs = found.get("input_tokens_details")
    if not isinstance(inputs, dict):
        inputs = found["input_tokens_details"] = {}
    inputs.setdefault("cached_tokens", 0)
    inputs.setdefault("cache_write_tokens", 0)
    outputs = found.get("output_tokens_details")
    if not isinstance(outputs, dict):
        outputs = found["output_tokens_details"] = {}
    outputs.setdefault("reasoning_tokens", 0)


def _logprobs(chat_logprobs: Any) -> list[Json]:
    content = chat_logprobs.get("content") if isinstance(chat_logprobs, dict) else None
    return [{"token": t.get("token"), "logprob": t.get("logprob"), "bytes": t.get("bytes") or [],
             "top_logprobs": [{"token": o.get("token"), "logprob": o.get("logprob"),
                               "bytes": o.get("bytes") or []}
                              for o in t.get("top_logprobs") or []]}
            for t in content or []]


def _finish(response: Json, finish_reason: Any, chat_usage: Any, now: float) -> Json:
    if finish_reason == "length":
        response["status"] = "incomplete"
        response["incomplete_details"] = {"reason": "max_output_tokens"}
    elif finish_reason == "content_filter":
        response["status"] = "incomplete"
        response["incomplete_details"] = {"reason": "content_filter"}
    else:
        response["status"] = "completed"
        response["completed_at"] = int(now)
    counted = usage(chat_usage)
    if counted is not None:
        response["usage"] = counted
    return response


def _text_part(text: str, logprobs: list[Json] | None) -> Json:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


def _message_item(text: str, refusal: str | None, logprobs: list[Json] | None,
                  status: str = "completed") -> Json:
    content: list[Json] = []
    if refusal:
        content.append({"type": "refusal", "refusal": refusal})
    if text or not refusal:
        content.append(_text_part(text, logprobs))
    return {"type": "message", "id": new_id("msg"), "status": status, "role": "assistant",
            "content": content}


def response_from_chat(chat: Json, base: Json, now: float | None = None) -> Json:
    """The Response for a chat completion object, on the ``skeleton`` ``base``."""
    response = dict(base)
    choices = chat.get("choices") or [{}]
    choice = choices[0]
    message = choice.get("message") or {}
    output: list[Json] = []
    text = message.get("content")
    logprobs = _logprobs(choice["logprobs"]) if choice.get("logprobs") else None
    if text or message.get("refusal") or not message.get("tool_calls"):
        output.append(_message_item(text or "", message.get("refusal"), logprobs))
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        output.append({"type": "function_call", "id": new_id("fc"), "call_id": call.get("id"),
                       "name": function.get("name"), "arguments": function.get("arguments", ""),
                       "status": "completed"})
    response["output"] = output
    return _finish(response, choice.get("finish_reason"), chat.get("usage"),
                   time.time() if now is None else now)


# ---------------------------------------------------------------- server-sent events


class EventReader:
    """Splits a byte stream into server-sent events: ``(event name or None, data)``."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, chunk: bytes) -> Iterator[tuple[str | None, bytes]]:
        buf = self._buf + chunk if self._buf else chunk
        if b"\r" in buf:   # a CR at the very end waits for the LF of the next piece
            buf = buf.replace(b"\r\n", b"\n")
        while (end := buf.find(b"\n\n")) >= 0:
            block, buf = buf[:end], buf[end + 2:]
            name: str | None = None
            data: list[bytes] = []
            for line in block.split(b"\n"):
                if line.startswith(b"data:"):
                    data.append(line[5:].removeprefix(b" "))
                elif line.startswith(b"event:"):
                    name = line[6:].strip().decode("utf-8", "replace")
            if data:
                yield name, b"\n".join(data)
        self._buf = buf


def sse(event: Json) -> bytes:
    return b"event: " + str(event["type"]).encode() + b"\ndata: " + _encode(event) + b"\n\n"


# The codes of OpenAI's ResponseErrorCode a failed chat stream can mean.
_RESPONSE_ERROR_CODES = frozenset({"server_error", "rate_limit_exceeded"})


class ChatToResponses:
    """Turns a chat completion stream into the Responses event stream, event by event.

    Output items are numbered in the order they first appear: the assistant
    message when its first text arrives, each tool call when its index
    first appears. ``final`` is the finished Response once the stream has
    ended (completed, incomplete, or failed on an error event).
    """

    def __init__(self, base: Json) -> None:
        self.response = base
        self.final: Json | None = None
        self._seq = 0
        self._reader = EventReader()
        self._items: list[Json] = []                    # output items, in order
        self._message: Json | None = None
        self._text: list[str] = []
        self._refusal: list[str] = []
        self._logprobs: list[Json] | None = None
        self._calls: dict[int, Json] = {}                # chat tool-call index → item
        self._finish_reason: Any = None
        self._usage: Any = None

    def _event(self, kind: str, **fields: Any) -> bytes:
        event = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return sse(event)

    def begin(self) -> bytes:
        return (self._event("response.created", response=self.response)
                + self._event("response.in_progress", response=self.response))

    def _index(self, item: Json) -> int:
        return self._items.index(item)

    def _open_message(self) -> bytes:
        item = {"type": "message", "id": new_id("msg"), "status": "in_progress",
                "role": "assistant", "content": []}
        self._message = item
        self._items.append(item)
        index = self._index(item)
        return (self._event("response.output_item.added", output_index=index, item=item)
                + self._event("response.content_part.added", item_id=item["id"],
                              output_index=index, content_index=0, part=_text_part("", None)))

    def _chunk(self, chunk: Json) -> bytes:
        out = b""
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            text = delta.get("content")
            lp = _logprobs(choice["logprobs"]) if choice.get("logprobs") else []
            if text or lp:
                if self._message is None:
                    out += self._open_message()
                assert self._message is not None
                if lp:
                    self._logprobs = [*(self._logprobs or []), *lp]
                self._text.append(text or "")
                out += self._event("response.output_text.delta", item_id=self._message["id"],
                                   output_index=self._index(self._message), content_index=0,
                                   delta=text or "", logprobs=lp)
            if delta.get("refusal"):
                if self._message is None:
                    out += self._open_message()
                assert self._message is not None
                self._refusal.append(delta["refusal"])
                out += self._event("response.refusal.delta", item_id=self._message["id"],
                                   output_index=self._index(self._message), content_index=0,
                                   delta=delta["refusal"])
            for call in delta.get("tool_calls") or []:
                out += self._tool_delta(call)
            if choice.get("finish_reason"):
                self._finish_reason = choice["finish_reason"]
        return out

    def _tool_delta(self, call: Json) -> bytes:
        out = b""
        index = call.get("index", 0)
        function = call.get("function") or {}
        item = self._calls.get(index)
        if item is None:
            item = {"type": "function_call", "id": new_id("fc"),
                    "call_id": call.get("id") or new_id("call"),
                    "name": function.get("name") or "", "arguments": "",
                    "status": "in_progress"}
            self._calls[index] = item
            self._items.append(item)
            out += self._event("response.output_item.added", output_index=self._index(item),
                               item=dict(item))
        elif function.get("name"):
            item["name"] += function["name"]
        piece = function.get("arguments") or ""
        if piece:
            item["arguments"] += piece
            out += self._event("response.function_call_arguments.delta", item_id=item["id"],
                               output_index=self._index(item), delta=piece)
        return out

    def _close_items(self, status: str) -> bytes:
        out = b""
        for index, item in enumerate(self._items):
            if item is self._message:
                text = "".join(self._text)
                done = _message_item(text, "".join(self._refusal) or None, self._logprobs,
                                     status)
                done["id"] = item["id"]
                part = done["content"][-1]
                if part["type"] == "output_text":
                    out += self._event("response.output_text.done", item_id=item["id"],
                                       output_index=index, content_index=0, text=text,
                                       logprobs=self._logprobs or [])
                out += self._event("response.content_part.done", item_id=item["id"],
                                   output_index=index, content_index=0, part=part)
                self._items[index] = done
                out += self._event("response.output_item.done", output_index=index, item=done)
            else:
                item["status"] = status
                out += self._event("response.function_call_arguments.done",
                                   item_id=item["id"], output_index=index, name=item["name"],
                                   arguments=item["arguments"])
                out += self._event("response.output_item.done", output_index=index, item=item)
        return out

    def _complete(self) -> bytes:
        # An empty answer is still one (empty) message.
        pre = self._open_message() if self._message is None and not self._calls else b""
        done = dict(self.response)
        _finish(done, self._finish_reason, self._usage, time.time())
        out = pre + self._close_items("completed" if done["status"] == "completed"
                                      else "incomplete")
        done["output"] = self._items
        self.final = done
        kind = "response.completed" if done["status"] == "completed" else "response.incomplete"
        return out + self._event(kind, response=done)

    def _fail(self, error: Any) -> bytes:
        detail = error if isinstance(error, dict) else {"message": str(error)}
        message = str(detail.get("message") or "the model's stream failed")
        code = detail.get("code")
        code = code if isinstance(code, str) and code else "server_error"
        param = detail.get("param")
        failed = dict(self.response)
        failed["status"] = "failed"
        # A Response's error.code is one of OpenAI's ResponseErrorCode values; the error
        # event before it carries the engine's own code.
        failed["error"] = {"code": code if code in _RESPONSE_ERROR_CODES else "server_error",
                           "message": message}
        failed["output"] = self._items
        self.final = failed
        return (self._event("error", code=code, message=message,
                            param=param if isinstance(param, str) else None)
                + self._event("response.failed", response=failed))

    def feed(self, chunk: bytes) -> bytes:
        """Responses events for one piece of the chat stream (possibly none)."""
        out = b""
        for _, data in self._reader.feed(chunk):
            if self.final is not None:
                break
            if data == b"[DONE]":
                out += self._complete()
                continue
            try:
                event = _decode(data)
            except msgspec.DecodeError:
                continue
            if not isinstance(event, dict):
                continue
            if "error" in event:
                out += self._fail(event["error"])
            else:
                out += self._chunk(event)
        return out

    def end(self) -> bytes:
        """The chat stream ended: complete the response if ``[DONE]`` never came."""
        return b"" if self.final is not None else self._complete()


class ResponsesObserver:
    """Watches a Responses stream from an engine that speaks it, to keep what it finished.

    The engine was sent ``store: false`` and the conversation inline (see
    ``passthrough_request``), so each response object it reports is given
    back the ``store`` and ``previous_response_id`` the client asked for.
    """

    def __init__(self, store: bool, previous: str | None) -> None:
        self.final: Json | None = None
        self._store = store
        self._previous = previous
        self._reader = EventReader()

    def patch(self, response: Json) -> Json:
        response["store"] = self._store
        response["previous_response_id"] = self._previous
        complete_usage(response.get("usage"))
        return response

    def feed(self, chunk: bytes) -> bytes:
        out = b""
        for name, data in self._reader.feed(chunk):
            try:
                event = _decode(data)
            except msgspec.DecodeError:
                out += (b"event: " + name.encode() + b"\n" if name else b"") + b"data: " + \
                    data + b"\n\n"
                continue
            if isinstance(event, dict) and isinstance(event.get("response"), dict):
                self.patch(event["response"])
                if event.get("type") in ("response.completed", "response.incomplete"):
                    self.final = event["response"]
                out += (b"event: " + name.encode() + b"\n" if name else b"") + b"data: " + \
                    _encode(event) + b"\n\n"
            else:
                out += (b"event: " + name.encode() + b"\n" if name else b"") + b"data: " + \
                    data + b"\n\n"
        return out


def context_after(items: list[Json], response: Json) -> list[Json]:
    """The conversation a later ``previous_response_id`` continues: input, then output.

    An input item the client sent without an ``id`` is given one here, once:
    it is kept with the conversation, so the item has the same id in this
    response's input items and in those of every later turn.
    """
    return [*(item if isinstance(item.get("id"), str) else {**item, "id": _item_id(item)}
              for item in items),
            *(response.get("output") or [])]


_ID_PREFIXES = {"message": "msg", "function_call": "fc", "function_call_output": "fco",
                "reasoning": "rs"}


def _kind(item: Json) -> Any:
    return item.get("type", "message" if "role" in item else None)


def _item_id(item: Json) -> str:
    return new_id(_ID_PREFIXES.get(_kind(item), "item"))


def input_of(context: list[Json], response: Json) -> list[Json]:
    """The items ``response`` was given: its stored conversation without its own output."""
    produced = len(response.get("output") or [])
    return context[:len(context) - produced] if produced else list(context)


def item_resource(item: Json) -> Json:
    """A stored input item in the shape OpenAI lists input items (ItemResource): typed,
    with a status, a message's text as content parts."""
    kind = _kind(item)
    out = {**item, "type": kind}
    if kind == "message":
        assistant = item.get("role") == "assistant"
        content = item.get("content")
        if isinstance(content, str):
            content = [_text_part(content, None) if assistant
                       else {"type": "input_text", "text": content}]
        elif assistant and isinstance(content, list):
            content = [{"annotations": [], "logprobs": [], **p}
                       if isinstance(p, dict) and p.get("type") == "output_text" else p
                       for p in content]
        out["content"] = content
        out.setdefault("status", "completed")
    elif kind in ("function_call", "function_call_output"):
        out.setdefault("status", "completed")
    return out
