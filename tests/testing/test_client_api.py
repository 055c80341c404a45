"""Dynamic node metadata, node affinities scored against it, allocation files and batch jobs.

Dynamic metadata: nomad/client_meta_endpoint.go ``NodeMeta.Apply`` (node:write, forwarded
to the node), client/meta_endpoint.go ``NodeMeta.Apply`` (merged over the static meta,
null unsets), nomad/structs/node.go ``NodeMetaApplyRequest.Validate`` (dotted HCL
identifiers). Affinities: scheduler/feasible/rank.go ``NodeAffinityIterator.Next`` (the
matched weights over the sum of their magnitudes, appended for every node) and
``ScoreNormalizationIterator.Next`` (the mean of the scores). Files: command/agent/
fs_endpoint.go (``cat/`` needs read-fs). Batch: scheduler/reconciler/reconcile_cluster.go
``filterOldTerminalAllocs``.
"""

from __future__ import annotations

import httpx

from llmgw.testing.fake_nomad import FakeNomad, node_cpu_64c, node_id
from tests.testing.jobspec import cpu_job, register


def test_dynamic_metadata_merges_over_the_static_and_unsets_with_null(
        http: httpx.Client, nomad: FakeNomad) -> None:
    """POST /v1/client/metadata sets and unsets keys at once on the client; the node's Meta
    on the servers shows the merge once the client's batched re-register lands, 5-10 s
    later (client/client.go watchNodeUpdates)."""
    nid = node_id("cpu-01")
    r = http.post("/v1/client/metadata", json={"NodeID": nid,
                                               "Meta": {"llmgw_cache_qwen": "abc", "rack": None}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["Meta"]["llmgw_cache_qwen"] == "abc"
    assert "rack" not in body["Meta"]
    assert body["Static"]["rack"] == "r03"
    assert body["Dynamic"] == {"llmgw_cache_qwen": "abc", "rack": None}
    assert "llmgw_cache_qwen" not in http.get(f"/v1/node/{nid}").json()["Meta"]
    nomad.advance(10)
    node = http.get(f"/v1/node/{nid}").json()
    assert node["Meta"]["llmgw_cache_qwen"] == "abc"
    assert "rack" not in node["Meta"]
    again = http.get("/v1/client/metadata", params={"node_id": nid}).json()
    assert again["Meta"] == body["Meta"]


def test_a_metadata_key_that_is_no_hcl_identifier_is_refused(
        http: httpx.Client) -> None:
    """A key with a part starting with a digit is a 400 naming the key; no Meta is a 400."""
    nid = node_id("cpu-01")
    r = http.post("/v1/client/metadata", json={"NodeID": nid, "Meta": {"llmgw.2x": "1"}})
    assert r.status_code == 400
    assert '"llmgw.2x" is invalid; metadata keys must be valid dotted hcl identifiers' in r.text
    assert http.post("/v1/client/metadata", json={"NodeID": nid}).status_code == 400


def test_writing_metadata_needs_node_write() -> None:
    """node:read reads the metadata but a write is 403; node:write may write."""
    with FakeNomad(acl_token="root") as nomad, httpx.Client(base_url=nomad.address) as http:
        nomad.apply_policy("reader", 'node { policy = "read" }')
        nomad.apply_policy("writer", 'node { policy = "write" }')
        reader, writer = nomad.create_token(["reader"]), nomad.create_token(["writer"])
        nid = node_id("cpu-01")
        body = {"NodeID": nid, "Meta": {"llmgw_cache_x": "1"}}
        assert http.get("/v1/client/metadata", params={"node_id": nid},
                        headers={"X-Nomad-Token": reader}).status_code == 200
        assert http.post("/v1/client/metadata", json=body,
                         headers={"X-Nomad-Token": reader}).status_code == 403
        assert http.post("/v1/client/metadata", json=body,
                         headers={"X-Nomad-Token": writer}).status_code == 200


def _affinity_job(count: int = 1) -> dict[str, object]:
    job = cpu_job(cores=4, memory_mb=8192, count=count)
    job["TaskGroups"][0]["Affinities"] = [{"LTarget": "${meta.llmgw_cache_tiny}",
                                           "Operand": "=", "RTarget": "abc", "Weight": 100}]
    return job


def test_an_affinity_on_dynamic_metadata_wins_over_bin_packing() -> None:
    """The busy node wins on bin-packing; once the idle node's metadata matches the affinity,
    the replica goes there, scored 1 for the affinity and 0 on the other node."""
    with FakeNomad([node_cpu_64c("cpu-01"), node_cpu_64c("cpu-02")]) as nomad, \
            httpx.Client(base_url=nomad.address) as http:
        register(http, cpu_job("llmgw-hog", cores=40, memory_mb=300_000))
        nomad.settle()
        [hog] = nomad.allocations("llmgw-hog")
        idle = "cpu-02" if hog.node_name == "cpu-01" else "cpu-01"
        register(http, _affinity_job())
        nomad.settle()
        assert [a.node_name for a in nomad.allocations("llmgw-tiny")] == [hog.node_name]
        http.delete("/v1/job/llmgw-tiny", params={"purge": "true"})
        nomad.settle()
        http.post("/v1/client/metadata", json={"NodeID": node_id(idle),
                                               "Meta": {"llmgw_cache_tiny": "abc"}})
        nomad.advance(10)                 # the client's update reaches the servers
        register(http, _affinity_job())
        nomad.settle()
        [a] = nomad.allocations("llmgw-tiny")
        assert a.node_name == idle
        scores = {s["NodeID"]: s["Scores"] for s in
                  http.get(f"/v1/allocation/{a.id}").json()["Metrics"]["ScoreMetaData"]}
        assert scores[node_id(idle)]["node-affinity"] == 1.0
        assert scores[node_id(hog.node_name)]["node-affinity"] == 0.0


def test_metadata_written_while_a_job_waits_lets_it_place() -> None:
    """A constraint on dynamic metadata no node meets queues the job; writing the key on a
    node unblocks the evaluation and the job is placed there."""
    with FakeNomad([node_cpu_64c("cpu-01")]) as nomad, \
            httpx.Client(base_url=nomad.address) as http:
        job = cpu_job(cores=4, memory_mb=8192)
        job["TaskGroups"][0]["Constraints"] = [
            {"LTarget": "${meta.llmgw_cache_tiny}", "Operand": "=", "RTarget": "abc"}]
        register(http, job)
        nomad.settle()
        assert nomad.allocations("llmgw-tiny") == []
        nomad.apply_node_meta("cpu-01", {"llmgw_cache_tiny": "abc"})
        nomad.settle()
        assert nomad.allocations("llmgw-tiny") == []      # the servers do not know yet
        nomad.advance(10)
        assert [a.node_name for a in nomad.allocations("llmgw-tiny")] == ["cpu-01"]


def test_an_allocation_file_is_read_with_read_fs_only() -> None:
    """/v1/client/fs/cat answers a file the task wrote; read-job alone is 403; a missing
    file is 404."""
    with FakeNomad(acl_token="root") as nomad, httpx.Client(base_url=nomad.address) as http:
        root = {"X-Nomad-Token": "root"}
        http.post("/v1/jobs", json={"Job": cpu_job(cores=4, memory_mb=8192)}, headers=root)
        nomad.settle()
        [a] = nomad.allocations("llmgw-tiny")
        nomad.write_alloc_file(a.id, "alloc/llmgw-fetch.json", '{"done": 5}')
        nomad.apply_policy("fs", 'namespace "default" { capabilities = ["read-fs"] }')
        nomad.apply_policy("jobs", 'namespace "default" { capabilities = ["read-job"] }')
        fs, jobs = nomad.create_token(["fs"]), nomad.create_token(["jobs"])
        url = f"/v1/client/fs/cat/{a.id}"
        got = http.get(url, params={"path": "alloc/llmgw-fetch.json"},
                       headers={"X-Nomad-Token": fs})
        assert (got.status_code, got.text) == (200, '{"done": 5}')
        assert http.get(url, params={"path": "alloc/llmgw-fetch.json"},
                        headers={"X-Nomad-Token": jobs}).status_code == 403
        assert http.get(url, params={"path": "alloc/nothing"},
                        headers={"X-Nomad-Token": fs}).status_code == 404


def _batch(job_id: str = "llmgw-prefetch-tiny", count: int = 2) -> dict[str, object]:
    job = cpu_job(job_id, cores=1, memory_mb=512, count=count)
    job["Type"] = "batch"
    job.pop("Update")
    group = job["TaskGroups"][0]
    group.pop("Services")
    group["Constraints"] = [{"Operand": "distinct_hosts", "RTarget": "true"}]
    return job


def test_a_completed_batch_allocation_is_not_placed_again() -> None:
    """A batch job's allocations run once: completed, they keep their place; a new version
    of the job runs again."""
    with FakeNomad([node_cpu_64c("cpu-01"), node_cpu_64c("cpu-02")]) as nomad, \
            httpx.Client(base_url=nomad.address) as http:
        assert register(http, _batch()).status_code == 200
        nomad.settle()
        first = nomad.allocations("llmgw-prefetch-tiny")
        assert sorted(a.node_name for a in first) == ["cpu-01", "cpu-02"]
        for a in first:
            nomad.complete_alloc(a.id)
        nomad.settle()
        assert nomad.allocations("llmgw-prefetch-tiny") == []
        every = nomad.allocations("llmgw-prefetch-tiny", include_terminal=True)
        assert {a.client_status for a in every} == {"complete"}
        assert len(every) == 2
        job = _batch()
        job["Meta"] = {"llmgw_model": "tiny", "run": "2"}
        register(http, job)
        nomad.settle()
        assert len(nomad.allocations("llmgw-prefetch-tiny")) == 2
