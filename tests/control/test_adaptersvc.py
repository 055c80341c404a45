"""Runtime adapters: added and removed like models, beside them in the store."""

from __future__ import annotations

import pytest

from llmgw.catalog.adapter import Adapter
from llmgw.catalog.model import Lora, Model, Profile
from llmgw.catalog.source import Source
from llmgw.errors import DefinitionError, NotFoundError, RefusedError
from llmgw.modelsvc import ModelService
from llmgw.store.base import Store

from .conftest import GPU_CLASSES

BASE = Model(name="qwen", source=Source.parse("/models/qwen"), engine="vllm", lora=Lora(),
             profiles=[Profile(name="h100", gpu_class="h100-80g", gpus=1)])


def adapter(name: str, base: str = "qwen") -> Adapter:
    return Adapter(name=name, base=base, source=Source.parse(f"/adapters/{name}"))


async def service(store: Store, declared: list[Adapter] | None = None) -> ModelService:
    svc = ModelService([BASE], GPU_CLASSES, store, declared_adapters=declared or [])
    await svc.load()
    return svc


async def test_a_runtime_adapter_is_stored_and_read_back_by_another_process(
        store: Store) -> None:
    """Another process building its catalog from the store serves the adapter too."""
    svc = await service(store)
    await svc.add_adapter(adapter("qwen-sql"), "alice")
    assert "qwen-sql" in svc.catalog.adapters
    other = await service(store)
    assert other.catalog.adapters["qwen-sql"].base == "qwen"
    assert other.catalog.adapter_provenance["qwen-sql"].added_by == "alice"
    assert other.adapter_origin("qwen-sql") == "runtime"


async def test_an_adapter_on_a_missing_base_is_refused_and_nothing_stored(store: Store) -> None:
    """The whole next catalog is built before anything is written."""
    svc = await service(store)
    with pytest.raises(DefinitionError, match="there is no model 'llama'") as err:
        await svc.add_adapter(adapter("x", base="llama"), "alice")
    assert err.value.field == "base"
    assert await store.models() == []


async def test_a_declared_adapter_wins_and_cannot_be_removed_at_runtime(store: Store) -> None:
    """Configuration wins every conflict, for adapters as for models."""
    svc = await service(store, [adapter("qwen-sql")])
    with pytest.raises(DefinitionError, match=r"declared in server.yaml \(adapters\[0\]\)"):
        await svc.add_adapter(adapter("qwen-sql"), "alice")
    with pytest.raises(RefusedError, match="declared in server.yaml"):
        await svc.remove_adapter("qwen-sql", "alice")


async def test_a_base_cannot_be_removed_while_adapters_depend_on_it(store: Store) -> None:
    """The refusal names every adapter served on it; once they are gone, it goes."""
    svc = ModelService([], GPU_CLASSES, store)
    await svc.load()
    await svc.add(BASE, "alice")
    await svc.add_adapter(adapter("qwen-sql"), "alice")
    await svc.add_adapter(adapter("qwen-law"), "alice")
    with pytest.raises(RefusedError, match=r"base of adapters 'qwen-law', 'qwen-sql'"):
        await svc.remove("qwen", "alice")
    await svc.remove_adapter("qwen-sql", "alice")
    await svc.remove_adapter("qwen-law", "alice")
    await svc.remove("qwen", "alice")
    assert await store.models() == []


async def test_removing_an_unknown_adapter_says_so(store: Store) -> None:
    """404 with the way to list what there is."""
    svc = await service(store)
    with pytest.raises(NotFoundError, match="ctl adapter list"):
        await svc.remove_adapter("nope", "alice")


async def test_a_model_change_that_strands_an_adapter_is_refused(store: Store) -> None:
    """Replacing a base with one that serves no adapters would leave them on nothing."""
    svc = ModelService([], GPU_CLASSES, store)
    await svc.load()
    await svc.add(BASE, "alice")
    await svc.add_adapter(adapter("qwen-sql"), "alice")
    plain = Model(name="qwen", source=BASE.source, engine="vllm", profiles=BASE.profiles)
    with pytest.raises(DefinitionError, match="serves no adapters"):
        await svc.add(plain, "alice")
