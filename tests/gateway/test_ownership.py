"""Owned objects belong to a key's immutable id: no other key, nor a new key of an old name,
reads, lists, cancels, deletes or is billed for them."""

from __future__ import annotations

import io
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import openai
import pytest

from llmgw.gateway.keys import add_key, hash_key, revoke_key
from llmgw.tenancy import key_id
from tests.gateway.conftest import GatewayFactory, GatewayHandle, chat_model, wait_for
from tests.gateway.engine import FakeEngine
from tests.gateway.test_files_batches import CHAT, finished, line
from tests.gateway.test_tenants import make_key, make_team, until

Objects = dict[str, str]


async def _own_everything(client: openai.AsyncOpenAI) -> Objects:
    """A file, a finished batch with its output file, a pending batch and a stored response."""
    file = await client.files.create(file=("in.jsonl", io.BytesIO(line(0) + line(1))),
                                     purpose="batch")
    done = await client.batches.create(input_file_id=file.id, endpoint=CHAT,
                                       completion_window="24h")
    done = await finished(client, done.id)
    assert done.status == "completed", done
    response = await client.responses.create(model="chat", input="remember 42")
    return {"file": file.id, "batch": done.id, "output": str(done.output_file_id),
            "response": response.id}


async def _sees_nothing(client: openai.AsyncOpenAI, objects: Objects) -> None:
    """Every read, list, cancel and delete of ``objects`` is a 404 or an empty list."""
    attempts: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
        ("retrieve file", lambda: client.files.retrieve(objects["file"])),
        ("read file", lambda: client.files.content(objects["file"])),
        ("read batch output", lambda: client.files.content(objects["output"])),
        ("retrieve output", lambda: client.files.retrieve(objects["output"])),
        ("retrieve batch", lambda: client.batches.retrieve(objects["batch"])),
        ("cancel batch", lambda: client.batches.cancel(objects["batch"])),
        ("retrieve response", lambda: client.responses.retrieve(objects["response"])),
        ("batch over another's file", lambda: client.batches.create(
            input_file_id=objects["file"], endpoint=CHAT, completion_window="24h")),
        ("delete response", lambda: client.responses.delete(objects["response"])),
        ("delete output", lambda: client.files.delete(objects["output"])),
        ("delete file", lambda: client.files.delete(objects["file"])),
    ]
    for what, attempt in attempts:
        try:
            await attempt()
        except openai.NotFoundError:
            continue
        pytest.fail(f"{what} succeeded for a key that does not own it")
    with pytest.raises((openai.NotFoundError, openai.BadRequestError)):
        await client.responses.create(model="chat", input="what was the number?",
                                      previous_response_id=objects["response"])
    assert (await client.batches.list()).data == []


async def _still_there(gw: GatewayHandle, objects: Objects) -> None:
    store = gw.store
    assert await store.get_file(objects["file"], None) is not None
    assert await store.get_file(objects["output"], None) is not None
    assert await store.get_batch(objects["batch"], None) is not None


@pytest.fixture
async def engine(engines: Callable[..., Awaitable[FakeEngine]]) -> FakeEngine:
    return await engines("e")


async def test_a_new_runtime_key_with_a_revoked_keys_name_owns_nothing_of_it(
        make_gateway: GatewayFactory, engine: FakeEngine) -> None:
    """Revoke team A's key `ka`, create `ka` in team B: the new key reads, lists, cancels,
    deletes and continues nothing of the old one's, and neither does a live key of B."""
    gw = await make_gateway([chat_model("chat", upstream=[engine.url])],
                            listen="0.0.0.0:8080")
    await make_team(gw.store, "team-a")
    await make_team(gw.store, "team-b")
    old = await make_key(gw.store, "ka", "team-a")
    other = await make_key(gw.store, "kb", "team-b")

    async def accepted(key: str) -> bool:
        return (await gw.chat("chat", key=key)).status_code == 200

    await until(lambda: accepted(old), "the key ka to be accepted")
    await until(lambda: accepted(other), "the key kb to be accepted")
    objects = await _own_everything(gw.openai(old))
    await _sees_nothing(gw.openai(other), objects)

    assert await gw.store.delete_key("ka")
    new = await make_key(gw.store, "ka", "team-b")
    await until(lambda: accepted(new), "the new key ka to be accepted")
    assert (await gw.chat("chat", key=old)).status_code == 401
    await _sees_nothing(gw.openai(new), objects)
    await _still_there(gw, objects)


