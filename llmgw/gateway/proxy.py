"""Forwarding one inference request to a replica, with retries and fallbacks.

The rule that shapes this module: **a request may be retried only until its
first byte reaches the client.** Before that, a refused connection, a 5xx, a
timeout or a replica that dies are all invisible to the client: the next
replica of the model is tried (least outstanding, never one already tried by
this request), then each model of the fallback chain in order (depth-first:
a fallback's own fallbacks before the next one, see ``Catalog.fallback_chain``),
and ``x-llmgw-model`` says
who answered (``x-llmgw-replica`` which replica, by an opaque tag the
admin console can resolve and a client cannot). After it, nothing is
retried; a stream that breaks ends with an SSE ``error`` event in
OpenAI's shape, so a client sees a failure rather than a stream that
merely stops.

To keep that window as wide as possible the response headers are held back
until the first body chunk has arrived: an engine that sends ``200`` and then
dies before its first token is still retried. Holding the headers costs the
client nothing, since it can do nothing with them alone.

Timeouts are per model (``Model.timeouts``): ``connect``; ``first_byte``
from sending the request to the first body chunk (generous by default,
because a long prompt on a busy engine can take minutes); and ``idle``
between chunks once streaming has begun. These bound only the wait for the
replica: while a chunk is being handed to the client the replica's deadline
is off, so a client that reads slowly is never blamed on the replica. A send
to the client that blocks for ``client_send_timeout`` (generous) counts as the
client gone: the upstream request is cancelled and the replica is not
ejected. There is no other timer: nothing kills a stream whose first token is
slow, and nothing bounds a healthy stream's total length.

A replica that failed is ejected (``routing``), but when every replica of
every model of the chain is ejected or has failed, an ejected replica that
this request has not tried gets one last attempt: one unlucky failure of the
only replica must not turn every request into an error for the whole
back-off period.

Event streams (``text/event-stream``) and binary bodies (``audio/*``,
``application/octet-stream``: synthesised speech) pass through chunk by
chunk as the engine sends them. Other responses (JSON) are read whole and
sent in one piece: they are small, the engine produces them at once, and
reading them whole lets a body that breaks half-way still be retried. A
4xx is read whole whatever its type and answered in OpenAI's error shape
with the engine's message (``errors.engine_error_json``): engines each have
their own error dialect, and clients read OpenAI's. (An error event inside
a stream that has begun is passed as the engine wrote it: rewriting it
would mean parsing every event of every stream.)

A request may carry a ``variant``: the path and body to send to each model
of its chain, for requests whose shape depends on the model that answers
(a Responses request is sent as it is to an engine that speaks the
Responses API, and as a chat completion to one that does not; an upload is
re-read from its spool file for every attempt).

The HTTP client is aiohttp (C parser, connection pool); httpx was measured
slower on the same path (see ``bench/gateway_compare.py``).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple, Protocol

import aiohttp
import msgspec

from llmgw.catalog.adapter import Adapter
from llmgw.catalog.model import Model
from llmgw.gateway import requestid
from llmgw.gateway.deadline import Deadline
from llmgw.gateway.dialects import for_llama_cpp, needs_rewrite
from llmgw.gateway.errors import (
    ClientGone,
    Message,
    NoReplicaError,
    Send,
    StreamBrokenError,
    UpstreamError,
    UpstreamTimeoutError,
    engine_error_json,
    sse_error_event,
)
from llmgw.gateway.metrics import GatewayMetrics, ModelMetrics
from llmgw.gateway.prefix import PrefixKey, prefix_key
from llmgw.gateway.resume import Splice, resume_kind
from llmgw.gateway.routing import Balancer
from llmgw.redact import redact_url, replica_tag, scrub
from llmgw.tenancy import Priority

if TYPE_CHECKING:
    from llmgw.gateway.slices import Reservation

log = requestid.tagged(logging.getLogger("llmgw.gateway.proxy"))

# Request headers that describe the client's connection to us, or its
# credentials for llmgw, and must not reach an engine.
_DROP_REQUEST = frozenset({
    b"host", b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding",
    b"upgrade", b"te", b"trailer", b"content-length", b"authorization", b"cookie",
    b"accept-encoding", b"expect", b"proxy-authorization",
})
# Response headers that belong to the engine's connection, or that the gateway
# sets itself (x-request-id: the client's id, which the engine was given too);
# the rest are passed to the client.
_DROP_RESPONSE = frozenset({
    b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"date",
    b"server", b"upgrade", b"trailer", b"proxy-connection", b"x-llmgw-model",
    b"x-request-id",
})
# The longest header line passed to an engine. Engines refuse a request with
# a longer one (aiohttp's max_field_size is 8190, cpp-httplib's header limit
# 8192), and the client would get their 400 for a header llmgw accepted.
MAX_FORWARDED_HEADER = 8000
_ERROR_SNIPPET = 300
# The most of one answer a request log keeps.
CAPTURE_LIMIT = 1024 * 1024


def keep(capture: list[bytes], chunk: bytes) -> None:
    """Append ``chunk`` to a captured answer, up to ``CAPTURE_LIMIT`` bytes in all."""
    room = CAPTURE_LIMIT - sum(len(c) for c in capture)
    if room > 0:
        capture.append(chunk[:room])
# How long one send to the client may block (the client reads nothing) before
# the client is taken as gone. Generous: a client pausing briefly is served.
CLIENT_SEND_TIMEOUT = 120.0


class _PromptDetails(msgspec.Struct):
    cached_tokens: int | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    input_tokens: int = 0          # the Responses API's names for the same counts
    output_tokens: int = 0
    prompt_tokens_details: _PromptDetails | None = None


class _WithUsage(msgspec.Struct):
    usage: _Usage | None = None
    response: _Response | None = None     # a Responses stream event carries it inside


class _Response(msgspec.Struct):
    usage: _Usage | None = None


def _found(found: _WithUsage) -> _Usage | None:
    if found.usage is not None:
        return found.usage
    return found.response.usage if found.response is not None else None


class _TokenCount(msgspec.Struct):
    count: int


_usage_decoder = msgspec.json.Decoder(_WithUsage)
_count_decoder = msgspec.json.Decoder(_TokenCount)
_TOKENIZE_WAIT = 5.0


class Usage(NamedTuple):
    """The token counts of one answer, as its engine reported them."""

    prompt: int
    cached: int
    completion: int


_raw_object = msgspec.json.Decoder(dict[str, msgspec.Raw])
_encode = msgspec.json.Encoder().encode


def rewrite_model(body: bytes, served: str) -> bytes:
    """``body`` with its top-level ``model`` set to ``served``, every other value byte for byte.

    Decoding to ``dict[str, Raw]`` parses only the top level; the other
    values are copied as the client wrote them (numbers keep their spelling,
    nested objects their key order).
    """
    fields = _raw_object.decode(body)
    fields["model"] = msgspec.Raw(_encode(served))
    return _encode(fields)


_targets: dict[tuple[str, str], str] = {}
_connect_timeouts: dict[float, aiohttp.ClientTimeout] = {}


def _connect_timeout(connect: float) -> aiohttp.ClientTimeout:
    """The client timeout of an attempt (the connect bound only), one per distinct value."""
    found = _connect_timeouts.get(connect)
    if found is None:
        if len(_connect_timeouts) > 256:
            _connect_timeouts.clear()
        found = _connect_timeouts[connect] = aiohttp.ClientTimeout(total=None, connect=connect)
    return found


def target_url(base: str, path: str) -> str:
    """The replica URL for ``path`` (``/v1/...``).

    A base URL may or may not end in ``/v1`` (``http://10.0.0.5:8000`` from
    the scheduler, ``https://api.example.com/v1`` in a model's ``upstream``):
    either way the request goes to ``<base without /v1>/v1/...``. A query the
    base carries (``?api-version=…``) is kept after the path.
    """
    key = (base, path)
    url = _targets.get(key)
    if url is None:
        root, _, query = base.partition("?")
        root = root.rstrip("/")
        if root.endswith("/v1"):
            root = root[:-3]
        url = root + path
        if query:
            url += ("&" if "?" in path else "?") + query
        if len(_targets) > 4096:
            _targets.clear()
        _targets[key] = url
    return url


class StreamUsage:
    """Finds the usage object in an SSE stream without parsing every event.

    Only complete lines are examined, and only those that mention
    ``"usage"``; the last usage seen wins (an engine reporting cumulative
    usage on every chunk ends with the total).
    """

    __slots__ = ("tail", "usage")

    def __init__(self) -> None:
        self.tail = b""
        self.usage: _Usage | None = None

    def feed(self, chunk: bytes) -> None:
        data = self.tail + chunk if self.tail else chunk
        end = data.rfind(b"\n")
        if end < 0:
            self.tail = data[-65536:]
            return
        self.tail = data[end + 1:][-65536:]
        if data.find(b'"usage"', 0, end) < 0:
            return
        for line in data[:end].split(b"\n"):
            if line.startswith(b"data:") and b'"usage"' in line:
                try:
                    found = _usage_decoder.decode(line[5:])
                except (msgspec.DecodeError, msgspec.ValidationError):
                    continue
                if (usage := _found(found)) is not None:
                    self.usage = usage


class _UsageOnly(msgspec.Struct):
    choices: list[object] | None = None
    usage: dict[str, object] | None = None


_usage_only = msgspec.json.Decoder(_UsageOnly)


class UsageChunkFilter:
    """Drops the usage-only chunk (``choices: []`` with ``usage``) from an SSE stream.

    For streams where the gateway asked for usage and the client did not: the
    client gets the stream it asked for. Whole events pass as soon as their
    blank line arrives; only an unfinished event is held back.
    """

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held = b""

    @property
    def tail(self) -> bytes:
        """What is left at the end of the stream (an event without its blank line)."""
        held, self._held = self._held, b""
        return held

    def feed(self, chunk: bytes) -> bytes:
        data = self._held + chunk if self._held else chunk
        end = data.rfind(b"\n\n")
        if end < 0:
            self._held = data
            return b""
        end += 2
        self._held = data[end:]
        whole = data[:end]
        if b'"usage"' not in whole:
            return whole
        kept = [e for e in whole.split(b"\n\n") if not _is_usage_only(e)]
        return b"\n\n".join(kept)


def _is_usage_only(event: bytes) -> bool:
    if b'"usage"' not in event:
        return False
    for line in event.split(b"\n"):
        if line.startswith(b"data:"):
            try:
                found = _usage_only.decode(line[5:])
            except (msgspec.DecodeError, msgspec.ValidationError):
                return False
            return found.choices == [] and found.usage is not None
    return False


# Responses passed to the client as they arrive rather than read whole.
_STREAMED = ("text/event-stream", "audio/", "application/octet-stream")

Body = bytes | AsyncIterable[bytes]


@dataclass(slots=True)
class ForwardRequest:
    """What the gateway learned from the client's request."""

    path: str
    body: bytes
    model: str                      # the ``model`` value as the client sent it
    stream: bool
    headers: list[tuple[bytes, bytes]]
    started: float                  # loop time of arrival
    metrics: ModelMetrics
    bodies: dict[str, bytes] = field(default_factory=dict)   # body per served name
    responded: bool = False         # the response has started: nothing can be retried
    # The admission class: "interactive" (clients, or the key's class) or "batch"
    # (the batch worker's lines), which orders requests waiting for a replica.
    priority: Priority = "interactive"
    # Its team and estimated tokens: its turn among the teams of its class when queued.
    team: str = ""
    cost: float = 1.0
    # (path, body) for each model of the chain, when they differ by model.
    variant: Callable[[Model], tuple[str, Body]] | None = None
    keys: dict[int, PrefixKey | None] | None = None  # per prefix_bytes, made when asked
    # What the ledger records of the attempt that answered.
    served_by: Model | None = None
    replica: str = ""
    usage: Usage | None = None
    ttft: float | None = None
    # The gateway asked for the usage chunk the client did not: it is not passed on.
    strip_usage: bool = False
    # The answer as sent to the client, for a team that logs bodies (None: not kept).
    capture: list[bytes] | None = None
    splice: Splice | None = None    # a resumable stream under way (``llmgw.gateway.resume``)
    # The LoRA adapter the client asked for, served on the chain's one model (its base).
    adapter: Adapter | None = None
    # Its tokens held on its key's budget slices until it is accounted (``slices``).
    reservation: Reservation | None = None

    def prefix_key(self, prefix_bytes: int) -> PrefixKey | None:
        """The request's prefix key (``llmgw.gateway.prefix``), computed once."""
        if self.keys is None:
            self.keys = {}
        if prefix_bytes not in self.keys:
            self.keys[prefix_bytes] = prefix_key(self.body, prefix_bytes)
        return self.keys[prefix_bytes]


@dataclass(slots=True)
class _Failure:
    reason: str          # metric label: connect, timeout, status_5xx, broken
    detail: str


@dataclass(slots=True)
class _Broken:
    """A resumable stream broke after it started: the caller asks another replica to continue."""

    reason: str          # metric label: stream_broken, idle_timeout
    message: str


def upstream_headers(headers: Sequence[tuple[bytes, bytes]],
                     engine: str | None = None) -> dict[str, str]:
    """The client's headers an engine may see: none of this hop's, none it would refuse.

    ``x-request-id`` by engine: vLLM is sent the id the client is answered with
    (it takes any string as its request id with ``--enable-request-id-headers``);
    llama.cpp none, because llama-cpp-python refuses one that is not a UUID with
    an empty 400 (``llama_cpp/server/app.py`` installs starlette_context's
    ``RequestIdPlugin``, which validates it); an engine of unknown dialect what the
    client sent, as before the gateway had ids of its own.
    """
    hop = _DROP_REQUEST
    for n, v in headers:
        if n == b"connection":
            # Headers the client named in Connection are of this hop too (RFC 9110 7.6.1).
            hop = hop | {t.strip().lower() for t in v.split(b",")}
    out = {n.decode("latin-1"): v.decode("latin-1") for n, v in headers
           if n not in hop and not n.startswith(b"x-llmgw-")
           and len(n) + len(v) <= MAX_FORWARDED_HEADER}
    out.setdefault("content-type", "application/json")
    # Compressed bodies could not be read for usage, and the client did not
    # necessarily ask for them.
    out["accept-encoding"] = "identity"
    if engine == "vllm":
        rid = requestid.current.get()
        if rid is not None:
            out["x-request-id"] = rid.decode("ascii")
    elif engine == "llama.cpp":
        out.pop("x-request-id", None)
    return out


class Activity(Protocol):
    """Told when an attempt on a model starts and ends (on-demand models' in-flight count)."""

    def begin(self, model: Model) -> None: ...

    def end(self, model: Model) -> None: ...


class Placer(Protocol):
    """Chooses the replica for an adapter request and loads the adapter there
    (``llmgw.gateway.adapters``)."""

    async def place(self, req: ForwardRequest, model: Model, urls: Sequence[str],
                    tried: set[str]) -> str | None: ...

    def missing(self, url: str, adapter: str) -> None: ...

    def begin(self, url: str, adapter: str) -> None: ...

    def end(self, url: str, adapter: str) -> None: ...


class Forwarder:
    """Sends requests to replicas; owns the upstream connection pool."""

    # Set by the gateway when adapters are served: an adapter request's replica is its.
    placer: Placer | None = None

    def __init__(
        self,
        balancer: Balancer,
        metrics: GatewayMetrics,
        replicas: Callable[[Model], list[str]],
        max_attempts: int,
        clock: Callable[[], float],
        activity: Activity | None = None,
        client_send_timeout: float = CLIENT_SEND_TIMEOUT,
        tag_key: bytes = b"",
    ) -> None:
        self.balancer = balancer
        # x-llmgw-replica: each replica's opaque tag (``redact.replica_tag``), made once.
        self._tag_key = tag_key
        self._tags: dict[str, bytes] = {}
        self.metrics = metrics
        self.replicas = replicas
        self.max_attempts = max(1, max_attempts)
        self.clock = clock
        self.activity = activity
        self.client_send_timeout = client_send_timeout
        self._session: aiohttp.ClientSession | None = None

    def _tag_of(self, url: str) -> bytes:
        tag = self._tags.get(url)
        if tag is None:
            if len(self._tags) > 4096:   # replicas come and go (new ports): bounded
                self._tags.clear()
            tag = self._tags[url] = replica_tag(url, self._tag_key).encode()
        return tag

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit=0,  # no cap: one connection per request in flight, as engines expect
                # Below the 5 s keep-alive of uvicorn (vLLM, llama-cpp-python): a
                # connection the engine may be closing is never reused, so a
                # healthy replica is not ejected for a race on an idle socket.
                keepalive_timeout=4.0,
                ttl_dns_cache=10,
            )
            self._session = aiohttp.ClientSession(
                connector=connector, auto_decompress=False, skip_auto_headers=("User-Agent",),
                timeout=aiohttp.ClientTimeout(total=None), cookie_jar=aiohttp.DummyCookieJar(),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def body_for(self, req: ForwardRequest, model: Model) -> bytes:
        # vLLM selects an adapter by its name in ``model`` (its lora_name).
        served = req.adapter.name if req.adapter is not None else model.engine_model_name
        if needs_rewrite(model.dialect, req.path, req.body):
            key = f"{served}\0{model.dialect}"
            body = req.bodies.get(key)
            if body is None:
                body = req.bodies[key] = for_llama_cpp(req.body, served)
            return body
        if served == req.model:
            return req.body
        body = req.bodies.get(served)
        if body is None:
            body = req.bodies[served] = rewrite_model(req.body, served)
        return body

    async def forward(self, req: ForwardRequest, chain: Sequence[Model], send: Send) -> int:
        """Answer ``req`` from the first model of ``chain`` that can; returns the status sent.

        ``chain`` is the requested model followed by its fallback chain.
        Raises an LlmgwError (nothing has been sent) when no replica of any of
        them answered.
        """
        failures: list[str] = []
        reasons: list[str] = []
        back_in: float | None = None
        requested = chain[0].name
        untried: list[Model] = []
        for index, model in enumerate(chain):
            urls = self.replicas(model)
            tried: set[str] = set()
            routing = model.routing
            # With one replica there is nothing to choose: the prompt is not read.
            key = (req.prefix_key(routing.prefix_bytes)
                   if routing.policy == "prefix-affinity" and len(urls) > 1 else None)
            while len(tried) < self.max_attempts:
                if req.adapter is not None and self.placer is not None:
                    url = await self.placer.place(req, model, urls, tried)
                else:
                    url = self.balancer.pick(urls, self.clock(), tried, policy=routing.policy,
                                             key=key, load_factor=routing.load_factor)
                if url is None:
                    break
                if tried:
                    self.metrics.retries.labels(model.name).inc()
                elif index > 0:
                    self.metrics.fallbacks.labels(requested, model.name).inc()
                tried.add(url)
                status = await self._try(url, model, req, send, failures, reasons)
                if status is not None:
                    return status
                urls = self.replicas(model)
            if not tried:
                untried.append(model)
            wait = self.balancer.back_in(urls, self.clock())
            if wait is not None:
                back_in = wait if back_in is None else min(back_in, wait)
        # Last resort: an ejected replica of a model nothing was tried on.
        for model in untried:
            url = self.balancer.choose_ejected(self.replicas(model), self.clock())
            if url is None:
                continue
            if model is not chain[0]:
                self.metrics.fallbacks.labels(requested, model.name).inc()
            elif failures:
                self.metrics.retries.labels(model.name).inc()
            status = await self._try(url, model, req, send, failures, reasons)
            if status is not None:
                return status
        names = " or ".join(repr(m.name) for m in chain)
        if failures:
            shown = "; ".join(failures[:6]) + (" …" if len(failures) > 6 else "")
            timeouts_only = all(r == "timeout" for r in reasons)
            cls = UpstreamTimeoutError if timeouts_only else UpstreamError
            raise cls(f"no replica of {names} answered: {shown}")
        raise NoReplicaError(
            f"no replica of {names} can take requests now"
            + (" (all are held out after failures)" if back_in is not None else
               " (none is running and healthy)"),
            retry_after=back_in if back_in is not None else 5.0,
        )

    async def _try(self, url: str, model: Model, req: ForwardRequest, send: Send,
                   failures: list[str], reasons: list[str]) -> int | None:
        """One attempt; the status sent, or None with the failure recorded."""
        activity = self.activity
        if activity is not None:
            activity.begin(model)
        placer = self.placer if req.adapter is not None else None
        if placer is not None and req.adapter is not None:
            placer.begin(url, req.adapter.name)
        try:
            outcome = await self._attempt(url, model, req, send)
        finally:
            if activity is not None:
                activity.end(model)
            if placer is not None and req.adapter is not None:
                placer.end(url, req.adapter.name)
        if isinstance(outcome, int):
            return outcome
        if isinstance(outcome, _Broken):
            return await self._resume(url, model, req, send, outcome)
        self.metrics.upstream_errors.labels(model.name, outcome.reason).inc()
        # A tenant reads this in the 502: never an upstream's credentials (``redact``).
        failures.append(scrub(f"{model.name} at {redact_url(url)}: {outcome.detail}", (url,)))
        reasons.append(outcome.reason)
        return None

    async def _resume(self, broken_url: str, model: Model, req: ForwardRequest, send: Send,
                      broken: _Broken) -> int:
        """Continue a broken stream on other replicas of ``model``, never another model.

        Each break is resumed up to the model's ``routing.resume_streams``
        times; each resumption tries up to ``max_attempts`` replicas, not
        the one that broke. What cannot be continued ends with the error
        event a broken stream always ended with.
        """
        splice = req.splice
        assert splice is not None
        tried = {broken_url}
        routing = model.routing
        counted = 0      # pieces of text whose tokens the engine counted
        while True:
            self.metrics.upstream_errors.labels(model.name, broken.reason).inc()
            log.info("stream of a request for %r broke (%s); resuming it", req.model,
                     broken.message)
            if splice.done or splice.finish is not None or \
                    splice.budget_spent(self.body_for(req, model)):
                # Nothing was left to generate: only the stream's end was lost.
                await self._sender(send)({"type": "http.response.body",
                                          "body": splice.ending(), "more_body": True})
                await self._sender(send)({"type": "http.response.body", "body": b""})
                self.metrics.resumed.labels(model.name).inc()
                return 200
            splice.begin_continuation()
            outcome: int | _Failure | _Broken | None = None
            attempts = 0
            while attempts < self.max_attempts:
                urls = self.replicas(model)
                key = (req.prefix_key(routing.prefix_bytes)
                       if routing.policy == "prefix-affinity" and len(urls) > 1 else None)
                if req.adapter is not None and self.placer is not None:
                    url = await self.placer.place(req, model, urls, tried)
                else:
                    url = self.balancer.pick(urls, self.clock(), tried, policy=routing.policy,
                                             key=key, load_factor=routing.load_factor)
                if url is None:
                    break
                tried.add(url)
                attempts += 1
                if model.speaks.tokenize and splice.text and counted != len(splice.text):
                    counted = len(splice.text)
                    tokens = await self._token_count(url, model, "".join(splice.text))
                    if tokens is not None:
                        splice.counted(tokens)
                activity = self.activity
                if activity is not None:
                    activity.begin(model)
                try:
                    outcome = await self._attempt(url, model, req, send)
                finally:
                    if activity is not None:
                        activity.end(model)
                if isinstance(outcome, _Failure):
                    self.metrics.upstream_errors.labels(model.name, outcome.reason).inc()
                    broken = _Broken(broken.reason, scrub(
                        f"{broken.message}; resuming on {redact_url(url)} failed: "
                        f"{outcome.detail}", (url,)))
                    continue
                self.metrics.resumed.labels(model.name).inc()
                break
            if isinstance(outcome, int):
                return outcome
            if isinstance(outcome, _Broken):
                broken = outcome
                continue
            await self._broken(send, model, req, broken.message, None, why="no_replica")
            return 200

    async def _token_count(self, url: str, model: Model, text: str) -> int | None:
        """The tokens of ``text`` by the engine's ``/tokenize`` on ``url`` (vLLM's and SGLang's
        take and answer the same fields); None if it cannot say.

        Bounded by the model's connect timeout plus a few seconds: tokenizing
        is quick, and without the count the resumption still goes on.
        """
        body = _encode({"model": model.engine_model_name, "prompt": text,
                        "add_special_tokens": False})
        try:
            async with asyncio.timeout(float(model.timeouts.connect) + _TOKENIZE_WAIT):
                resp = await self._client().post(
                    target_url(url, "/tokenize"), data=body,
                    headers={"content-type": "application/json"})
                async with resp:
                    if resp.status != 200:
                        return None
                    data = await resp.read()
            return _count_decoder.decode(data).count
        except (aiohttp.ClientError, OSError, TimeoutError, msgspec.DecodeError,
                msgspec.ValidationError):
            return None

    async def _attempt(self, url: str, model: Model, req: ForwardRequest,
                       send: Send) -> int | _Failure | _Broken:
        t = model.timeouts
        connect, first_byte, idle = t.connect, t.first_byte, t.idle
        loop = asyncio.get_running_loop()
        session = self._client()
        body: Body
        splice = req.splice
        continuing = splice is not None and splice.continuing
        if req.variant is None:
            path, body = req.path, self.body_for(req, model)
            if continuing:
                assert splice is not None
                body = splice.continuation(body)
        else:
            path, body = req.variant(model)
        sent = False
        resp: aiohttp.ClientResponse | None = None
        headers_out = upstream_headers(req.headers, model.engine)
        if model.upstream_auth is not None:
            auth = model.upstream_auth
            secret = os.environ.get(auth.env)
            if not secret:
                return _Failure("upstream_auth", f"upstream_auth names the environment "
                                f"variable {auth.env}, which is not set on this gateway")
            headers_out[auth.header] = auth.prefix + secret
        self.balancer.acquire(url)
        answered = False
        try:
            async with Deadline(first_byte) as deadline:
                try:
                    resp = await session.post(
                        target_url(url, path), data=body,
                        headers=headers_out, timeout=_connect_timeout(connect),
                    )
                    status = resp.status
                    if status >= 500:
                        snippet = await resp.content.read(_ERROR_SNIPPET)
                        self.balancer.failed(url, self.clock())
                        text = snippet.decode("utf-8", "replace").strip()
                        return _Failure("status_5xx", f"HTTP {status}: {text}"[:_ERROR_SNIPPET])
                    if status == 404 and req.adapter is not None and self.placer is not None:
                        # The adapter is not loaded there (evicted since it was read):
                        # another replica, or a load, answers instead.
                        self.placer.missing(url, req.adapter.name)
                        return _Failure("adapter_missing", f"HTTP 404: adapter "
                                        f"{req.adapter.name!r} is not loaded there")
                    headers = [(n.lower(), v) for n, v in resp.raw_headers
                               if n.lower() not in _DROP_RESPONSE]
                    headers.append((b"x-llmgw-model", model.name.encode()))
                    headers.append((b"x-llmgw-replica", self._tag_of(url)))
                    req.served_by, req.replica = model, url
                    ctype = resp.headers.get("content-type", "")
                    events = ctype.startswith("text/event-stream")
                    if continuing and (status != 200 or not events):
                        # The client has its answer's start: only a stream can follow it.
                        snippet = await resp.content.read(_ERROR_SNIPPET)
                        text = snippet.decode("utf-8", "replace").strip()
                        return _Failure("resume_refused",
                                        f"HTTP {status}: {text}"[:_ERROR_SNIPPET])
                    if ctype.startswith(_STREAMED) and status < 400:
                        to_client = self._sender(send)
                        chunk = await resp.content.readany()
                        self.balancer.succeeded(url)
                        answered = True
                        deadline.reschedule(None)   # the client's pace is not the replica's
                        if not continuing:
                            await to_client({"type": "http.response.start", "status": status,
                                             "headers": headers})
                            if status == 200 and events:
                                splice = req.splice = self._splice_for(req, model)
                        sent = req.responded = True
                        await self._stream(req, model, resp, chunk, to_client, deadline, idle,
                                           loop, events, splice)
                    else:
                        if not resp.content.is_eof():     # else the body is all here
                            deadline.reschedule(loop.time() + idle)
                        data = await resp.read()
                        self.balancer.succeeded(url)
                        answered = True
                        deadline.reschedule(None)
                        if status >= 400:
                            data = engine_error_json(status, data)
                            headers = [(n, v) for n, v in headers if n != b"content-type"]
                            headers.append((b"content-type", b"application/json"))
                        headers.append((b"content-length", str(len(data)).encode()))
                        # Read before the answer ends: its end is where the ledger records it.
                        if req.capture is not None:
                            req.capture.append(data[:CAPTURE_LIMIT])
                        if status == 200 and ctype.startswith("application/json"):
                            self._count_usage(model, data, req)
                        sent = req.responded = True
                        await self._to_client(
                            send, {"type": "http.response.start", "status": status,
                                   "headers": headers},
                            {"type": "http.response.body", "body": data})
                    return status
                except (aiohttp.ClientError, OSError) as exc:
                    self.balancer.failed(url, self.clock())
                    if sent:
                        deadline.reschedule(None)   # telling the client is not the replica's wait
                        message = f"the replica's stream broke: {_describe(exc)}"
                        if splice is not None and splice.resumable:
                            return _Broken("stream_broken", message)
                        await self._broken(send, model, req, message, "stream_broken")
                        return status
                    reason = "connect" if isinstance(exc, aiohttp.ClientConnectorError) else \
                        "broken"
                    if isinstance(exc, aiohttp.ConnectionTimeoutError):
                        reason = "timeout"
                    return _Failure(reason, _describe(exc))
        except TimeoutError:
            self.balancer.failed(url, self.clock())
            if sent:
                message = (f"the replica sent nothing for {idle:g} s "
                           f"(timeouts.idle of model {model.name!r})")
                if splice is not None and splice.resumable:
                    return _Broken("idle_timeout", message)
                await self._broken(send, model, req, message, "idle_timeout")
                return status
            return _Failure("timeout", f"no response within {first_byte:g} s "
                            f"(timeouts.first_byte of model {model.name!r})")
        finally:
            self.balancer.release(url, awaiting=not answered)
            if resp is not None:
                resp.close()

    def _splice_for(self, req: ForwardRequest, model: Model) -> Splice | None:
        """A splice for a stream that could be resumed if it broke, else None."""
        limit = model.routing.resume_streams
        if not req.stream or limit <= 0 or req.variant is not None:
            return None
        kind = resume_kind(req.path, req.body, model.dialect)
        return None if kind is None else Splice(kind, limit, model.dialect)

    async def _stream(self, req: ForwardRequest, model: Model, resp: aiohttp.ClientResponse,
                      chunk: bytes, to_client: Send, deadline: Deadline, idle: float,
                      loop: asyncio.AbstractEventLoop, events: bool,
                      splice: Splice | None = None) -> None:
        """Pass the stream on; ``deadline`` is armed only while reading from the replica.

        A resumable stream (``splice``) is passed on whole events at a time,
        and one that ends before its last event counts as broken.
        """
        usage = StreamUsage() if events else None
        strip = UsageChunkFilter() if events and req.strip_usage else None
        content = resp.content
        if chunk and (splice is None or not splice.continuing):
            req.ttft = loop.time() - req.started
            req.metrics.ttft.observe(req.ttft)
        while chunk:
            if splice is not None:
                chunk = splice.feed(chunk)
            if usage is not None:
                usage.feed(chunk)
            if strip is not None:
                chunk = strip.feed(chunk)
            if chunk:
                await to_client({"type": "http.response.body", "body": chunk,
                                 "more_body": True})
                if req.capture is not None:
                    keep(req.capture, chunk)
            deadline.reschedule(loop.time() + idle)
            chunk = await content.readany()
            deadline.reschedule(None)
        if splice is not None and not splice.done:
            raise aiohttp.ClientPayloadError("the stream ended before its last event")
        # Counted before the stream ends: its end is where the ledger records it.
        if usage is not None and usage.usage is not None:
            self._add_tokens(model, usage.usage, req)
        await to_client({"type": "http.response.body",
                         "body": strip.tail if strip is not None else b""})

    async def _broken(self, send: Send, model: Model, req: ForwardRequest, message: str,
                      reason: str | None, why: str | None = None) -> None:
        """End a stream that broke after it started: an error event, then the end.

        ``reason``: the upstream error to count (None: counted already);
        ``why``: why it was not resumed, if the stream was resumable at all.
        """
        if reason is not None:
            self.metrics.upstream_errors.labels(model.name, reason).inc()
        splice = req.splice
        if why is None:
            why = "not_resumable" if splice is None else splice.why_not
        self.metrics.unrecoverable.labels(model.name, why).inc()
        log.warning("stream of a request for %r broke: %s", req.model, message)
        event = sse_error_event(StreamBrokenError(f"model {model.name!r}: {message}"))
        await self._to_client(send,
                              {"type": "http.response.body", "body": event, "more_body": True},
                              {"type": "http.response.body", "body": b""})

    def _sender(self, send: Send) -> Send:
        """``send`` bounded by ``client_send_timeout``; any failure of it is ClientGone."""

        async def to_client(message: Message) -> None:
            await self._to_client(send, message)

        return to_client

    async def _to_client(self, send: Send, *messages: Message) -> None:
        """``messages`` sent in turn, within ``client_send_timeout`` together (a whole
        answer's head and body take one deadline); any failure is ClientGone."""
        limit = self.client_send_timeout
        try:
            async with Deadline(limit):
                for message in messages:
                    await send(message)
        except TimeoutError:
            raise ClientGone(f"the client read nothing for {limit:g} s") from None
        except Exception as exc:
            raise ClientGone(str(exc)) from exc

    def _count_usage(self, model: Model, data: bytes, req: ForwardRequest) -> None:
        try:
            found = _usage_decoder.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return
        if (usage := _found(found)) is not None:
            self._add_tokens(model, usage, req)

    def _add_tokens(self, model: Model, usage: _Usage, req: ForwardRequest) -> None:
        mm = self.metrics.for_model(model.name)
        prompt = max(0, usage.prompt_tokens or usage.input_tokens)
        completion = max(0, usage.completion_tokens or usage.output_tokens)
        details = usage.prompt_tokens_details
        cached = max(0, details.cached_tokens or 0) if details is not None else 0
        req.usage = Usage(prompt, cached, completion)
        if prompt > 0:
            mm.tokens_prompt.inc(prompt)
        if completion > 0:
            mm.tokens_completion.inc(completion)
        if cached:
            mm.tokens_cached.inc(cached)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"cannot connect: {exc.os_error.strerror or exc.os_error}"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "the replica closed the connection before answering"
    return str(exc) or type(exc).__name__

