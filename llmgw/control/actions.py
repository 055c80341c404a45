"""What both faces of the control plane change the same way: adding a model, a rollout,
a prefetch.

The JSON API and the admin page call these, so a model added from the page is
checked (and warned about) exactly as one added with ``llmgw ctl model add``,
and a rollout reads the same in both. Every other change is a single call to
the model service, which holds the rules.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Annotated, ClassVar

import msgspec

from llmgw.catalog.fingerprint import fingerprint
from llmgw.catalog.model import Model
from llmgw.control.context import AppContext
from llmgw.control.views import find_model
from llmgw.errors import BackendUnavailableError, NotFoundError, RefusedError
from llmgw.scheduler.base import Prefetch

# A rollout registers one job (or marks local replicas); a minute without an
# answer means the scheduler is not answering, which the caller should hear.
ROLLOUT_TIMEOUT = 60.0


class RolloutAnswer(msgspec.Struct, kw_only=True):
    model: str
    profile: str | None
    fingerprint: str
    message: str


async def roll_out(ctx: AppContext, name: str) -> RolloutAnswer:
    """Roll out a model's current profile; the answer names the profile its new replicas run."""
    m = find_model(ctx, name)
    if m.external:
        raise NotFoundError(f"model {name!r} is external (upstream); there is nothing to roll out")
    try:
        async with asyncio.timeout(ROLLOUT_TIMEOUT):
            profile = await ctx.backend.rollout(name)
    except TimeoutError:
        raise BackendUnavailableError(
            f"the scheduler did not take the rollout of {name!r} within "
            f"{ROLLOUT_TIMEOUT:.0f} s; `llmgw ctl replicas {name}` shows whether it went "
            "ahead, and `/readyz` whether the scheduler is reachable") from None
    chosen = m.profile(profile) if profile else None
    if chosen is None:
        return RolloutAnswer(model=name, fingerprint="", profile=None,
                             message=f"no profile of {name} fits the fleet now; its replicas "
                                     "are replaced once one does")
    fp = fingerprint(m, chosen)
    return RolloutAnswer(model=name, fingerprint=fp, profile=chosen.name,
                         message=f"replicas of {name} are being replaced with profile "
                                 f"{chosen.name} ({fp})")


class PrefetchRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Onto the named nodes (names or IDs), or onto ``count`` nodes the scheduler chooses:
    able to run the model, not holding its weights yet, with room for a replica first.

    One or the other, never both: ``__post_init__`` refuses both as they are decoded,
    and the OpenAPI document states it from ``EXCLUSIVE`` (``llmgw.api.contract``).
    """

    EXCLUSIVE: ClassVar[tuple[str, ...]] = ("nodes", "count")

    nodes: Annotated[list[Annotated[str, msgspec.Meta(min_length=1)]],
                     msgspec.Meta(min_length=1)] | None = None
    count: Annotated[int, msgspec.Meta(ge=1)] | None = None

    def __post_init__(self) -> None:
        given = [f for f in self.EXCLUSIVE if getattr(self, f) is not None]
        if len(given) > 1:
            raise ValueError(f"give {' or '.join(self.EXCLUSIVE)}, not both")


async def start_prefetch(ctx: AppContext, name: str, req: PrefetchRequest) -> Prefetch:
    m = find_model(ctx, name)
    if m.external:
        raise RefusedError(f"model {name!r} is external (upstream); no node holds its weights")
    try:
        async with asyncio.timeout(ROLLOUT_TIMEOUT):
            return await ctx.backend.prefetch(name, nodes=req.nodes, count=req.count)
    except TimeoutError:
        raise BackendUnavailableError(
            f"the scheduler did not take the prefetch of {name!r} within "
            f"{ROLLOUT_TIMEOUT:.0f} s; `llmgw ctl model prefetch {name} --status` shows "
            "whether it went ahead") from None


async def prefetch_progress(ctx: AppContext, name: str) -> Prefetch:
    m = find_model(ctx, name)
    if m.external:
        raise RefusedError(f"model {name!r} is external (upstream); no node holds its weights")
    return await ctx.backend.prefetch_status(name)


@dataclass(frozen=True)
class Added:
    """A model as it is now in force, and what the operator should hear about it."""

    model: Model
    warnings: list[str]


async def add_model(ctx: AppContext, model: Model, by: str, *,
                    check_source: bool = True) -> Added:
    """Check the source (unless told not to), then add, checking the memory reservations
    meanwhile; the model in force and the warnings about it."""
    if check_source and ctx.source_check is not None:
        await ctx.source_check(model)
    check: asyncio.Future[list[str]] | None = (
        asyncio.ensure_future(ctx.reservation_check(model))
        if ctx.reservation_check is not None else None)
    try:
        final = await ctx.models.add(model, by)
    except BaseException:
        if check is not None:
            check.cancel()
        raise
    warnings = await check if check is not None else []
    return Added(model=ctx.models.catalog.get(final.name) or final, warnings=warnings)
