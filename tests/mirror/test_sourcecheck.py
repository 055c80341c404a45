"""The source check against a local stand-in Hub and a real `llmgw mirror serve`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from litestar import Litestar, Router
from litestar.di import Provide
from litestar.testing import AsyncTestClient

from llmgw.api import sourcecheck as api
from llmgw.api.errors import exception_handlers
from llmgw.api.typed import TYPE_DECODERS, TYPE_ENCODERS
from llmgw.catalog.decode import decode_value
from llmgw.catalog.model import Model
from llmgw.catalog.source import Source
from llmgw.config import ServerConfig
from llmgw.control.context import AppContext
from llmgw.errors import DefinitionError
from llmgw.testing.fake_hub import FakeHub, FakeRepo
from llmgw.weights.check import check_source, model_source_checker
from llmgw.weights.mirror.server import MirrorServer
from llmgw.weights.reach import Reach

from .servers import FileServer, ThreadedMirror, closed_port_url, running

REPOS = {
    "qwen/qwen2.5-0.5b": FakeRepo(files={"config.json": b"{}", "model.safetensors": b"w" * 64},
                                  branches=("main", "v1")),
    "meta/gated-model": FakeRepo(files={"config.json": b"{}"}, gated=True),
}


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    server = FakeHub(REPOS)
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    try:
        yield server
    finally:
        server.stop()


async def check(source: str, **kw: Any) -> None:
    """The source as a model entry gives it: decoded, then checked."""
    await check_source(decode_value(source, Source, source="source"), **kw)


async def refused(source: str, **kw: Any) -> str:
    with pytest.raises(DefinitionError) as info:
        await check(source, **kw)
    assert info.value.field == "source"
    assert source in info.value.message
    return info.value.message


async def test_a_hub_repository_that_exists_passes(hub: FakeHub) -> None:
    """A repository checks model_info and the metadata of config.json, reading only."""
    await check("hf://qwen/qwen2.5-0.5b")
    assert ("GET", "/api/models/qwen/qwen2.5-0.5b") in [(s.method, s.path) for s in hub.seen]
    assert any(s.method == "HEAD" and s.path.endswith("/config.json") for s in hub.seen)
    assert {s.method for s in hub.seen} <= {"GET", "HEAD"}


async def test_a_revision_and_file_that_exist_pass(hub: FakeHub) -> None:
    """Hf://org/repo@revision/file checks that revision and that file."""
    await check("hf://qwen/qwen2.5-0.5b@v1/model.safetensors")
    assert any(s.path == "/api/models/qwen/qwen2.5-0.5b/revision/v1" for s in hub.seen)
    assert any(s.method == "HEAD" and s.path.endswith("/model.safetensors") for s in hub.seen)


async def test_a_repository_that_does_not_exist_is_not_found(hub: FakeHub) -> None:
    """A misspelt repository is refused as not found (or private), naming it."""
    message = await refused("hf://qwen/qwen2.5-0.5b-typo")
    assert "was not found" in message
    assert "qwen/qwen2.5-0.5b-typo" in message


async def test_a_revision_that_does_not_exist_is_not_found(hub: FakeHub) -> None:
    """An unknown revision is named as such."""
    message = await refused("hf://qwen/qwen2.5-0.5b@no-such-branch")
    assert "revision 'no-such-branch' was not found" in message


async def test_a_file_that_does_not_exist_is_not_found(hub: FakeHub) -> None:
    """An unknown file in a real repository is named as such."""
    message = await refused("hf://qwen/qwen2.5-0.5b/model-q4.gguf")
    assert "file 'model-q4.gguf' was not found" in message


async def test_a_gated_repository_without_access_is_refused(hub: FakeHub) -> None:
    """A gated repository the server may not download says gated and what to do."""
    message = await refused("hf://meta/gated-model")
    assert "gated" in message
    assert "request access" in message


async def test_an_unreachable_hub_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Hub that cannot be reached is an error at add time, saying unreachable."""
    monkeypatch.setenv("HF_ENDPOINT", closed_port_url())
    message = await refused("hf://qwen/qwen2.5-0.5b", timeout=5)
    assert "cannot reach the Hugging Face Hub" in message


async def test_a_malformed_hub_source_is_refused() -> None:
    """Hf:// without ORG/REPO is refused before any request."""
    message = await refused("hf://just-a-name")
    assert "hf://ORG/REPO" in message


async def test_a_mirror_file_answers_head_with_a_length(mirror_server: MirrorServer) -> None:
    """A file on a real mirror passes: HEAD answers with its length."""
    await check(f"{mirror_server.url}/qwen/2024-11/model.gguf", mirror=mirror_server.url)


async def test_a_mirror_directory_answers_with_its_listing(mirror_server: MirrorServer) -> None:
    """A directory URL passes when its JSON listing answers, with or without the slash."""
    await check(f"{mirror_server.url}/qwen/2024-11/", mirror=mirror_server.url)
    await check(f"{mirror_server.url}/qwen/2024-11", mirror=mirror_server.url)


