"""``/v1/responses``: create (streamed or not), retrieve, delete and list input items.

A model that serves the Responses API itself (``responses`` in its
capabilities: vLLM) is sent the request as it is; one that serves only
chat is sent a chat completion and its answer translated (``responses``).
Either way the conversation is kept here, in the store, never in the
engine: vLLM keeps responses in its process's memory and only when
``VLLM_ENABLE_RESPONSES_API_STORE`` is set
(vllm/entrypoints/openai/responses/serving.py, OpenAIServingResponses), so a
``previous_response_id`` sent on to the next replica, or to the same one
after a restart, would not be found. The gateway resolves
``previous_response_id`` into the input it sends and asks the engine not to
store anything; each finished response is stored with its whole
conversation, for ``gateway.responses_retention`` (24 h by default), unless
the request said ``store: false``. A stored response belongs to the API key
that created it: another key neither reads, continues, lists nor deletes it.
Its input items (``GET /v1/responses/{id}/input_items``) are the
conversation it was given — the earlier turns a ``previous_response_id``
brought in, then its own input — newest first unless ``order=asc``, 20 a
page (up to 100) from the item ``after``; each has the id it was stored with.

A response is stored before its last bytes reach the client, so a client
that sends the next turn the moment it has the answer finds the previous
one. A store that is down does not cost the client its answer (it was paid
for in GPU time): the response is delivered, and the failure logged.

The request goes through the gateway's usual path (``exchange.Core``):
retries and fallbacks, each fallback sent the variant its engine needs.
"""

from __future__ import annotations

import logging
import time
from typing import Any
from urllib.parse import parse_qs

import msgspec

from llmgw.catalog.model import Model
from llmgw.errors import LlmgwError, NotFoundError, StoreUnavailableError
from llmgw.gateway.capabilities import responses_mode
from llmgw.gateway.errors import (
    InvalidRequestError,
    Message,
    MethodNotAllowedError,
    Receive,
    Scope,
    Send,
    UnknownPathError,
    error_json,
    send_error,
)
from llmgw.gateway.exchange import Call, Core
from llmgw.gateway.files import page, page_limit, page_order
from llmgw.gateway.proxy import Body, ForwardRequest
from llmgw.gateway.request import header
from llmgw.gateway.requestid import tagged
from llmgw.gateway.responses import (
    ChatToResponses,
    Json,
    ResponsesObserver,
    chat_request,
    check_request,
    context_after,
    input_items,
    input_of,
    item_resource,
    new_id,
    passthrough_request,
    response_from_chat,
    skeleton,
    stores,
)
from llmgw.store.base import OwnerId, StoredResponse

log = tagged(logging.getLogger("llmgw.gateway.responses"))
# A page of input items: OpenAI's default and largest.
ITEMS_PAGE = 20
MAX_ITEMS_PAGE = 100

PATH = "/v1/responses"
_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.decode


class ResponseNotFoundError(NotFoundError):
    code = "response_not_found"


def _not_found(id: str, field: str | None = None) -> ResponseNotFoundError:
    return ResponseNotFoundError(
        f"response {id!r} does not exist: it was never stored (store: false), has expired "
        "(responses are kept for gateway.responses_retention), was deleted, or was created "
        "with another API key", field=field)