async def test_a_keys_file_name_added_again_after_revocation_owns_nothing_of_the_old_key(
        make_gateway: GatewayFactory, engine: FakeEngine, tmp_path: Path) -> None:
    """`llmgw keys revoke alice` then `keys add alice`: the new alice owns nothing of the old."""
    keys = tmp_path / "keys.json"
    old = add_key(keys, "alice")
    gw = await make_gateway([chat_model("chat", upstream=[engine.url])], keys_file=keys,
                            keys_check_interval="50ms")
    objects = await _own_everything(gw.openai(old))
    revoke_key(keys, "alice")
    new = add_key(keys, "alice")

    async def accepted() -> bool:
        return (await gw.chat("chat", key=new)).status_code == 200

    await until(accepted, "the new alice to be accepted")
    await _sees_nothing(gw.openai(new), objects)
    await _still_there(gw, objects)


async def test_the_owner_still_reads_lists_cancels_and_deletes_its_own(
        make_gateway: GatewayFactory, engine: FakeEngine, tmp_path: Path) -> None:
    """The same checks that refuse a stranger let the owner through."""
    keys = tmp_path / "keys.json"
    key = add_key(keys, "alice")
    gw = await make_gateway([chat_model("chat", upstream=[engine.url])], keys_file=keys)
    client = gw.openai(key)
    objects = await _own_everything(client)
    assert (await client.files.retrieve(objects["file"])).id == objects["file"]
    assert (await client.files.content(objects["output"])).content
    assert [b.id for b in (await client.batches.list()).data] == [objects["batch"]]
    assert (await client.responses.retrieve(objects["response"])).id == objects["response"]
    await client.responses.delete(objects["response"])
    assert (await client.files.delete(objects["output"])).deleted
    assert (await client.files.delete(objects["file"])).deleted


async def test_a_batch_running_when_its_keys_name_is_recreated_bills_its_owner_only(
        make_gateway: GatewayFactory, engine: FakeEngine) -> None:
    """Lines of a batch whose key is revoked mid-run are never billed to a new key of the
    same name in another team; what ran is the owner's (its key id and team)."""
    gw = await make_gateway([chat_model("chat", upstream=[engine.url])],
                            listen="0.0.0.0:8080", batch_concurrency=1)
    await make_team(gw.store, "team-a")
    await make_team(gw.store, "team-b")
    old = await make_key(gw.store, "ka", "team-a")

    async def accepted(key: str) -> bool:
        return (await gw.chat("chat", key=key)).status_code == 200

    await until(lambda: accepted(old), "the key ka to be accepted")
    client = gw.openai(old)
    file = await client.files.create(
        file=("in.jsonl", io.BytesIO(b"".join(line(i) for i in range(40)))), purpose="batch")
    engine.response_delay = 0.05
    batch = await client.batches.create(input_file_id=file.id, endpoint=CHAT,
                                        completion_window="24h")
    await wait_for(lambda: len(engine.requests) >= 4, what="the batch to be running")
    assert await gw.store.delete_key("ka")
    new = await make_key(gw.store, "ka", "team-b")
    await until(lambda: accepted(new), "the new key ka to be accepted")
    engine.response_delay = 0.0
    record = await gw.store.get_batch(batch.id, None)
    assert record is not None
    owner = json.loads(record.record)["owner"]
    ledger = gw.gateway.ledger
    assert ledger is not None

    async def batch_over() -> bool:
        row = await gw.store.get_batch(batch.id, None)
        return row is not None and row.status in ("completed", "failed", "cancelled")

    await until(batch_over, "the batch to end", timeout=60.0)
    await ledger.flush()
    teams = {r.group: r.requests for r in await gw.store.usage("team", 0, 2**40, day=False)}
    # Two probe chats were team-b's own; no batch line is.
    assert teams.get("team-b", 0) <= 2, teams
    assert teams["team-a"] >= 4
    assert owner == key_id(hash_key(old))
