"""The catalog in force: the models declared in configuration, plus the ones
added while the cluster runs.

Two sources rather than one, deliberately. Configuration stays declarative — a
model in server.yaml is in the catalog on every start, whatever the database
says — because that is how a team keeps its production set under review. The
database holds what someone added afterwards, so trying a model needs no
config change, restart or outage.

**Configuration wins every conflict**, and the surprising direction is the
dangerous one: a request for a reviewed production model must never be
answered by something added from a laptop. A stored model colliding with a
declared name is refused when it is added and skipped (with a warning naming
it) if it somehow reaches the database. Declared models cannot be removed,
scaled or resized here either: the YAML is read on every start, so the change
would silently revert, and a cluster disagreeing with its own config file is
worse than an error saying where to edit.

Every change builds and validates the whole next catalog before anything is
written, inside the store's catalog lock, so a refused change
persists nothing and two changes from two processes apply in the order the
database records. After a change, and whenever another process bumps the
catalog version, the catalog in force is rebuilt from configuration plus the
store — the database is the record, this process only follows it.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Literal

import msgspec

from llmgw import adaptersvc
from llmgw.catalog.adapter import Adapter
from llmgw.catalog.build import (
    Catalog,
    Provenance,
    Runtime,
    build_catalog,
    check_model,
    dependants,
)
from llmgw.catalog.decode import decode_json, encode
from llmgw.catalog.model import GpuClass, Model, Profile, Scaling
from llmgw.catalog.units import Size
from llmgw.errors import DefinitionError, NotFoundError, RefusedError, StoreUnavailableError
from llmgw.store.base import Store, StoredModel

log = logging.getLogger("llmgw.models")

# How long a read of the catalog version may go unanswered before readiness
# says the store is unreachable (the read is repeated about twice a second).
STORE_SILENCE = 3.0

Origin = Literal["declared", "runtime"]
Listener = Callable[[Catalog], Awaitable[None] | None]
PlacementCheck = Callable[[Model, Catalog], Awaitable[None]]



def provenance(rows: Mapping[str, StoredModel]) -> dict[str, Provenance]:
    """The runtime models in force and who added each (the rest are declared)."""
    return {name: Provenance(origin="runtime", added_by=row.added_by)
            for name, row in rows.items()}


def rescaled(name: str, current: Scaling, min_: int, max_: int | None) -> Scaling:
    """The scaling after asking for ``min_`` (and ``max_``, when given) replicas.

    Changing the minimum keeps the maximum in force: a model scaling between 1
    and 4 asked for min 2 scales between 2 and 4. Setting ``max`` to the new
    minimum instead would end its autoscaling without a word, which is what a
    form or a ``ctl scale --min`` that leaves max out used to do. A maximum
    that was never set follows the minimum, as it always has (so a model run
    at a fixed count stays fixed at the new one). A minimum above the maximum
    in force is refused with both numbers, not silently widened: raising the
    maximum spends GPUs, so it is asked for, never inferred.
    """
    if max_ is None:
        if current.max is not None and current.max < min_:
            raise DefinitionError(
                f"model {name!r}: min {min_} is above its max {current.max} in force; give "
                f"max {min_} or more with it (changing min keeps the max)", field="min")
        max_ = current.max
    elif max_ < min_:
        raise DefinitionError(
            f"model {name!r}: max {max_} is below min {min_}; give max {min_} or more, or a "
            f"lower min", field="max")
    return msgspec.structs.replace(current, min=min_, max=max_)


class ModelService:
    """Adds, removes, scales and resizes models without a restart."""

    def __init__(
        self,
        declared: Sequence[Model],
        gpu_classes: dict[str, GpuClass],
        store: Store,
        *,
        placement_check: PlacementCheck | None = None,
        config_name: str = "server.yaml",
        runtime: Runtime | None = None,
        declared_adapters: Sequence[Adapter] = (),
    ) -> None:
        self._declared = list(declared)
        self._declared_adapters = list(declared_adapters)
        self._declared_adapter_index = {a.name: i for i, a in enumerate(declared_adapters)}
        self._runtime = runtime or Runtime()
        self._declared_index = {m.name: i for i, m in enumerate(self._declared)}
        self._gpu_classes = gpu_classes
        self._store = store
        self._placement_check = placement_check
        self._config_name = config_name
        self._catalog = build_catalog(self._declared, gpu_classes, self._runtime,
                                      adapters=self._declared_adapters)
        self._rows: dict[str, StoredModel] = {}
        self._adapter_rows: dict[str, StoredModel] = {}
        self._version = -1
        self._listeners: list[Listener] = []
        self._reload_lock = asyncio.Lock()
        self.skipped: dict[str, str] = {}
        self.store_error: str | None = None
        self._asking_since: float | None = None

    # -- reading -----------------------------------------------------------

    @property
    def catalog(self) -> Catalog:
        """The catalog in force. Reads never touch the store."""
        return self._catalog

    @property
    def version(self) -> int:
        return self._version

    def store_problem(self) -> str | None:
        """Why the store cannot be used now, or None.

        Besides the last error, a poll of the store left unanswered for
        ``STORE_SILENCE`` seconds counts: a connection whose packets are
        dropped raises nothing until the query timeout (and psycopg's attempt
        to cancel) has passed, and readiness should not say ``ok`` meanwhile.
        """
        if self.store_error is not None:
            return self.store_error
        since = self._asking_since
        if since is not None and (silent := time.monotonic() - since) > STORE_SILENCE:
            return (f"the store has not answered a read of the catalog version for "
                    f"{silent:.0f} s; check that the database is up and the network to it")
        return None

    @property
    def complete(self) -> bool:
        """Whether the catalog in force includes the store's models (it was read once)."""
        return self._version >= 0

    def origin(self, name: str) -> Origin:
        return "declared" if name in self._declared_index else "runtime"

    def stored(self, name: str) -> StoredModel | None:
        """The store row behind a runtime model in force (who added it, and when)."""
        return self._rows.get(name) if name not in self._declared_index else None

    def subscribe(self, listener: Listener) -> None:
        """Call ``listener`` with every new catalog put in force."""
        self._listeners.append(listener)

    # -- building ----------------------------------------------------------

    def _decode(self, row: StoredModel, skipped: dict[str, str]) -> Model | None:
        """The row's model, or None with the reason in ``skipped``."""
        try:
            model = decode_json(row.definition, Model, source=f"stored model {row.name!r}")
        except DefinitionError as exc:
            skipped[row.name] = f"it cannot be decoded: {exc}"
            return None
        if model.name != row.name:
            skipped[row.name] = f"its definition is named {model.name!r}"
            return None
        return model

    def _assemble(self, rows: Sequence[StoredModel], skipped: dict[str, str] | None = None,
                  ) -> tuple[list[Model], dict[str, StoredModel]]:
        """Declared models, plus every stored one that makes a valid catalog with them.

        One bad row is skipped and named rather than taking the cluster with
        it; the declared models are precisely the ones that must survive that.
        Each stored model is first checked on its own; then models whose
        fallbacks are missing are dropped until none is, since dropping one can
        orphan another that falls back to it. Checking rows one at a time in
        some order instead would wrongly skip a model whose fallback merely
        comes later in that order.

        The rows skipped, and why, go to ``skipped``: only the catalog put in
        force says which models are skipped (``load``); the trial assemblies
        of a change, refused or not, say nothing about the catalog in force.
        """
        if skipped is None:
            skipped = {}
        candidates: dict[str, tuple[Model, StoredModel]] = {}
        for row in sorted(adaptersvc.model_rows(rows), key=lambda r: r.name):
            if row.name in self._declared_index:
                skipped[row.name] = (f"a model of that name is declared in {self._config_name}, "
                                     "and configuration wins; remove the stored one")
                continue
            model = self._decode(row, skipped)
            if model is None:
                continue
            try:
                check_model(model, self._gpu_classes, self._runtime)
            except DefinitionError as exc:
                skipped[row.name] = f"it does not make a valid catalog: {exc.message}"
                continue
            candidates[row.name] = (model, row)
        while True:
            known = set(self._declared_index) | set(candidates)
            orphans = {name: [f for f in m.fallbacks if f not in known]
                       for name, (m, _) in candidates.items()}
            orphans = {name: missing for name, missing in orphans.items() if missing}
            if not orphans:
                break
            for name, missing in orphans.items():
                del candidates[name]
                skipped[name] = ("it does not make a valid catalog: its fallback "
                                 f"{', '.join(map(repr, missing))} is not in the catalog")
        accepted = [*self._declared, *(m for m, _ in candidates.values())]
        return accepted, {name: row for name, (_, row) in candidates.items()}

    async def load(self) -> Catalog:
        """Build the catalog from configuration plus the store, and put it in force."""
        async with self._reload_lock:
            try:
                version = await self._store.catalog_version()
                rows = await self._store.models()
            except StoreUnavailableError as exc:
                self.store_error = exc.message
                raise
            self.store_error = None
            if version == self._version:
                return self._catalog
            skipped: dict[str, str] = {}
            accepted, kept = self._assemble(rows, skipped)
            adapters, kept_adapters = self._assemble_adapters(rows, accepted, skipped)
            for name, why in skipped.items():
                log.warning("stored %s was skipped: %s", name if name.startswith("adapter ")
                            else f"model {name!r}", why)
            catalog = build_catalog(accepted, self._gpu_classes, self._runtime,
                                    provenance=provenance(kept), adapters=adapters,
                                    adapter_provenance=adaptersvc.provenance(kept_adapters))
            self._catalog, self._rows, self._version = catalog, kept, version
            self._adapter_rows = kept_adapters
            self.skipped = skipped
        await self._notify(catalog)
        return catalog

    async def refresh(self) -> bool:
        """Reload if another process changed the catalog; True when it did."""
        self._asking_since = time.monotonic()
        try:
            version = await self._store.catalog_version()
        except StoreUnavailableError as exc:
            self.store_error = exc.message
            return False
        finally:
            self._asking_since = None
        self.store_error = None
        if version == self._version:
            return False
        await self.load()
        return True

    async def _notify(self, catalog: Catalog) -> None:
        for listener in self._listeners:
            try:
                result = listener(catalog)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("a catalog listener failed")

    # -- changing ----------------------------------------------------------

    def _require_store(self) -> None:
        """Changes need the catalog as stored; until it was read once, refuse them."""
        if self._version < 0:
            raise StoreUnavailableError(
                "the catalog could not be read from the store yet "
                f"({self.store_error or 'it has not been opened'}); changes are refused "
                "until it is back, and reads serve the declared models meanwhile")

    def _refuse_declared(self, name: str, consequence: str) -> None:
        if name in self._declared_index:
            where = f"{self._config_name} (models[{self._declared_index[name]}])"
            raise RefusedError(f"model {name!r} is declared in {where}; {consequence}")

    async def check(self, model: Model) -> str:
        """Every check ``add`` makes before it writes — not a declared name, the store
        open, the whole catalog valid with it, and the scheduler able to place it — with
        nothing written (the admin console's guided form shows the outcome first).
        Returns the wording ``add`` gives a catalog it would make invalid."""
        if model.name in self._declared_index:
            # A definition that cannot be added is a wrong definition (400),
            # like every other failure to add; 409 is for valid changes refused.
            where = f"{self._config_name} (models[{self._declared_index[model.name]}])"
            raise DefinitionError(
                f"name: model {model.name!r} is declared in {where}; edit it there rather "
                "than adding a second definition, or choose another name", field="name")
        self._require_store()
        invalid = f"model {model.name!r} would make the catalog invalid"
        if self._placement_check is not None:
            # Asked before the catalog lock is taken: a placement check is a
            # round trip to the scheduler, and the lock blocks every other
            # change (on SQLite, every other write) while it is held.
            rows = await self._store.models()
            accepted, _ = self._assemble([r for r in rows if r.name != model.name])
            built = self._build([*accepted, model], invalid)
            await self._placement_check(built.models[model.name], built)
        else:
            rows = await self._store.models()
            accepted, _ = self._assemble([r for r in rows if r.name != model.name])
            self._build([*accepted, model], invalid)
        return invalid

    async def add(self, model: Model, by: str) -> Model:
        """Put ``model`` in the catalog and keep it across restarts.

        Replaces a runtime model of the same name. Validated by building the
        whole catalog first, so a model that would be skipped on every future
        start — a model that looks added and never appears — is refused now.
        """
        invalid = await self.check(model)
        now = datetime.now(UTC)
        async with self._store.change() as tx:
            rows = await tx.models()
            previous = next((r for r in rows if r.name == model.name), None)
            accepted, _ = self._assemble([r for r in rows if r.name != model.name])
            final = self._build([*accepted, model], invalid).models[model.name]
            await tx.put_model(StoredModel(
                name=model.name, definition=encode(model),
                added_by=by, added_at=now, updated_by=by, updated_at=now,
            ))
        log.info("model %r added by %s%s", model.name, by, " (replacing it)" if previous else "")
        await self._reload_after_change()
        return final

    async def remove(self, name: str, by: str) -> None:
        """Take a runtime model out of the catalog."""
        self._refuse_declared(name, "remove it there, or it comes back on the next restart")
        self._require_store()
        async with self._store.change() as tx:
            rows = await tx.models()
            if not any(r.name == name for r in rows):
                raise NotFoundError(self._unknown(name))
            # Another model may name this one as a fallback. Refusing beats a
            # fallback pointing at nothing, discovered during the outage it was
            # meant to cover. Looked for among everything in force, the model
            # being removed included, so its dependants are still accepted.
            everything, _ = self._assemble(rows)
            users = dependants(everything, name)
            if users:
                raise RefusedError(
                    f"model {name!r} is a fallback of {', '.join(map(repr, users))}; "
                    "change their fallbacks first, or the removal would leave them "
                    "falling back to nothing")
            adapters, _ = self._assemble_adapters(rows, everything, {})
            served = adaptersvc.dependants(adapters, name)
            if served:
                raise RefusedError(
                    f"model {name!r} is the base of adapter{'s' if len(served) > 1 else ''} "
                    f"{', '.join(map(repr, served))}; remove "
                    f"{'them' if len(served) > 1 else 'it'} first (`llmgw ctl adapter "
                    "remove NAME`), or the removal would leave them served on nothing")
            accepted = [m for m in everything if m.name != name]
            self._build(accepted, f"removing {name!r} would make the catalog invalid")
            await tx.delete_model(name)
        log.info("model %r removed by %s", name, by)
        await self._reload_after_change()

    async def scale(self, name: str, min_: int, max_: int | None, by: str) -> Scaling:
        """Change only the scaling block (``rescaled`` says how); return the scaling in force.

        Everything else is read back from the store and written out untouched,
        so changing a number cannot quietly become a redefinition. The answer
        is the scaling after defaults: a caller echoing its own request would
        print a number the cluster is not using.
        """
        self._refuse_declared(
            name, "change its scaling there, or it reverts on the next restart")

        def change(m: Model) -> Model:
            return msgspec.structs.replace(m, scaling=rescaled(name, m.scaling, min_, max_))

        final = await self._update(name, by, change, f"scaling {name!r} that way would make "
                                                     "the catalog invalid", place=False)
        log.info("model %r scaled to min %d max %s by %s", name, final.scaling.min,
                 final.scaling.max, by)
        return final.scaling

    async def resources(self, name: str, cpu_cores: int, memory: Size,
                        profile: str | None, by: str) -> Profile:
        """Set the cores and memory a stored model's profile reserves."""
        self._refuse_declared(
            name, "change its resources there, or they revert on the next restart")
        chosen: list[str] = []

        def change(m: Model) -> Model:
            if not m.profiles:
                raise DefinitionError(
                    f"model {name!r} is external (upstream); it has no profiles to resize",
                    field="profile")
            target = profile or m.profiles[0].name
            if m.profile(target) is None:
                known = ", ".join(p.name for p in m.profiles)
                raise DefinitionError(
                    f"model {name!r} has no profile {target!r} (profiles: {known})",
                    field="profile")
            chosen.append(target)
            profiles = [
                msgspec.structs.replace(p, cpu_cores=cpu_cores, memory=memory)
                if p.name == target else p
                for p in m.profiles
            ]
            return msgspec.structs.replace(m, profiles=profiles)

        final = await self._update(name, by, change, f"those resources for {name!r} would "
                                                     "make the catalog invalid", place=True)
        result = final.profile(chosen[0])
        assert result is not None
        log.info("model %r profile %r resized to %d cores, %s by %s", name, chosen[0],
                 cpu_cores, memory, by)
        return result

    async def _update(self, name: str, by: str, change: Callable[[Model], Model],
                      invalid: str, *, place: bool) -> Model:
        self._require_store()
        if place and self._placement_check is not None:
            rows = await self._store.models()
            row = next((r for r in rows if r.name == name), None)
            current = self._decode(row, {}) if row else None
            if current is not None:
                accepted, _ = self._assemble([r for r in rows if r.name != name])
                built = self._build([*accepted, change(current)], invalid)
                await self._placement_check(built.models[name], built)
        async with self._store.change() as tx:
            rows = await tx.models()
            row = next((r for r in rows if r.name == name), None)
            if row is None:
                raise NotFoundError(self._unknown(name))
            why: dict[str, str] = {}
            current = self._decode(row, why)
            if current is None:
                raise RefusedError(
                    f"stored model {name!r} cannot be decoded ({why.get(name)}); "
                    "add it again with `llmgw ctl model add -f`")
            updated = change(current)
            accepted, _ = self._assemble([r for r in rows if r.name != name])
            built = self._build([*accepted, updated], invalid)
            final = built.models[name]
            now = datetime.now(UTC)
            await tx.put_model(StoredModel(
                name=name, definition=encode(updated), added_by=row.added_by,
                added_at=row.added_at, updated_by=by, updated_at=now,
            ))
        await self._reload_after_change()
        return final

    # -- adapters ----------------------------------------------------------

    def _assemble_adapters(self, rows: Sequence[StoredModel], models: Sequence[Model],
                           skipped: dict[str, str]
                           ) -> tuple[list[Adapter], dict[str, StoredModel]]:
        """Declared adapters plus the stored ones valid on ``models`` (``adaptersvc``)."""
        built = {m.name: m for m in models}
        return adaptersvc.assemble(self._declared_adapters, adaptersvc.adapter_rows(rows),
                                   built, self._runtime, self._config_name, skipped)

    def adapter_origin(self, name: str) -> Origin:
        return "declared" if name in self._declared_adapter_index else "runtime"

    def stored_adapter(self, name: str) -> StoredModel | None:
        return self._adapter_rows.get(name)

    async def add_adapter(self, adapter: Adapter, by: str) -> Adapter:
        """Put ``adapter`` in the catalog (replacing a runtime one of that name) and keep it.

        The whole next catalog is built first, so an adapter whose base is
        missing or cannot serve it is refused now, naming the field. No
        replica restarts: adapters are loaded into running replicas.
        """
        if adapter.name in self._declared_adapter_index:
            where = (f"{self._config_name} "
                     f"(adapters[{self._declared_adapter_index[adapter.name]}])")
            raise DefinitionError(
                f"name: adapter {adapter.name!r} is declared in {where}; edit it there rather "
                "than adding a second definition, or choose another name", field="name")
        self._require_store()
        now = datetime.now(UTC)
        async with self._store.change() as tx:
            rows = await tx.models()
            models, _ = self._assemble(rows)
            others = [r for r in rows if r.name != adaptersvc.row_name(adapter.name)]
            adapters, _ = self._assemble_adapters(others, models, {})
            try:
                build_catalog(models, self._gpu_classes, self._runtime,
                              adapters=[*adapters, adapter])
            except DefinitionError as exc:
                message = exc.message.removeprefix(f"adapter {adapter.name!r}: ")
                raise DefinitionError(f"adapter {adapter.name!r} would make the catalog "
                                      f"invalid: {message}", field=exc.field) from None
            previous = next((r for r in rows if r.name == adaptersvc.row_name(adapter.name)),
                            None)
            await tx.put_model(StoredModel(
                name=adaptersvc.row_name(adapter.name), definition=encode(adapter),
                added_by=previous.added_by if previous else by,
                added_at=previous.added_at if previous else now, updated_by=by,
                updated_at=now))
        log.info("adapter %r on %r added by %s%s", adapter.name, adapter.base, by,
                 " (replacing it)" if previous else "")
        await self._reload_after_change()
        return adapter

    async def remove_adapter(self, name: str, by: str) -> None:
        """Take a runtime adapter out of the catalog; replicas unload it as it is evicted."""
        if name in self._declared_adapter_index:
            where = f"{self._config_name} (adapters[{self._declared_adapter_index[name]}])"
            raise RefusedError(f"adapter {name!r} is declared in {where}; remove it there, "
                               "or it comes back on the next restart")
        self._require_store()
        async with self._store.change() as tx:
            if not await tx.delete_model(adaptersvc.row_name(name)):
                raise NotFoundError(
                    f"there is no adapter named {name!r} added at run time; `llmgw ctl "
                    "adapter list` shows the adapters")
        log.info("adapter %r removed by %s", name, by)
        await self._reload_after_change()

    def _build(self, models: Sequence[Model], invalid: str) -> Catalog:
        # With the adapters in force: a change that would leave one without a base able
        # to serve it (its lora block gone, its name taken by a model) is refused.
        try:
            return build_catalog(models, self._gpu_classes, self._runtime,
                                 adapters=self._catalog.adapters.values())
        except DefinitionError as exc:
            raise DefinitionError(f"{invalid}: {exc.message}", field=exc.field) from None

    def _unknown(self, name: str) -> str:
        if name in self._catalog:
            return f"model {name!r} was not added at runtime"
        return f"there is no model named {name!r}; `llmgw ctl model list` shows the catalog"

    async def _reload_after_change(self) -> None:
        try:
            await self.load()
        except StoreUnavailableError:
            # The change is committed; the watcher picks it up once the store is back.
            log.warning("catalog change committed but reloading it failed; will retry")