def _json(body: bytes) -> Json:
    try:
        raw = _decode(body)
    except msgspec.DecodeError as exc:
        raise InvalidRequestError(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise InvalidRequestError("the request body must be a JSON object")
    return raw


async def _send_json(send: Send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class ResponsesEndpoint:
    def __init__(self, core: Core) -> None:
        self.core = core

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        if path == PATH:
            await self.core.inference(scope, receive, send, PATH, _Create(self.core))
            return
        try:
            await self._stored(scope, send, path[len(PATH) + 1:])
        except LlmgwError as err:
            await send_error(send, err)

    async def _stored(self, scope: Scope, send: Send, tail: str) -> None:
        id, _, rest = tail.partition("/")
        if not id or rest not in ("", "input_items"):
            raise UnknownPathError(f"{scope['path']}: not an endpoint of this gateway (it "
                                   "serves POST /v1/responses, GET and DELETE "
                                   "/v1/responses/{id}, GET /v1/responses/{id}/input_items)")
        method = scope["method"]
        allowed = ("GET",) if rest else ("GET", "DELETE")
        if method not in allowed:
            raise MethodNotAllowedError(method, scope["path"], allowed)
        key = self.core.authenticate(scope["headers"])
        store = self.core.state
        if method == "GET":
            stored = await store.get_response(id, key.owner)
            if stored is None:
                raise _not_found(id)
            if rest:
                await self._input_items(scope, send, stored)
            else:
                await _send_json(send, 200, stored.body)
            return
        if not await store.delete_response(id, key.owner):
            raise _not_found(id)
        await _send_json(send, 200, _encode({"id": id, "object": "response.deleted",
                                             "deleted": True}))

    async def _input_items(self, scope: Scope, send: Send, stored: StoredResponse) -> None:
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        limit = page_limit(query, default=ITEMS_PAGE, most=MAX_ITEMS_PAGE)
        after = query.get("after", [None])[0] or None
        items = input_of(_decode(stored.context), _decode(stored.body))
        if page_order(query) == "desc":
            items.reverse()
        if after is not None:
            ids = [item.get("id") for item in items]
            items = items[ids.index(after) + 1:] if after in ids else []
        listed = [item_resource(item) for item in items[:limit + 1]]
        await _send_json(send, 200, _encode(page(listed, limit)))


class _Create:
    """One ``POST /v1/responses``: the exchange that admits it and shapes its answer."""

    def __init__(self, core: Core) -> None:
        self.core = core

    async def admit(self, scope: Scope, receive: Receive, send: Send, started: float,
                    call: Call) -> tuple[ForwardRequest, list[Model], Send]:
        core = self.core
        req, chain = await core.admit_json(scope, receive, PATH, started, call)
        assert call.key is not None
        raw = _json(req.body)
        check_request(raw)
        items = input_items(raw)
        previous = raw.get("previous_response_id")
        if previous is not None:
            stored = await core.state.get_response(previous, call.key.owner)
            if stored is None:
                raise _not_found(previous, "previous_response_id")
            items = [*_decode(stored.context), *items]
        variants = _Variants(raw, items, previous is not None,
                             req.adapter.name if req.adapter is not None else None)
        variants.of(chain[0])      # a request the model cannot take is refused now, as a 400
        kept = [chain[0]]
        for fallback in chain[1:]:
            try:
                variants.of(fallback)
            except InvalidRequestError as exc:
                log.info("not falling back to %r for a response: %s", fallback.name, exc)
            else:
                kept.append(fallback)
        req.variant = variants.of
        base = skeleton(raw, id=new_id("resp"), created_at=int(time.time()), model=req.model)
        answer = _Answer(send, base, raw, items, core, call.key.owner,
                         {m.name: responses_mode(m) for m in kept})
        return req, kept, answer.send


class _Variants:
    """The request each model of the chain is sent, made once per model."""

    def __init__(self, raw: Json, items: list[Json], resolved: bool,
                 adapter: str | None = None) -> None:
        self.raw, self.items, self.resolved = raw, items, resolved
        self.adapter = adapter
        self._made: dict[str, tuple[str, Body]] = {}

    def of(self, model: Model) -> tuple[str, Body]:
        made = self._made.get(model.name)
        if made is None:
            served = model.engine_model_name
            if self.adapter is not None:
                # A LoRA adapter's request, on its base alone: the engine's lora_name.
                served = self.adapter
            if responses_mode(model) == "passthrough":
                body = passthrough_request(self.raw, self.items if self.resolved else None,
                                           served)
                made = (PATH, _encode(body))
            else:
                made = ("/v1/chat/completions",
                        _encode(chat_request(self.raw, self.items, served, model.dialect)))
            self._made[model.name] = made
        return made


def _headers(headers: list[tuple[bytes, bytes]], length: int | None) -> list[tuple[bytes, bytes]]:
    out = [(n, v) for n, v in headers if n != b"content-length"]
    if length is not None:
        out.append((b"content-length", str(length).encode()))
    return out


class _Answer:
    """The ASGI ``send`` between the forwarder and the client: translates, observes, stores."""

    def __init__(self, send: Send, base: Json, raw: Json, items: list[Json], core: Core,
                 owner: OwnerId, modes: dict[str, Any]) -> None:
        self._send = send
        self._base = base
        self._items = items
        self._core = core
        self._owner = owner
        self._modes = modes
        self._keep = stores(raw)
        self._previous = raw.get("previous_response_id")
        self._start: Message | None = None
        self._translate = False
        self._stream: ChatToResponses | ResponsesObserver | None = None
        self._stored = False

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            await self._started(message)
            return
        chunk: bytes = message.get("body", b"")
        more = bool(message.get("more_body", False))
        if self._start is not None:     # a JSON answer: one piece, shaped whole
            start, self._start = self._start, None
            body = await self._whole(chunk)
            start["headers"] = _headers(start["headers"], len(body))
            await self._send(start)
            await self._send({"type": "http.response.body", "body": body})
            return
        if self._stream is None:
            await self._send(message)
            return
        out = self._stream.feed(chunk) if chunk else b""
        if not more and isinstance(self._stream, ChatToResponses):
            out += self._stream.end()
        if self._stream.final is not None:
            await self._store(self._stream.final)
        if out or not more:
            await self._send({"type": "http.response.body", "body": out, "more_body": more})

    async def _started(self, message: Message) -> None:
        status = message["status"]
        name = header(message["headers"], b"x-llmgw-model")
        mode = self._modes.get(name.decode()) if name is not None else None
        if status != 200 or mode is None:
            await self._send(message)          # an engine's error passes as it is
            return
        self._translate = mode == "translate"
        ctype = header(message["headers"], b"content-type") or b""
        if not ctype.startswith(b"text/event-stream"):
            self._start = dict(message)        # held until the body is shaped
            return
        message = dict(message)
        message["headers"] = _headers(message["headers"], None)
        await self._send(message)
        if self._translate:
            stream = ChatToResponses(self._base)
            self._stream = stream
            await self._send({"type": "http.response.body", "body": stream.begin(),
                              "more_body": True})
        else:
            self._stream = ResponsesObserver(self._keep, self._previous)

    async def _whole(self, body: bytes) -> bytes:
        try:
            answer = _decode(body)
        except msgspec.DecodeError:
            return body
        if not isinstance(answer, dict):
            return body
        if self._translate:
            response = response_from_chat(answer, self._base)
        else:
            response = ResponsesObserver(self._keep, self._previous).patch(answer)
        await self._store(response)
        return _encode(response)

    async def _store(self, response: Json) -> None:
        if self._stored or not self._keep:
            return
        self._stored = True
        await keep(self._core, self._owner, self._items, response)


async def keep(core: Core, owner: OwnerId, items: list[Json], response: Json) -> None:
    """Store a finished response with its conversation; a store that is down costs nothing
    but the ability to retrieve or continue it (logged)."""
    if response.get("status") == "failed":
        return
    record = StoredResponse(id=str(response.get("id")), owner=owner, body=_encode(response),
                            context=_encode(context_after(items, response)))
    try:
        await core.state.put_response(record, float(core.config.gateway.responses_retention))
    except StoreUnavailableError as exc:
        log.warning("response %s was answered but could not be stored, so it cannot be "
                    "retrieved or continued: %s", record.id, exc.message)


async def batch_response(core: Core, body: bytes, owner: OwnerId) -> tuple[int, bytes]:
    """One ``/v1/responses`` line of a batch: the same resolution, variants and storage as a
    client's request, answered as one JSON Response (batch lines do not stream)."""
    try:
        raw = _json(body)
        check_request(raw)
        items = input_items(raw)
        previous = raw.get("previous_response_id")
        if previous is not None:
            stored = await core.state.get_response(previous, owner)
            if stored is None:
                raise _not_found(previous, "previous_response_id")
            items = [*_decode(stored.context), *items]
        name = str(raw.get("model"))
        chain = core.chain_for(name, None, PATH, Call())
        variants = _Variants(raw, items, previous is not None,
                             name if name in core.catalog.adapters else None)
        variants.of(chain[0])
    except LlmgwError as err:
        return err.status, error_json(err)
    base = skeleton(raw, id=new_id("resp"), created_at=int(time.time()), model=name)
    status, answer, served_by = await core.execute(PATH, body, name, variant=variants.of,
                                                   owner=owner)
    model = core.catalog.get(served_by or "")
    if status != 200 or model is None:
        return status, answer
    try:
        decoded = _decode(answer)
    except msgspec.DecodeError:
        return status, answer
    keep_it = stores(raw)
    if responses_mode(model) == "translate":
        response = response_from_chat(decoded, base)
    else:
        response = ResponsesObserver(keep_it, previous).patch(decoded)
    if keep_it:
        await keep(core, owner, items, response)
    return status, _encode(response)
