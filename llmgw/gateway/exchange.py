"""What the endpoints beyond chat, completions and embeddings share with the gateway's core.

The Responses API, audio uploads, files and batches each live in their own
module and reach the gateway only through ``Core``, which ``Gateway``
implements: check a key, resolve a model to the chain that may answer,
run a request through the same admission, on-demand hold, retries,
fallbacks, disconnect handling and metrics as any inference request
(``inference``), or run one on behalf of the batch worker (``execute``).
So a new endpoint cannot forget a rule the classic ones obey, and the
gateway's dispatch stays a table of paths.

An ``Exchange`` is the part of one request that differs by endpoint: how
it is admitted (a JSON body, a multipart upload spooled to disk) and how
the answer is shaped on its way to the client (a chat stream translated
into Responses events).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

from llmgw.catalog.build import Catalog
from llmgw.catalog.model import Model
from llmgw.config import ServerConfig
from llmgw.gateway.errors import Receive, Scope, Send
from llmgw.gateway.keys import ApiKey
from llmgw.gateway.metrics import GatewayMetrics, ModelMetrics
from llmgw.gateway.proxy import Body, ForwardRequest
from llmgw.store.base import OwnerId, Store
from llmgw.tenancy import Priority


class Call:
    """What is known about a request so far, for the metrics recorded when it ends."""

    __slots__ = ("accounted", "key", "metrics", "request")

    def __init__(self) -> None:
        # Whether the request's usage record was made (at its answer's last byte).
        self.accounted = False
        self.key: ApiKey | None = None
        self.metrics: ModelMetrics | None = None
        self.request: ForwardRequest | None = None

    def responded(self) -> bool:
        return self.request is not None and self.request.responded


class Executed(NamedTuple):
    """The answer to a request the gateway made itself."""

    status: int
    body: bytes
    model: str | None      # the model that answered (a fallback's name if one did)


class Exchange(Protocol):
    async def admit(self, scope: Scope, receive: Receive, send: Send, started: float,
                    call: Call) -> tuple[ForwardRequest, list[Model], Send]:
        """Every check before forwarding; the request, its chain, and where its answer goes.

        Raises the LlmgwError to answer instead.
        """


class Core(Protocol):
    """The gateway as the endpoints' modules see it."""

    config: ServerConfig
    store: Store
    metrics: GatewayMetrics

    @property
    def catalog(self) -> Catalog: ...

    @property
    def state(self) -> Store:
        """The store, for the stateful endpoints; 503 while it is not open."""

    def authenticate(self, headers: Sequence[tuple[bytes, bytes]]) -> ApiKey:
        """The caller's key (401 if none is valid); no rate limit is charged."""

    def check_key(self, headers: Sequence[tuple[bytes, bytes]], now: float) -> ApiKey:
        """The caller's key, charged one request of its rate limit (401, 429)."""

    def chain_for(self, name: str, key: ApiKey | None, path: str, call: Call) -> list[Model]:
        """The model ``name`` and its fallbacks that can serve ``path`` (404, 403, 400)."""

    async def admit_json(self, scope: Scope, receive: Receive, path: str, started: float,
                         call: Call) -> tuple[ForwardRequest, list[Model]]:
        """The classic admission of a JSON inference request (method, key, body, model)."""

    async def inference(self, scope: Scope, receive: Receive, send: Send, path: str,
                        exchange: Exchange | None = None) -> None:
        """Serve one inference request end to end, ``exchange`` shaping it."""

    async def execute(self, path: str, body: bytes, model: str, *, priority: Priority = "batch",
                      variant: Callable[[Model], tuple[str, Body]] | None = None,
                      owner: OwnerId | None = None) -> Executed:
        """Run one request on behalf of the gateway itself (``variant``: as ForwardRequest's);
        ``owner``: the key it is run for (a batch's), whose usage it is."""

    def now(self) -> float:
        """The gateway's loop clock (monotonic seconds)."""
