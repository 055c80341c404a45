"""Adapters end to end on Nomad (the fake): fetched onto the replica's node, for real.

Two CPU nodes, one replica of the base on each. Everything a byte of an adapter
passes through is real but Nomad: the mirror (``MirrorServer`` over a directory),
the fetch (``llmgw fetch``, run as the adapter fetch job's task says by
``FetchTasks``, into a directory standing for that node's host volume), and the
engine (the simulated vLLM behind the base job's command line, which reads an
adapter through its task's volume mount, so it finds only what was fetched onto
its own node); an adapter loads only because the job enabled LoRA and set the
runtime switch. The gateway in front holds the real Nomad backend, and the
``openai`` client asks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import pytest

from llmgw.scheduler.nomad.adapterjob import ADAPTER_PREFIX
from llmgw.scheduler.nomad.render import adapter_fetch_of, cache_key
from llmgw.testing.nomad_lora import ADAPTER_FILES, NODES, adapter, lora_on_nomad, publish
from llmgw.weights import cache

pytestmark = pytest.mark.slow

async def eventually(check: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.1)
    assert check(), what



async def ask(client: openai.AsyncOpenAI, model: str) -> str:
    answer = await client.chat.completions.create(
        model=model, max_tokens=3, messages=[{"role": "user", "content": "hi"}])
    assert answer.model == model
    return answer.model


async def test_a_runtime_added_adapter_is_fetched_onto_its_replicas_node_and_answers(
        tmp_path: Path) -> None:
    """The first requests for an adapter added at run time — two at once, too few to
    spread it (``adapterplace.SPREAD``) — have its weights fetched once from the mirror
    onto the node of the replica chosen, that node only, loaded from there, and answered
    as the adapter; the node's metadata then says it holds them."""
    async with lora_on_nomad(tmp_path, lambda root: publish(root, "qwen-sql")) as s:
        sql = adapter("qwen-sql", s.mirror)
        await s.add(sql)
        client = s.openai()
        try:
            await asyncio.gather(*(ask(client, "qwen-sql") for _ in range(2)))
            [(url, names)] = [(u, n) for u, n in (await s.loaded()).items() if n]
        finally:
            await client.close()
        assert names == ["qwen-sql"]
        node = s.node_of(url)
        other = next(n for n in NODES if n != node)
        assert (s.on_disk(node, sql) / "adapter_config.json").read_bytes() == \
            ADAPTER_FILES["adapter_config.json"]
        assert not s.on_disk(other, sql).exists()
        node_id = next(n.id for n in s.nomad.nodes if n.name == node)
        assert s.adapter_jobs() == [f"{ADAPTER_PREFIX}qwen-sql_{node_id}"]
        [(_, argv, code)] = s.fetches.ran
        assert code == 0
        assert f"{s.mirror}/adapters/qwen-sql/" in argv
        found = adapter_fetch_of(sql, s.mirror)
        assert found is not None
        await eventually(lambda: s.nomad.node_meta(node).get(cache_key("qwen-sql"))
                         == cache.tag(found[1]),
                         "the leader records the adapter on the node's metadata")
        assert cache_key("qwen-sql") not in s.nomad.node_meta(other)
        views = {v.name: v.warm for v in (await s.backend.fleet()).nodes}
        assert "qwen-sql" in views[node]
        assert "qwen-sql" not in views[other]


async def test_a_failed_adapter_fetch_answers_503_with_the_fetchs_reason(
        tmp_path: Path) -> None:
    """An adapter whose weights fail their checksum on the way to the node is answered 503
    naming the mismatch, on every replica tried — never by the base model — and a second
    request within the retry interval asks Nomad for no new fetch."""
    async with lora_on_nomad(tmp_path, lambda root: publish(root, "qwen-bad", wrong_sum=True)) as s:
        await s.add(adapter("qwen-bad", s.mirror))
        client = s.openai()
        try:
            with pytest.raises(openai.APIStatusError) as refused:
                await ask(client, "qwen-bad")
            assert refused.value.status_code == 503
            message = str(refused.value)
            assert "fetching its weights onto node" in message
            assert "sha256 mismatch" in message
            jobs = s.adapter_jobs()
            assert len(jobs) == len(NODES)   # each replica's node was tried once
            with pytest.raises(openai.APIStatusError) as again:
                await ask(client, "qwen-bad")
            assert again.value.status_code == 503
            assert s.adapter_jobs() == jobs
            assert len(s.fetches.ran) == len(NODES)
        finally:
            await client.close()
        assert all(not names for names in (await s.loaded()).values())


