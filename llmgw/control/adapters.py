"""How adapters are shown and added, to the JSON API and the admin page alike.

A view joins the adapter as the catalog holds it, where it came from
(declared in configuration, or added at run time and by whom), its base's
adapter capacity, and which replicas hold it now — the latter read from the
engines by the gateway of this process (``llmgw.gateway.adapters``), so a
process that serves no gateway (``serve --workers``' control process) shows
none.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

import msgspec

from llmgw.catalog.adapter import Adapter, lora_sizes
from llmgw.catalog.source import Source
from llmgw.control.context import AppContext
from llmgw.errors import NotFoundError


class AdapterView(msgspec.Struct, kw_only=True):
    """One LoRA adapter in force."""

    name: str
    base: str
    source: Source
    rank: int | None
    pinned: bool
    description: str
    origin: Literal["declared", "runtime"]
    added_by: str | None = None
    added_at: datetime | None = None
    # The base's capacity: adapter slots on the GPU and the largest rank they take.
    base_slots: int | None = None
    base_max_rank: int | None = None
    # Replicas (base URLs) that have it loaded, as far as this process's gateway knows.
    loaded_on: list[str] = []


def adapter_view(ctx: AppContext, a: Adapter, loaded_on: list[str] | None = None
                 ) -> AdapterView:
    catalog = ctx.models.catalog
    base = catalog.get(a.base)
    sizes = lora_sizes(base, base.profiles[0] if base.profiles else None) \
        if base is not None else None
    row = ctx.models.stored_adapter(a.name)
    return AdapterView(
        name=a.name, base=a.base, source=a.source, rank=a.rank, pinned=a.pinned,
        description=a.description, origin=ctx.models.adapter_origin(a.name),
        added_by=row.added_by if row else None, added_at=row.added_at if row else None,
        base_slots=sizes.slots if sizes else None,
        base_max_rank=sizes.max_rank if sizes else None, loaded_on=loaded_on or [])


def find_adapter(ctx: AppContext, name: str) -> Adapter:
    found = ctx.models.catalog.adapters.get(name)
    if found is None:
        raise NotFoundError(f"there is no adapter named {name!r}; `llmgw ctl adapter list` "
                            "shows the adapters")
    return found


async def add_adapter(ctx: AppContext, adapter: Adapter, by: str, *,
                      check_source: bool = True) -> Adapter:
    """Check the source (unless told not to), then add the adapter; no replica restarts."""
    if check_source and ctx.adapter_check is not None:
        await ctx.adapter_check(adapter)
    return await ctx.models.add_adapter(adapter, by)
