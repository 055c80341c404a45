"""Node metadata, and a node whose connection to the servers is in trouble.

The checks and stats endpoints are forwarded to the node running the allocation
(nomad/client_alloc_endpoint.go ``ClientAllocations.Checks``); errors on that
connection other than "no path to node" are 500s (command/agent/alloc_endpoint.go
``allocChecks``).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import msgspec

from llmgw.testing import FakeNomad
from tests.testing.jobspec import cpu_job, gpu_job, register

SHUTDOWN = "session open: session shutdown"


def _two_replicas(http: httpx.Client, nomad: FakeNomad) -> tuple[str, str]:
    """A replica on an H100 node and one on the L40S node."""
    register(http, gpu_job("llmgw-a", gpus=1, fabric=None))
    job = gpu_job("llmgw-b", gpus=1, fabric=None)
    job["TaskGroups"][0]["Tasks"][1]["Resources"]["Devices"] = [
        {"Name": "nvidia/gpu/NVIDIA L40S", "Count": 1}]
    register(http, job)
    nomad.settle()
    [a] = nomad.allocations("llmgw-a")
    [b] = nomad.allocations("llmgw-b")
    assert a.node_name != b.node_name
    return a.id, b.id


def test_a_broken_node_connection_is_a_500_for_its_allocations_only(
        http: httpx.Client, nomad: FakeNomad) -> None:
    """Checks and stats of allocs on the troubled node fail; the others answer."""
    a, b = _two_replicas(http, nomad)
    nomad.set_node_rpc(nomad.allocations("llmgw-a")[0].node_name, error=SHUTDOWN)
    for path in (f"/v1/allocation/{a}/checks", f"/v1/client/allocation/{a}/checks",
                 f"/v1/client/allocation/{a}/stats"):
        r = http.get(path)
        assert (r.status_code, r.text) == (500, SHUTDOWN), path
    assert http.get(f"/v1/allocation/{b}/checks").status_code == 200
    assert http.get(f"/v1/allocation/{a}").status_code == 200   # a server read: unaffected
    nomad.set_node_rpc(nomad.allocations("llmgw-a")[0].node_name)
    assert http.get(f"/v1/allocation/{a}/checks").status_code == 200


def test_a_slow_node_holds_only_its_own_requests(http: httpx.Client,
                                                 nomad: FakeNomad) -> None:
    """A wedged node's check read waits; another node's answers meanwhile; healing frees it."""
    a, b = _two_replicas(http, nomad)
    node = nomad.allocations("llmgw-a")[0].node_name
    # The held read waits 300 s; "answered meanwhile" is anything well short of that,
    # which a busy CPU cannot stretch a loopback request to.
    nomad.set_node_rpc(node, delay=300)
    answered: list[int] = []
    waiter = threading.Thread(target=lambda: answered.append(
        httpx.get(f"{nomad.address}/v1/allocation/{a}/checks", timeout=240).status_code))
    waiter.start()
    started = time.monotonic()
    assert http.get(f"/v1/allocation/{b}/checks").status_code == 200
    assert time.monotonic() - started < 60
    assert answered == []                    # still held: its node has not answered
    nomad.set_node_rpc(node)
    waiter.join(timeout=120)
    assert answered == [200]


def test_node_meta_can_change_and_constraints_follow(http: httpx.Client,
                                                     nomad: FakeNomad) -> None:
    """New meta shows on /v1/node/:id and lets a job waiting on ${meta.*} place."""
    job = cpu_job()
    job["TaskGroups"][0]["Constraints"] = [
        {"LTarget": "${meta.llmgw_role}", "Operand": "=", "RTarget": "embeddings"}]
    register(http, job)
    nomad.settle()
    assert nomad.allocations("llmgw-tiny") == []
    cpu = nomad.node("cpu-01")
    before = http.get(f"/v1/node/{cpu.id}").json()["ModifyIndex"]
    nomad.set_node("cpu-01", meta={**cpu.meta, "llmgw_role": "embeddings"})
    nomad.settle()
    node = http.get(f"/v1/node/{cpu.id}").json()
    assert node["Meta"]["llmgw_role"] == "embeddings"
    assert node["ModifyIndex"] > before
    [alloc] = nomad.allocations("llmgw-tiny")
    assert alloc.node_name == "cpu-01"


def test_deployments_list_the_namespace_oldest_first(http: httpx.Client,
                                                     nomad: FakeNomad) -> None:
    """GET /v1/deployments: every deployment of the namespace, by CreateIndex."""
    register(http, cpu_job("llmgw-one"))
    register(http, cpu_job("llmgw-two"))
    nomad.settle()
    listed = http.get("/v1/deployments").json()
    assert [d["JobID"] for d in listed] == ["llmgw-one", "llmgw-two"]
    assert listed[0]["CreateIndex"] < listed[1]["CreateIndex"]
    assert http.get("/v1/deployments", params={"namespace": "other"}).json() == []


def _with_cache(node: Any, **dirs: Any) -> Any:
    from llmgw.testing.fake_nomad.records import HostVolume

    vol = node.host_volumes["llmgw-model-cache"]
    return msgspec.structs.replace(node, host_volumes={
        "llmgw-model-cache": HostVolume(path=vol.path, **dirs)})


def test_a_task_whose_user_cannot_write_its_host_volume_fails_at_start() -> None:
    """A cache directory owned by root, mode 0755 (what `mkdir` as root makes), and a
    fetch running as the image's uid 10001: the fetch exits 1 naming the directory's
    owner and its uid, and the allocation fails; with `User` root it runs."""
    from llmgw.testing.fake_nomad import node_cpu_64c

    from .jobspec import cpu_job, register, task

    node = _with_cache(node_cpu_64c("cpu-01"), owner=0, mode=0o755)
    with FakeNomad([node], image_users={"llmgw:0.1.0": 10001}) as nomad, \
            httpx.Client(base_url=nomad.address) as http:
        register(http, cpu_job())
        nomad.settle()
        [a] = nomad.allocations("llmgw-tiny", include_terminal=True)
        assert a.client_status == "failed"
        fetch = a.task_states["fetch"]
        assert fetch.failed
        said = next(e["DisplayMessage"] for e in fetch.events if e["Type"] == "Terminated")
        assert "owned by uid 0, mode 0755; the task runs as uid 10001" in said
        job = cpu_job("llmgw-root")
        task(job, "fetch")["User"] = "root"
        register(http, job)
        nomad.settle()
        [ok] = nomad.allocations("llmgw-root")
        assert ok.client_status == "running"


def test_a_node_whose_host_volume_path_is_missing_never_registers() -> None:
    """client/client.go setupNode stats every host volume path: a missing one keeps the
    client from starting, so the node is not in the cluster at all."""
    from llmgw.testing.fake_nomad import node_cpu_64c

    with FakeNomad([node_cpu_64c("cpu-01"), _with_cache(node_cpu_64c("cpu-02"),
                                                        exists=False)]) as nomad:
        assert [n.name for n in nomad.nodes] == ["cpu-01"]
        assert "failed to validate volume llmgw-model-cache" in nomad.unstarted["cpu-02"]