async def test_the_adapter_loads_on_the_replica_whose_node_holds_it(tmp_path: Path) -> None:
    """With both replicas idle, the one on the node whose metadata says it holds the
    adapter (and whose disk does) loads it, and no fetch job is registered."""
    async with lora_on_nomad(tmp_path, lambda root: publish(root, "qwen-sql")) as s:
        sql = adapter("qwen-sql", s.mirror)
        found = adapter_fetch_of(sql, s.mirror)
        assert found is not None
        warm_node = NODES[1]
        where = s.on_disk(warm_node, sql)
        where.mkdir(parents=True)
        for file, data in ADAPTER_FILES.items():
            (where / file).write_bytes(data)
        s.nomad.apply_node_meta(warm_node, {cache_key("qwen-sql"): cache.tag(found[1])})
        await asyncio.to_thread(s.nomad.advance, 10)    # the client's re-register lands
        await s.add(sql)
        await eventually(lambda: any(s.backend.adapter_warm(sql, u)
                                     for u in s.backend.endpoints("qwen")),
                         "the backend has read the node's metadata")
        client = s.openai()
        try:
            await ask(client, "qwen-sql")
        finally:
            await client.close()
        [url] = [u for u, names in (await s.loaded()).items() if names == ["qwen-sql"]]
        assert s.node_of(url) == warm_node
        assert s.adapter_jobs() == []


async def test_the_rendered_job_serves_two_adapters_through_the_openai_client(
        tmp_path: Path) -> None:
    """vLLM runs with --enable-lora and the switch; each of two adapters answers as itself,
    loaded from the node cache path of its mirror URL; an unknown one is 404."""
    def both(root: Path) -> None:
        publish(root, "qwen-sql")
        publish(root, "qwen-support")

    async with lora_on_nomad(tmp_path, both) as s:
        [(args, env), *_] = s.workloads.launched.values()
        assert "--enable-lora" in args
        assert args[args.index("--max-loras") + 1] == "2"
        assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
        await s.add(adapter("qwen-sql", s.mirror), adapter("qwen-support", s.mirror))
        client = s.openai()
        try:
            for name in ("qwen-sql", "qwen-support", "qwen-sql", "qwen-support"):
                await ask(client, name)
            with pytest.raises(openai.NotFoundError):
                await ask(client, "qwen-nope")
        finally:
            await client.close()
        paths = []
        async with httpx.AsyncClient() as http:
            for url in s.backend.endpoints("qwen"):
                cards = (await http.get(f"{url}/v1/models")).json()["data"]
                paths += [c["root"] for c in cards if c.get("parent")]
        host = s.mirror.removeprefix("http://").replace(":", "_")
        assert f"/llmgw-cache/{host}/adapters/qwen-sql/" in paths
        assert s.gateway.adapters.loads == 2


async def test_an_adapter_gone_from_a_warm_nodes_disk_is_fetched_again(tmp_path: Path) -> None:
    """The node is known to hold the adapter, but its files are gone (a sweep, a hand):
    the engine finds nothing at the path, the fetch runs again there, and the request is
    answered as the adapter."""
    async with lora_on_nomad(tmp_path, lambda root: publish(root, "qwen-sql")) as s:
        sql = adapter("qwen-sql", s.mirror)
        await s.add(sql)
        client = s.openai()
        try:
            await ask(client, "qwen-sql")
            [url] = [u for u, names in (await s.loaded()).items() if names]
            node = s.node_of(url)
            for f in s.on_disk(node, sql).iterdir():
                f.unlink()
            async with httpx.AsyncClient() as http:
                r = await http.post(f"{url}/v1/unload_lora_adapter",
                                    json={"lora_name": "qwen-sql"})
                assert r.status_code == 200
            await eventually(lambda: not s.gateway.adapters.loaded_where(),
                             "the gateway reads that no replica holds it now")
            assert s.backend.adapter_warm(sql, url)
            await ask(client, "qwen-sql")
        finally:
            await client.close()
        assert [names for names in (await s.loaded()).values() if names] == [["qwen-sql"]]
        assert [code for _, _, code in s.fetches.ran] == [0, 0]
        assert (s.on_disk(node, sql) / "adapter_config.json").exists()
