"""The model service's rules, each pinned by a test that fails if dropped."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import msgspec
import pytest

from llmgw.catalog.build import Provenance
from llmgw.catalog.decode import decode_json, encode
from llmgw.catalog.model import Model, Profile, Scaling
from llmgw.catalog.source import Source
from llmgw.catalog.units import Size
from llmgw.errors import DefinitionError, NotFoundError, PlacementError, RefusedError
from llmgw.modelsvc import ModelService
from llmgw.store.base import Store, StoredModel

from .conftest import GPU_CLASSES, RecordingBackend


def cpu(name: str, **kw: object) -> Model:
    profile = Profile(name="cpu", gpus=0, cpu_cores=4, memory=Size.parse("8GiB"))
    return Model(name=name, source=Source.parse(f"/models/{name}.gguf"), engine="llama.cpp",  # type: ignore[arg-type]
                 profiles=[profile], **kw)


DECLARED = [cpu("prod-chat", scaling=Scaling(min=2))]


async def service(store: Store, backend: RecordingBackend | None = None,
                  declared: list[Model] | None = None) -> ModelService:
    svc = ModelService(DECLARED if declared is None else declared, GPU_CLASSES, store,
                       placement_check=backend.check_placement if backend else None)
    await svc.load()
    return svc


async def stored_names(store: Store) -> list[str]:
    return sorted(r.name for r in await store.models())


async def test_adding_a_declared_name_is_refused_and_nothing_is_stored(store: Store) -> None:
    """Configuration wins; a runtime model may not shadow a declared one."""
    svc = await service(store)
    with pytest.raises(DefinitionError, match=r"declared in server.yaml \(models\[0\]\); "
                                              "edit it there rather than adding a second "
                                              "definition") as err:
        await svc.add(cpu("prod-chat"), "alice")
    assert err.value.field == "name"
    assert await stored_names(store) == []


async def test_add_records_who_added_the_model_and_when(store: Store) -> None:
    """The actor and the time are kept with the row and shown on the model."""
    svc = await service(store)
    before = datetime.now(UTC)
    await svc.add(cpu("trial"), "alice")
    row = svc.stored("trial")
    assert row is not None
    assert row.added_by == "alice"
    assert before <= row.added_at <= datetime.now(UTC)
    assert "trial" in svc.catalog
    assert svc.origin("trial") == "runtime"
    assert svc.origin("prod-chat") == "declared"


async def test_the_catalog_says_who_added_each_runtime_model(store: Store) -> None:
    """The catalog in force carries each runtime model's origin and adder (what its Nomad
    job's description names); a declared model is declared."""
    svc = await service(store)
    await svc.add(cpu("trial"), "alice")
    assert svc.catalog.origin("trial") == Provenance(origin="runtime", added_by="alice")
    assert svc.catalog.origin("prod-chat") == Provenance(origin="declared")


async def test_add_replaces_a_runtime_model_of_the_same_name(store: Store) -> None:
    """Adding again is a replacement, not a duplicate."""
    svc = await service(store)
    await svc.add(cpu("trial"), "alice")
    await svc.add(cpu("trial", description="second"), "bob")
    assert await stored_names(store) == ["trial"]
    assert svc.catalog.models["trial"].description == "second"


async def test_an_add_that_would_make_the_catalog_invalid_persists_nothing(store: Store) -> None:
    """A missing fallback is refused before anything is written."""
    svc = await service(store)
    version = await store.catalog_version()
    with pytest.raises(DefinitionError, match="no model 'ghost'"):
        await svc.add(cpu("trial", fallbacks=["ghost"]), "alice")
    assert await stored_names(store) == []
    assert await store.catalog_version() == version


async def test_a_refused_change_does_not_list_models_in_force_as_skipped(
        store: Store) -> None:
    """Replacing a fallback with an invalid definition is refused; its dependant stays in
    force and /readyz's skipped list stays empty."""
    svc = await service(store)
    await svc.add(cpu("backup"), "alice")
    await svc.add(cpu("trial", fallbacks=["backup"]), "alice")
    with pytest.raises(DefinitionError, match="no model 'ghost'"):
        await svc.add(cpu("backup", fallbacks=["ghost"]), "alice")
    assert "trial" in svc.catalog
    assert svc.skipped == {}


