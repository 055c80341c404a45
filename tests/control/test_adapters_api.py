"""/api/v1/adapters: add, list, show and remove adapters; bad input named by field."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from litestar.testing import AsyncTestClient

from llmgw.api.app import create_app
from llmgw.catalog.decode import convert
from llmgw.catalog.model import Model
from llmgw.config import AdminToken, ServerConfig
from llmgw.control.context import AppContext
from llmgw.modelsvc import ModelService
from llmgw.store.base import Store
from llmgw.weights.adaptercheck import check_adapter_source

from .conftest import GPU_CLASSES, RecordingBackend

ADMIN = {"Authorization": "Bearer t0ken-alice"}
BASE = convert({"name": "qwen", "source": "/models/qwen", "engine": "vllm",
                "lora": {"slots": 4, "max_rank": 16},
                "profiles": [{"name": "h100", "gpu_class": "h100-80g", "gpus": 1}]}, Model)


@pytest.fixture
async def client(store: Store, backend: RecordingBackend) -> AsyncIterator[AsyncTestClient]:
    config = ServerConfig(admin_tokens=[AdminToken(name="alice", token="t0ken-alice")],
                          gpu_classes=GPU_CLASSES, models=[BASE])
    svc = ModelService(config.models, GPU_CLASSES, store)
    await svc.load()

    async def check(adapter: object) -> None:
        await check_adapter_source(adapter, mirror=None)  # type: ignore[arg-type]

    ctx = AppContext(config=config, models=svc, backend=backend, store=store,
                     adapter_check=check)
    async with AsyncTestClient(create_app(ctx)) as c:
        yield c


def adapter_dir(tmp_path: Path, name: str, config: bool = True) -> str:
    path = tmp_path / name
    path.mkdir()
    if config:
        (path / "adapter_config.json").write_text('{"r": 8}')
    return str(path)


async def test_an_adapter_is_added_listed_shown_and_removed(client: AsyncTestClient,
                                                            tmp_path: Path) -> None:
    """The round trip, with who added it and the base's capacity in the view."""
    body = {"name": "qwen-sql", "base": "qwen", "source": adapter_dir(tmp_path, "sql"),
            "rank": 8, "description": "SQL"}
    r = await client.post("/api/v1/adapters", json=body, headers=ADMIN)
    assert r.status_code == 200, r.text
    view = r.json()
    assert view["origin"] == "runtime"
    assert view["added_by"] == "alice"
    assert (view["base_slots"], view["base_max_rank"]) == (4, 16)
    listed = (await client.get("/api/v1/adapters", headers=ADMIN)).json()
    assert [a["name"] for a in listed] == ["qwen-sql"]
    shown = (await client.get("/api/v1/adapters/qwen-sql", headers=ADMIN)).json()
    assert shown["rank"] == 8
    assert (await client.delete("/api/v1/adapters/qwen-sql", headers=ADMIN)).status_code == 204
    assert (await client.get("/api/v1/adapters/qwen-sql", headers=ADMIN)).status_code == 404


@pytest.mark.parametrize(("fields", "field", "words"), [
    ({"base": "nope"}, "base", "there is no model 'nope'"),
    ({"rank": 64}, "rank", "exceeds the maximum rank"),
    ({"name": "qwen"}, "name", "is a model's name"),
    ({"source": "/no/such/dir"}, "source", "not found"),
    ({"rank": "8"}, "rank", "Expected `int | null`, got `str`"),
])
async def test_bad_input_is_400_naming_the_field(client: AsyncTestClient, tmp_path: Path,
                                                 fields: dict[str, object], field: str,
                                                 words: str) -> None:
    """A missing base, a rank above the maximum, a taken name, an unreachable source."""
    body: dict[str, object] = {"name": "qwen-x", "base": "qwen",
                               "source": adapter_dir(tmp_path, "x")}
    body.update(fields)
    r = await client.post("/api/v1/adapters", json=body, headers=ADMIN)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field
    assert words in r.json()["error"]["message"]


async def test_a_source_without_adapter_config_is_not_an_adapter(client: AsyncTestClient,
                                                                 tmp_path: Path) -> None:
    """A directory lacking adapter_config.json is refused at add, field source."""
    body = {"name": "qwen-x", "base": "qwen", "source": adapter_dir(tmp_path, "x", False)}
    r = await client.post("/api/v1/adapters", json=body, headers=ADMIN)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "source"
    assert "not a LoRA adapter: no adapter_config.json" in r.json()["error"]["message"]


async def test_removing_a_base_with_adapters_is_409_naming_them(client: AsyncTestClient,
                                                               tmp_path: Path) -> None:
    """The base goes only once its adapters have."""
    model = {"name": "mini", "source": "/models/mini", "engine": "vllm", "lora": {},
             "profiles": [{"name": "h100", "gpu_class": "h100-80g", "gpus": 1}]}
    assert (await client.post("/api/v1/models?skip_source_check=true", json=model,
                              headers=ADMIN)).status_code == 200
    body = {"name": "mini-sql", "base": "mini", "source": adapter_dir(tmp_path, "m")}
    assert (await client.post("/api/v1/adapters", json=body, headers=ADMIN)).status_code == 200
    r = await client.delete("/api/v1/models/mini", headers=ADMIN)
    assert r.status_code == 409
    assert "base of adapter 'mini-sql'" in r.json()["error"]["message"]
