"""One client connection to ``llmgw serve``: a bounded head, and no client holds it for free.

Everything here happens before the ASGI application sees a request, so it is
unauthenticated: whoever can reach the port can send it. uvicorn (with
httptools) parses requests, and on its own it has no limit on the size of a
request's head — a 64 MiB header is buffered, handed to the application and
forwarded to an engine — and no deadline for a client that opens a
connection and sends nothing, trickles its head, or stops sending its body.
Each of those holds a socket and memory for as long as the client likes, so
a few hundred of them take the server down.

``GuardedProtocol`` is uvicorn's httptools protocol with those bounds added:

* **Head size.** At most ``gateway.max_head_size`` bytes of request line and
  headers are ever handed to the parser before the head is complete; a
  longer head, or one header line over ``gateway.max_header_size``, is
  answered ``431`` and the connection closed. Bytes that follow a complete
  head (the body) are not counted.
* **Deadlines.** A connection that sends nothing for
  ``gateway.keepalive_timeout`` (when it opens, or between requests) is
  closed; a head not complete ``gateway.head_timeout`` after its first byte is
  answered ``408`` and closed; a body that stops arriving for
  ``gateway.body_timeout`` closes the connection (the application sees the
  client disconnect). The body deadline does not run while the application
  has stopped reading (flow control): that wait is ours, not the client's.
  Nothing times the response: a slow reader of a stream is bounded by the
  gateway (``llmgw.gateway.proxy``), not here.
* **Whole body.** A request's body must have arrived ``gateway.body_deadline``
  after its head, however steadily it trickles (the body timeout only catches
  one that stops); past it the connection is closed. As with the body
  timeout, time the application spends not reading does not count.
* **Answered early.** A request answered before its body has arrived — a
  401 for a bad key, a 413 from its Content-Length, any error the gateway
  gives from the head alone — is not read on: the connection drops what
  still comes for at most ``LINGER`` seconds, so the client can read the
  answer rather than a reset, and closes. A client trickling a body behind a
  refused key therefore holds its socket for two seconds, not for as long as
  it trickles.
* **Connections.** Beyond ``gateway.max_connections`` open connections a
  request is answered 503 (uvicorn's ``limit_concurrency``). And one client
  address may hold at most ``gateway.max_unauthenticated_per_client`` open
  connections on which nobody has authenticated (the gateway or the control
  API marks a request whose API key or admin token it accepted:
  ``gateway.request.AUTHENTICATED``); a new one past that is answered 503 and
  closed at once. So a client opening hundreds of sockets with a bogus key
  takes that many slots, not every one: with k addresses an attacker holds at
  most k times the cap. The cap is by address, so clients behind one NAT share
  it; 256 covers a connection pool opening at once.

Rejected: an ASGI middleware. By the time an application is called, the
whole head has been read and parsed into memory, and a client that never
finishes its head never reaches it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from llmgw.config import GatewayConfig
from llmgw.gateway.request import AUTHENTICATED

# How long a refused connection is still read (and what arrives dropped) before it closes.
LINGER = 2.0
# How long a connection idle when the server begins to stop waits for a request
# its client may already have sent on it (answered, then closed).
STOP_GRACE = 2.0


class _HeaderTooLargeError(Exception):
    """Raised from the parser's callback; the parser reports it as a parse error."""


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a bounded head and per-phase deadlines.

    ``limits`` is set on the subclass ``protocol_class`` makes, since uvicorn
    builds each connection's protocol itself.
    """

    limits: GatewayConfig = GatewayConfig()
    # This server's connections by client address (set by ``protocol_class``).
    by_client: dict[str, set[GuardedProtocol]] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        limits = self.limits
        self._max_head = int(limits.max_head_size)
        self._max_line = int(limits.max_header_size)
        self._head_timeout = float(limits.head_timeout)
        self._body_timeout = float(limits.body_timeout)
        self._body_deadline = float(limits.body_deadline)
        self._max_unauthenticated = limits.max_unauthenticated_per_client
        self._address: str | None = None
        self._authenticated = False
        # How many bytes of this request's head were fed to the parser, and
        # when its first byte came; None once the head is complete (and
        # between requests).
        self._head_fed: int | None = None
        self._head_began = 0.0
        # From a complete head until the whole body has arrived: when the
        # body last made progress.
        self._in_body = False
        self._body_seen = 0.0
        # Timers are armed only when a read ends with a head or a body still
        # incomplete: an ordinary request, whole in one read, costs none.
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._refusal: tuple[int, str] | None = None
        self._discarding = False
        self._stopping = False

    # -- connection

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self.client is not None:
            self._address = self.client[0]
            mine = self.by_client.setdefault(self._address, set())
            unauthenticated = sum(1 for p in mine if not p.authenticated())
            mine.add(self)
            if unauthenticated >= self._max_unauthenticated:
                self._refuse_now(503, f"this client address already holds "
                                      f"{unauthenticated} connections that have not "
                                      "authenticated (gateway.max_unauthenticated_per_client)")
                return
        # A connection that sends nothing at all is idle like one between
        # requests; uvicorn starts that clock only after a first response.
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def authenticated(self) -> bool:
        """Whether a caller on this connection proved who it is (latched)."""
        if not self._authenticated:
            scope = getattr(self, "scope", None)
            state = scope.get("state") if isinstance(scope, dict) else None
            self._authenticated = isinstance(state, dict) and bool(state.get(AUTHENTICATED))
        return self._authenticated

    def shutdown(self) -> None:
        """The server is stopping: finish what this connection carries, then close it.

        uvicorn closes a connection idle between requests at once; a request
        its client sent at that moment (it cannot know) then fails with a
        reset, though nothing of it was read. Here an idle connection gets
        ``STOP_GRACE``: a request that arrives meanwhile is answered with
        ``connection: close``, and the connection closes after it or when the
        grace ends. A request under way is answered and the connection closed.
        The listening socket is closed already, so new connections go elsewhere.
        """
        self._stopping = True
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.keep_alive = False
            return
        self.loop.call_later(STOP_GRACE, self._close_if_idle)

    def _close_if_idle(self) -> None:
        cycle = self.cycle
        if (self._head_fed is None and (cycle is None or cycle.response_complete)
                and not self.transport.is_closing()):
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timers()
        if self._address is not None:
            mine = self.by_client.get(self._address)
            if mine is not None:
                mine.discard(self)
                if not mine:
                    del self.by_client[self._address]
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        """An answer sent before its request's body arrived ends the connection: what
        still comes is dropped for ``LINGER`` and the connection closed (see the module)."""
        if self._in_body and not self.transport.is_closing():
            self.server_state.total_requests += 1
            self.authenticated()
            self._linger_close()
            # Read again (uvicorn may have paused it for the application), to drop it.
            self.flow.resume_reading()
            return
        super().on_response_complete()

    def data_received(self, data: bytes) -> None:
        if self._discarding:
            return
        if self._in_body:
            self._body_seen = self.loop.time()
        elif self._head_fed is None:
            self._begin_head()   # the first byte of a request
        self._feed(data)
        if self._discarding or self.transport.is_closing():
            return
        if self._head_fed is not None and self._head_timer is None:
            self._head_timer = self.loop.call_at(self._head_began + self._head_timeout,
                                                 self._head_too_slow)
        if self._in_body and self._body_timer is None:
            self._body_timer = self.loop.call_at(self._body_seen + self._body_timeout,
                                                 self._body_too_slow)

    def _feed(self, data: bytes) -> None:
        if self._head_fed is None:
            super().data_received(data)
            return
        room = self._max_head - self._head_fed
        if len(data) <= room:
            self._head_fed += len(data)
            super().data_received(data)
            return
        # Feed only what the head may still take: if the head completes within
        # it, the rest is body (or the next request) and goes on as usual.
        self._head_fed = self._max_head
        super().data_received(data[:room])
        if self._discarding or self.transport.is_closing():
            return
        if self._head_fed is not None:
            self._refuse(431, f"the request head is over this server's limit of "
                              f"{self._max_head} bytes (gateway.max_head_size)")
            return
        super().data_received(data[room:])

    # -- parser callbacks

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._head_fed is None:
            # A pipelined request begins within bytes already counted for the
            # one before it; its own count starts with the next read.
            self._begin_head()

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(name) + len(value) > self._max_line:
            self._refusal = (431, f"a header line is over this server's limit of "
                                  f"{self._max_line} bytes (gateway.max_header_size)")
            raise _HeaderTooLargeError
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._head_fed = None
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        self._in_body = True
        self._body_seen = self.loop.time()
        self._deadline_timer = self.loop.call_at(self._body_seen + self._body_deadline,
                                                 self._body_past_deadline)
        super().on_headers_complete()
        if self._stopping and self.cycle is not None:
            self.cycle.keep_alive = False

    def on_message_complete(self) -> None:
        self._in_body = False
        for timer in (self._body_timer, self._deadline_timer):
            if timer is not None:
                timer.cancel()
        self._body_timer = self._deadline_timer = None
        if self._discarding:
            return
        super().on_message_complete()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a parse error; the error may be our refusal of a header."""
        if self._refusal is not None:
            status, text = self._refusal
            self._refuse(status, text)
            return
        super().send_400_response(msg)

    # -- deadlines and refusals

    def _begin_head(self) -> None:
        self._head_fed = 0
        self._head_began = self.loop.time()

    def _stop_timers(self) -> None:
        for timer in (self._head_timer, self._body_timer, self._deadline_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._body_timer = self._deadline_timer = None

    def _head_too_slow(self) -> None:
        self._head_timer = None
        if self._head_fed is None or self.transport.is_closing():
            return
        self._refuse(408, f"the request head did not arrive within {self._head_timeout:g} "
                          "s (gateway.head_timeout)")

    def _body_too_slow(self) -> None:
        self._body_timer = None
        if not self._in_body or self.transport.is_closing():
            return
        due = self._body_seen + self._body_timeout
        if self.flow.read_paused or due > self.loop.time():
            # Progress since the timer was set, or the application is not
            # reading (the client is not late): wait on from the last progress.
            if self.flow.read_paused:
                due = self.loop.time() + self._body_timeout
            self._body_timer = self.loop.call_at(due, self._body_too_slow)
            return
        self.logger.info("closing a connection whose request body stopped arriving for %gs "
                         "(gateway.body_timeout)", self._body_timeout)
        self.transport.close()

    def _body_past_deadline(self) -> None:
        self._deadline_timer = None
        if not self._in_body or self.transport.is_closing():
            return
        if self.flow.read_paused:
            # The application is not reading: that wait is not the client's.
            self._deadline_timer = self.loop.call_later(self._body_timeout,
                                                        self._body_past_deadline)
            return
        self.logger.info("closing a connection whose request body was not complete %gs after "
                         "its head (gateway.body_deadline)", self._body_deadline)
        self.transport.close()

    def _linger_close(self) -> None:
        """Stop reading this connection; drop what arrives for ``LINGER``, then close."""
        self._stop_timers()
        self._head_fed = None
        self._in_body = False
        self._discarding = True
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self.loop.call_later(LINGER, self.transport.close)
        else:
            self.transport.close()

    def _refuse_now(self, status: int, text: str) -> None:
        """Answer a connection that has sent nothing yet, and close it at once."""
        self._discarding = True
        body = (text + "\n").encode()
        self.transport.write(b"".join([
            STATUS_LINE[status], b"content-type: text/plain; charset=utf-8\r\n",
            b"content-length: ", str(len(body)).encode(), b"\r\n",
            b"connection: close\r\n\r\n", body]))
        self.transport.close()

    def _refuse(self, status: int, text: str) -> None:
        """Answer ``status`` with ``text`` and close; no application has seen the request.

        The close lingers: what the client is still sending is read and dropped
        for up to ``LINGER`` seconds. Closing a socket with unread data makes
        the kernel reset the connection, and a client that is still writing
        its oversized head would then never read the answer saying why.
        """
        self._stop_timers()
        self._head_fed = None
        self._in_body = False
        self._discarding = True
        body = (text + "\n").encode()
        self.transport.write(b"".join([
            STATUS_LINE[status], b"content-type: text/plain; charset=utf-8\r\n",
            b"content-length: ", str(len(body)).encode(), b"\r\n",
            b"connection: close\r\n\r\n", body]))
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self.loop.call_later(LINGER, self.transport.close)
        else:
            self.transport.close()


def protocol_class(limits: GatewayConfig) -> type[GuardedProtocol]:
    """The protocol class to hand to uvicorn (``http=``) for these limits."""
    return type("GuardedProtocol", (GuardedProtocol,), {"limits": limits, "by_client": {}})


def uvicorn_options(limits: GatewayConfig) -> dict[str, Any]:
    """Every ``uvicorn.Config`` option that bounds connections, from ``gateway:``."""
    return {
        "http": protocol_class(limits),
        "timeout_keep_alive": float(limits.keepalive_timeout),
        "limit_concurrency": limits.max_connections,
    }