async def test_an_unplaceable_profile_is_refused_at_add_time(store: Store,
                                                            backend: RecordingBackend) -> None:
    """A profile no node could ever run is a definition error, and nothing is stored."""
    svc = await service(store, backend)
    big = Model(name="huge", source=Source.parse("hf://org/huge"), engine="vllm", profiles=[
        Profile(name="tp16", gpu_class="h100-80g", gpus=16, cpu_cores=8,
                memory=Size.parse("64GiB"))])
    with pytest.raises(PlacementError, match="no node has 16 GPUs"):
        await svc.add(big, "alice")
    assert await stored_names(store) == []


async def test_a_fallback_that_sorts_after_its_model_is_kept(store: Store) -> None:
    """'alpha' falling back to 'zulu' stays in force, and zulu cannot be removed."""
    svc = await service(store)
    await svc.add(cpu("zulu"), "alice")
    await svc.add(cpu("alpha", fallbacks=["zulu"]), "alice")
    assert sorted(svc.catalog.models) == ["alpha", "prod-chat", "zulu"]
    assert svc.skipped == {}
    with pytest.raises(RefusedError, match="fallback of 'alpha'"):
        await svc.remove("zulu", "alice")


async def test_a_chain_of_orphans_is_skipped_whole(store: Store) -> None:
    """A row whose fallback was skipped is skipped too, and named."""
    enc = encode
    await _put_raw(store, "a", enc(cpu("a", fallbacks=["b"])))
    await _put_raw(store, "b", enc(cpu("b", fallbacks=["ghost"])))
    await _put_raw(store, "c", enc(cpu("c")))
    svc = await service(store)
    assert sorted(svc.catalog.models) == ["c", "prod-chat"]
    assert set(svc.skipped) == {"a", "b"}


async def test_changes_are_refused_until_the_catalog_was_read(store: Store) -> None:
    """Before the store was read once, a write is 503, never a 500 or a guess."""
    from llmgw.errors import StoreUnavailableError

    svc = ModelService(DECLARED, GPU_CLASSES, store)
    with pytest.raises(StoreUnavailableError, match="could not be read"):
        await svc.add(cpu("trial"), "alice")
    with pytest.raises(StoreUnavailableError):
        await svc.scale("trial", 1, None, "alice")


async def test_removing_a_declared_model_is_refused(store: Store) -> None:
    """It would come back on the next restart."""
    svc = await service(store)
    with pytest.raises(RefusedError, match="remove it there, or it comes back on the next "
                                           "restart"):
        await svc.remove("prod-chat", "alice")
    assert "prod-chat" in svc.catalog


async def test_removing_an_unknown_model_is_refused(store: Store) -> None:
    """An unknown name is a 404, not a silent success."""
    svc = await service(store)
    with pytest.raises(NotFoundError, match="no model named 'ghost'"):
        await svc.remove("ghost", "alice")


async def test_a_removal_that_would_break_a_fallback_is_refused_and_the_row_kept(
        store: Store) -> None:
    """A fallback pointing at nothing is discovered during the outage it covers."""
    svc = await service(store)
    await svc.add(cpu("backup"), "alice")
    await svc.add(cpu("trial", fallbacks=["backup"]), "alice")
    with pytest.raises(RefusedError, match="fallback of 'trial'"):
        await svc.remove("backup", "alice")
    assert await stored_names(store) == ["backup", "trial"]
    await svc.remove("trial", "alice")
    await svc.remove("backup", "alice")
    assert await stored_names(store) == []
    assert "backup" not in svc.catalog


async def test_scaling_a_declared_model_is_refused_and_nothing_changes(store: Store) -> None:
    """The YAML is read on every start, so the new count would silently revert."""
    svc = await service(store)
    with pytest.raises(RefusedError, match="change its scaling there, or it reverts on the "
                                           "next restart"):
        await svc.scale("prod-chat", 5, None, "alice")
    assert svc.catalog.models["prod-chat"].scaling.min == 2


async def test_scale_changes_only_the_scaling_block(store: Store) -> None:
    """Everything else is read back and written unchanged."""
    svc = await service(store)
    original = cpu("trial", description="tuned", fallbacks=["prod-chat"])
    await svc.add(original, "alice")
    await svc.scale("trial", 3, 5, "bob")
    (row,) = await store.models()
    stored = decode_json(row.definition, Model)
    assert stored == msgspec.structs.replace(original, scaling=Scaling(min=3, max=5))
    assert row.added_by == "alice"
    assert row.updated_by == "bob"