async def test_an_empty_mirror_directory_is_refused(mirror_server: MirrorServer) -> None:
    """An empty directory holds no model: refused, saying to add it first."""
    message = await refused(f"{mirror_server.url}/empty/", mirror=mirror_server.url)
    assert "empty" in message


async def test_a_missing_mirror_file_is_not_found(mirror_server: MirrorServer) -> None:
    """A typo in a mirror path is a 404 from the mirror, named at add time."""
    message = await refused(f"{mirror_server.url}/qwen/2024-12/model.gguf",
                            mirror=mirror_server.url)
    assert "not found: the mirror answered HTTP 404" in message


async def test_a_mirror_that_is_down_is_unreachable() -> None:
    """A mirror that is down is refused as unreachable, pointing at `mirror serve`."""
    url = closed_port_url()
    message = await refused(f"{url}/qwen/2024-11/model.gguf", mirror=url)
    assert "unreachable" in message
    assert "llmgw mirror serve" in message


async def test_a_server_without_a_length_is_refused() -> None:
    """A URL whose HEAD promises no length is refused: a node could not tell a cut
    download from a complete one. Only HEAD was sent."""
    with running(lambda: FileServer(b"x" * 100, head_length=False)) as srv:
        message = await refused(srv.url, reach=Reach.of(allow_hosts=["127.0.0.1"]))
        assert {s.method for s in srv.seen} == {"HEAD"}
    assert "without a Content-Length" in message


async def test_local_paths_must_exist(tmp_path: Path) -> None:
    """A local path (or file:// URL) passes when it exists and is refused otherwise."""
    model = tmp_path / "model.gguf"
    model.write_bytes(b"gguf")
    await check(str(model))
    await check(f"file://{model}")
    message = await refused(str(tmp_path / "missing.gguf"))
    assert "not found" in message


async def test_pkg_sources_must_be_installed() -> None:
    """Pkg:<distribution> passes when installed and says to pip install otherwise."""
    await check("pkg:msgspec")
    message = await refused("pkg:llmgw-no-such-model-package")
    assert "pip install llmgw-no-such-model-package" in message


async def test_unsupported_schemes_are_refused() -> None:
    """A scheme the fleet cannot fetch from is refused, listing the supported forms."""
    message = await refused("s3://bucket/model.gguf")
    assert "unsupported scheme" in message


async def test_the_model_checker_skips_external_models(tmp_path: Path) -> None:
    """The AppContext checker passes an external model and checks a scheduled one."""
    checker = model_source_checker()
    await checker(Model(name="ext", upstream=["http://10.0.0.1:8000/v1"]))
    with pytest.raises(DefinitionError, match="not found"):
        await checker(Model(name="local", source=Source.parse(str(tmp_path / "nope.gguf")),
                            engine="llama.cpp"))


def _app(mirror: str | None) -> Litestar:
    # Only the configuration is read by the handler; the rest is not consulted.
    ctx = AppContext(config=ServerConfig(mirror=mirror), models=None, backend=None,  # type: ignore[arg-type]
                     store=None)  # type: ignore[arg-type]
    return Litestar(
        route_handlers=[Router("/api/v1", route_handlers=api.route_handlers)],
        dependencies={"ctx": Provide(lambda: ctx, sync_to_thread=False)},
        exception_handlers=exception_handlers,
        type_decoders=TYPE_DECODERS, type_encoders=TYPE_ENCODERS,
    )


async def test_the_api_answers_ok_or_the_reason(threaded_mirror: ThreadedMirror) -> None:
    """POST /api/v1/source-check answers {"ok": true}, or 400 naming the source and the
    reason with param "source"; an unknown field in the body is refused. (The mirror
    runs on its own thread: the test client drives the app from this one.)"""
    async with AsyncTestClient(app=_app(threaded_mirror.url)) as client:
        good = await client.post("/api/v1/source-check",
                                 json={"source": f"{threaded_mirror.url}/qwen/2024-11/"})
        assert good.status_code == 200, good.text
        assert good.json() == {"ok": True}
        bad = await client.post("/api/v1/source-check",
                                json={"source": f"{threaded_mirror.url}/qwen/2099/"})
        assert bad.status_code == 400
        error = bad.json()["error"]
        assert error["param"] == "source"
        assert "/qwen/2099/" in error["message"]
        assert "HTTP 404" in error["message"]
        typo = await client.post("/api/v1/source-check", json={"sourcce": "x"})
        assert typo.status_code == 400


async def test_a_password_in_the_source_url_is_not_repeated_in_the_error(
        mirror_server: MirrorServer) -> None:
    """The error for a URL carrying ``user:password@`` names the source with the
    password masked, since it reaches API clients and logs."""
    with pytest.raises(DefinitionError) as err:
        await check(f"http://ops:s3cr3t-t0ken@127.0.0.1:{mirror_server.port}/nope/x.gguf",
                    mirror=mirror_server.url)
    assert "s3cr3t-t0ken" not in err.value.message
    assert "ops:***@127.0.0.1" in err.value.message
    assert "not found" in err.value.message
