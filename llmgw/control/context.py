"""What every handler of the API and the admin page can reach: the configuration,
the model service, the scheduler backend and the store.

Litestar injects one ``AppContext`` into any handler that declares a ``ctx``
parameter. Neither face holds state of its own, so any number of instances
can run behind a load balancer: everything here is either configuration, the
catalog in force (rebuilt from configuration and the store), or a view of the
scheduler.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TypeAlias

from litestar.di import NamedDependency

from llmgw.catalog.adapter import Adapter
from llmgw.catalog.model import Model
from llmgw.config import ServerConfig
from llmgw.modelsvc import ModelService
from llmgw.scheduler.base import Control
from llmgw.store.base import Store


@dataclass
class AppContext:
    config: ServerConfig
    models: ModelService
    backend: Control
    store: Store
    # Checks a model's source before it is added; None skips the check.
    source_check: Callable[[Model], Awaitable[None]] | None = None
    # Warnings about a model being added (memory reservations below what a
    # replica needs); never refuses. None: no warnings.
    reservation_check: Callable[[Model], Awaitable[list[str]]] | None = None
    # Checks an adapter's source (reachable, holds adapter_config.json) before it is
    # added; None skips the check.
    adapter_check: Callable[[Adapter], Awaitable[None]] | None = None
    # Adapter → the replicas holding it, from this process's gateway; None: no gateway.
    adapters_loaded: Callable[[], dict[str, list[str]]] | None = None
    # This process's gateway metrics as (name, labels, value) samples, for the admin
    # console's live view: the request counters (readable from any thread) and the
    # figures of the gateway's state (on its event loop only). None: no gateway here.
    gateway_samples: Callable[[], Iterable[tuple[str, dict[str, str], float]]] | None = None
    gateway_state: Callable[[], Iterable[tuple[str, dict[str, str], float]]] | None = None


# How a handler asks for the context: ``async def handler(ctx: Ctx) -> ...``.
Ctx: TypeAlias = NamedDependency[AppContext]