async def test_scale_reports_the_scaling_in_force_not_the_request(store: Store) -> None:
    """Max left out comes back filled in (min, or 1 for on demand)."""
    svc = await service(store)
    await svc.add(cpu("trial"), "alice")
    assert (await svc.scale("trial", 3, None, "bob")).max == 3
    assert (await svc.scale("trial", 0, None, "bob")).max == 1


async def test_scaling_max_below_min_is_refused_and_the_stored_definition_untouched(
        store: Store) -> None:
    """A rejected change is not persisted to come back as a broken catalog."""
    svc = await service(store)
    await svc.add(cpu("trial", scaling=Scaling(min=1, max=2)), "alice")
    before = await store.models()
    with pytest.raises(DefinitionError, match="max 2 is below min 4"):
        await svc.scale("trial", 4, 2, "bob")
    assert await store.models() == before


async def test_scaling_an_unknown_model_is_refused(store: Store) -> None:
    """An unknown name is named in the error."""
    svc = await service(store)
    with pytest.raises(NotFoundError, match="'ghost'"):
        await svc.scale("ghost", 1, None, "alice")


async def test_resources_set_cores_and_memory_of_a_stored_profile(store: Store) -> None:
    """Both values change, the rest of the profile stays."""
    svc = await service(store)
    await svc.add(cpu("trial"), "alice")
    p = await svc.resources("trial", 12, Size.parse("48GiB"), None, "bob")
    assert (p.name, p.cpu_cores, str(p.memory)) == ("cpu", 12, "48GiB")
    assert svc.catalog.models["trial"].profiles[0].memory.text == "48GiB"


async def test_resources_are_validated_like_any_change(store: Store) -> None:
    """A nonsense size or an unknown profile is refused and nothing written."""
    svc = await service(store)
    await svc.add(cpu("trial"), "alice")
    before = await store.models()
    with pytest.raises(DefinitionError, match="memory"):
        await svc.resources("trial", 4, Size.parse("0GiB"), None, "bob")
    with pytest.raises(DefinitionError, match="no profile 'gpu'"):
        await svc.resources("trial", 4, Size.parse("8GiB"), "gpu", "bob")
    with pytest.raises(RefusedError, match="declared"):
        await svc.resources("prod-chat", 4, Size.parse("8GiB"), None, "bob")
    assert await store.models() == before


async def _put_raw(store: Store, name: str, definition: bytes) -> None:
    now = datetime.now(UTC)
    async with store.change() as tx:
        await tx.put_model(StoredModel(name=name, definition=definition, added_by="x",
                                       added_at=now, updated_by="x", updated_at=now))


async def test_startup_skips_and_names_bad_rows_and_keeps_the_rest(
        store: Store, caplog: pytest.LogCaptureFixture) -> None:
    """A colliding, an undecodable and an invalid row are skipped; the good one loads."""
    enc = encode
    await _put_raw(store, "prod-chat", enc(cpu("prod-chat")))
    await _put_raw(store, "garbled", b'{"name": "garbled", "profiles": 7}')
    await _put_raw(store, "orphan", enc(cpu("orphan", fallbacks=["ghost"])))
    await _put_raw(store, "good", enc(cpu("good")))
    with caplog.at_level(logging.WARNING, logger="llmgw.models"):
        svc = await service(store)
    assert sorted(svc.catalog.models) == ["good", "prod-chat"]
    assert set(svc.skipped) == {"prod-chat", "garbled", "orphan"}
    assert "configuration wins" in svc.skipped["prod-chat"]
    for name in ("prod-chat", "garbled", "orphan"):
        assert any(name in rec.getMessage() for rec in caplog.records)
    assert svc.origin("prod-chat") == "declared"


async def test_a_change_through_one_service_is_seen_by_another(store: Store) -> None:
    """A second instance on the same store follows the catalog version."""
    a = await service(store)
    b = await service(store)
    await a.add(cpu("trial"), "alice")
    assert "trial" not in b.catalog
    assert await b.refresh()
    assert "trial" in b.catalog
    assert not await b.refresh()


async def test_listeners_receive_each_new_catalog(store: Store) -> None:
    """The scheduler is told about every catalog put in force."""
    svc = await service(store)
    seen: list[set[str]] = []
    svc.subscribe(lambda c: seen.append(set(c.models)))
    await svc.add(cpu("trial"), "alice")
    assert seen[-1] == {"prod-chat", "trial"}
