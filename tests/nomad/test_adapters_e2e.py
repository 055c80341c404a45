"""Adapters end to end on Nomad (the fake): the rendered job's vLLM serves them.

The real Nomad backend registers the base's job with the fake; each
allocation's engine task runs the simulated engine behind the job's own vLLM
command line and environment (``llmgw.testing.nomad_vllm``), so the adapter
loads only because the job enabled LoRA and set the runtime switch. The
gateway in front reads the replicas from the service registrations, and the
``openai`` client asks for two adapters of the base.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import httpx
import openai
import pytest

from llmgw.catalog.adapter import Adapter
from llmgw.catalog.build import Runtime, build_catalog
from llmgw.catalog.decode import convert
from llmgw.catalog.model import Model
from llmgw.catalog.source import Source
from llmgw.config import NomadConfig, SchedulerConfig, ServerConfig
from llmgw.scheduler.nomad.backend import NomadBackend
from llmgw.scheduler.nomad.render import job_id
from llmgw.testing.fake_nomad import FakeNomad
from llmgw.testing.fake_nomad.fixtures import node_cpu_64c
from llmgw.testing.nomad_vllm import JobWorkloads
from llmgw.testing.simengine import SimSpec
from tests.gateway.conftest import GatewayFactory, make_gateway  # noqa: F401 (a fixture)

pytestmark = pytest.mark.slow

MIRROR = "http://mirror.internal:8070"
BASE = convert({
    "name": "qwen", "source": f"{MIRROR}/qwen2-5-7b/", "engine": "vllm",
    "served_name": "Qwen/Qwen2.5-7B-Instruct", "lora": {"slots": 2, "cpu_slots": 4},
    "routing": {"policy": "least-outstanding"},
    "profiles": [{"name": "cpu", "cpu_cores": 2, "memory": "2GiB"}]}, Model)
ADAPTERS = [Adapter(name=n, base="qwen", source=Source.parse(f"{MIRROR}/adapters/{n}/"))
            for n in ("qwen-sql", "qwen-support")]
SPEC = SimSpec(step_time=0.002, prefill_per_token=0.00001, lora_load_time=0.1,
               lora_check_paths=False)


@contextlib.asynccontextmanager
async def on_nomad(replicas: int) -> AsyncIterator[tuple[NomadBackend, FakeNomad,
                                                         JobWorkloads]]:
    workloads = JobWorkloads(SPEC, [job_id("qwen")])
    nomad = FakeNomad([node_cpu_64c(f"cpu-{i:02d}") for i in (1, 2)], workloads=workloads)
    workloads.nomad = nomad
    nomad.start()
    config = ServerConfig(
        scheduler=SchedulerConfig(kind="nomad", nomad=NomadConfig(
            address=nomad.address, namespace="default", datacenters=["dc1"], timeout=5.0)),
        mirror=MIRROR, models=[BASE], adapters=ADAPTERS)
    backend = NomadBackend(config, None, reconcile_interval=0.5, check_interval=0.1,
                           watch_wait=2.0, backoff_max=2.0, lease_ttl=5.0)

    async def checks() -> None:
        passed: set[str] = set()
        async with httpx.AsyncClient(timeout=2.0) as client:
            while True:
                for alloc_id, url in workloads.urls().items():
                    if alloc_id not in passed:
                        with contextlib.suppress(httpx.HTTPError):
                            if (await client.get(f"{url}/health")).status_code == 200:
                                nomad.set_check(alloc_id, "success")
                                passed.add(alloc_id)
                await asyncio.sleep(0.1)

    runner = asyncio.create_task(checks())
    try:
        await backend.start()
        await backend.apply(build_catalog([BASE], runtime=Runtime(scheduler="nomad",
                                                                  mirror=MIRROR),
                                          adapters=ADAPTERS))
        await backend.set_demand("qwen", replicas)
        async with asyncio.timeout(120):
            while len(backend.endpoints("qwen")) < replicas:
                await backend.wait_changed(1.0)
        yield backend, nomad, workloads
    finally:
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner
        await backend.close()
        await asyncio.to_thread(nomad.close)
        await asyncio.to_thread(workloads.close)


async def test_the_rendered_job_serves_two_adapters_through_the_openai_client(
        make_gateway: GatewayFactory) -> None:  # noqa: F811 (the fixture imported above)
    """vLLM with --enable-lora and the switch; each adapter answers as itself, loaded from
    the node cache path of its mirror URL."""
    async with on_nomad(1) as (backend, _, workloads):
        [(args, env), *_] = workloads.launched.values()
        assert "--enable-lora" in args
        assert args[args.index("--max-loras") + 1] == "2"
        assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
        gw = await make_gateway([BASE], backend=backend,  # type: ignore[arg-type]
                                signal_interval="200ms")
        gw.catalogs.catalog = build_catalog(
            [BASE], runtime=Runtime(scheduler="nomad", mirror=MIRROR), adapters=ADAPTERS)
        client = gw.openai()
        for name in ("qwen-sql", "qwen-support", "qwen-sql", "qwen-support"):
            answer = await client.chat.completions.create(
                model=name, max_tokens=3, messages=[{"role": "user", "content": "hi"}])
            assert answer.model == name
        paths = []
        async with httpx.AsyncClient() as http:
            for url in backend.endpoints("qwen"):
                cards = (await http.get(f"{url}/v1/models")).json()["data"]
                paths += [c["root"] for c in cards if c.get("parent")]
        assert "/llmgw-cache/mirror.internal_8070/adapters/qwen-sql/" in paths
        assert gw.gateway.adapters.loads == 2
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(
                model="qwen-nope", max_tokens=3, messages=[{"role": "user", "content": "x"}])
