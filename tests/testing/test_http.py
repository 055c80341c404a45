"""HTTP conventions: headers, blocking queries, error texts, ACLs, outages, faults (§4.3, §7).

Sections marked § are those of docs/nomad-api.md.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import httpx
import pytest

from llmgw.testing import FakeNomad
from tests.testing.jobspec import cpu_job, gpu_job, register


def test_read_and_write_headers(http: httpx.Client) -> None:
    """Reads carry index/leader/contact headers; writes carry X-Nomad-Index."""
    r = http.get("/v1/nodes")
    assert r.headers["X-Nomad-KnownLeader"] == "true"
    assert r.headers["X-Nomad-LastContact"] == "0"
    assert int(r.headers["X-Nomad-Index"]) >= 5
    w = register(http, cpu_job())
    assert w.headers["X-Nomad-Index"] == str(w.json()["Index"])
    assert w.json()["KnownLeader"] is False


def test_blocking_query_wakes_on_a_service_change(http: httpx.Client, nomad: FakeNomad) -> None:
    """A long poll on /v1/service returns as soon as a registration appears (§4.3)."""
    first = http.get("/v1/service/llmgw-tiny")
    index = int(first.headers["X-Nomad-Index"])
    result: dict[str, httpx.Response] = {}

    # A poll that missed the change would return after the whole 300 s wait; waking on
    # it is anything well short of that, however busy the CPU.
    def poll() -> None:
        with httpx.Client(base_url=nomad.address, timeout=360) as c:
            result["r"] = c.get("/v1/service/llmgw-tiny",
                                params={"index": index, "wait": "300s"})
    thread = threading.Thread(target=poll)
    started = time.monotonic()
    thread.start()
    assert http.get("/v1/status/leader").status_code == 200  # other requests still served
    register(http, cpu_job())
    thread.join(timeout=120)
    assert not thread.is_alive()
    assert time.monotonic() - started < 120
    assert int(result["r"].headers["X-Nomad-Index"]) > index
    assert [s["JobID"] for s in result["r"].json()] == ["llmgw-tiny"]


def test_blocking_query_times_out_on_wait(http: httpx.Client) -> None:
    """With nothing changing, the query returns after ``wait`` with the same index."""
    index = int(http.get("/v1/services").headers["X-Nomad-Index"])
    started = time.monotonic()
    r = http.get("/v1/services", params={"index": index, "wait": "1s"})
    elapsed = time.monotonic() - started
    assert r.status_code == 200
    assert int(r.headers["X-Nomad-Index"]) == index
    assert 1.0 <= elapsed < 60


def test_blocking_parameters(http: httpx.Client) -> None:
    """Bad wait/index are 400s; index 0 never blocks."""
    r = http.get("/v1/nodes", params={"index": 1, "wait": "10"})
    assert (r.status_code, r.text) == (400, "Invalid wait time")
    r = http.get("/v1/nodes", params={"index": "-3"})
    assert (r.status_code, r.text) == (400, "Invalid index")
    started = time.monotonic()
    # Blocking would take the whole 300 s wait; not blocking is anything well short of it.
    assert http.get("/v1/nodes", params={"index": 0, "wait": "300s"}).status_code == 200
    assert time.monotonic() - started < 60


@pytest.mark.parametrize(("method", "path", "status", "body"), [
    ("GET", "/v1/job/ghost", 404, "job not found"),
    ("GET", "/v1/job/ghost/summary", 404, "job not found"),
    ("GET", "/v1/job/ghost/scale", 404, "job not found"),
    ("GET", "/v1/job/ghost/services", 404, "job not found"),
    ("GET", "/v1/job/ghost/versions", 404, "job versions not found"),
    ("GET", "/v1/job/ghost/allocations", 200, "[]"),
    ("GET", "/v1/job/ghost/evaluations", 200, "[]"),
    ("GET", "/v1/job/ghost/deployments", 200, "[]"),
    ("GET", "/v1/job/ghost/deployment", 200, "null"),
    ("GET", "/v1/allocation/00000000-0000-0000-0000-000000000000", 404, "alloc not found"),
    ("GET", "/v1/allocation/00000000-0000-0000-0000-000000000000/checks", 404,
     'Unknown allocation "00000000-0000-0000-0000-000000000000"'),
    ("GET", "/v1/allocation/x/bogus", 404, "resource not found"),
    ("GET", "/v1/node/00000000-0000-0000-0000-000000000000", 404, "node not found"),
    ("GET", "/v1/evaluation/nope", 404, "eval not found"),
    ("GET", "/v1/deployment/nope", 404, "deployment not found"),
    ("GET", "/v1/service/ghost", 200, "[]"),
    ("DELETE", "/v1/jobs", 405, "Invalid method"),
])
def test_unknown_things_answer_as_nomad_does(http: httpx.Client, method: str, path: str,
                                             status: int, body: str) -> None:
    """Unknown jobs, allocs, nodes and evals get Nomad's inconsistent answers (§7, §9.11)."""
    r = http.request(method, path)
    assert (r.status_code, r.text) == (status, body)


def test_unknown_job_on_scale_post_and_delete(http: httpx.Client) -> None:
    """POST /scale on an unknown job is 404 with the ID; DELETE is 200 with an empty EvalID."""
    r = http.post("/v1/job/ghost/scale", json={"Count": 1, "Target": {"Group": "g"}})
    assert (r.status_code, r.text) == (404, 'job "ghost" not found')
    r = http.delete("/v1/job/ghost")
    assert r.status_code == 200
    assert r.json()["EvalID"] == ""


def test_acl_tokens() -> None:
    """No token is "Permission denied", a wrong one "ACL token not found", both 403."""
    with FakeNomad(acl_token="s3cret") as nomad, httpx.Client(base_url=nomad.address) as c:
        r = c.get("/v1/jobs")
        assert (r.status_code, r.text) == (403, "Permission denied")
        r = c.get("/v1/jobs", headers={"X-Nomad-Token": "wrong"})
        assert (r.status_code, r.text) == (403, "ACL token not found")
        assert c.get("/v1/jobs", headers={"X-Nomad-Token": "s3cret"}).status_code == 200
        assert c.get("/v1/nodes", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert c.get("/v1/status/leader").json() == "127.0.0.1:4647"


def test_outage_and_recovery(http: httpx.Client, nomad: FakeNomad) -> None:
    """stop() refuses connections; start() serves again on the same port with the same state."""
    register(http, cpu_job())
    nomad.settle()
    port = nomad.port
    nomad.stop()
    with pytest.raises(httpx.TransportError), httpx.Client(base_url=nomad.address) as c:
        c.get("/v1/jobs")
    nomad.start()
    assert nomad.port == port
    with httpx.Client(base_url=nomad.address) as c:
        assert [j["ID"] for j in c.get("/v1/jobs").json()] == ["llmgw-tiny"]


def test_stop_ends_a_pending_blocking_query(http: httpx.Client, nomad: FakeNomad) -> None:
    """An outage cuts an open long poll instead of leaving it hanging."""
    index = int(http.get("/v1/services").headers["X-Nomad-Index"])
    outcome: list[object] = []

    def poll() -> None:
        try:
            with httpx.Client(base_url=nomad.address, timeout=60) as c:
                outcome.append(c.get("/v1/services", params={"index": index, "wait": "55s"}))
        except httpx.TransportError as exc:
            outcome.append(exc)
    thread = threading.Thread(target=poll)
    thread.start()
    deadline = time.monotonic() + 30
    while not any(r.path == "/v1/services" and r.query.get("index") for r in nomad.requests):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    nomad.stop()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert outcome


def test_injected_faults_and_request_log(http: httpx.Client, nomad: FakeNomad) -> None:
    """inject() answers with any status/body; requests records what was sent."""
    nomad.inject("GET", r"^/v1/jobs$", 500, "rpc error: No cluster leader", times=1)
    nomad.inject("*", r"/v1/nodes", 200, b"<html>gateway</html>",
                 headers={"Content-Type": "text/html"})
    r = http.get("/v1/jobs")
    assert (r.status_code, r.text) == (500, "rpc error: No cluster leader")
    assert http.get("/v1/jobs").status_code == 200  # times=1 spent
    r = http.get("/v1/nodes")
    assert r.text == "<html>gateway</html>"
    assert r.headers["content-type"] == "text/html"
    nomad.clear_injections()
    register(http, cpu_job(), EnforceIndex=False)
    sent = [q for q in nomad.requests if q.method == "POST"][-1]
    assert sent.path == "/v1/jobs"
    assert sent.body["Job"]["ID"] == "llmgw-tiny"
    http.get("/v1/allocations", params={"resources": "true"})
    assert nomad.requests[-1].query == {"resources": "true"}


def test_namespaces_and_regions(http: httpx.Client) -> None:
    """Jobs live in their namespace; an unknown one fails validation; other regions 500."""
    with FakeNomad(namespaces=("default", "llm")) as nomad, \
            httpx.Client(base_url=nomad.address) as c:
        assert c.post("/v1/jobs?namespace=llm", json={"Job": cpu_job()}).status_code == 200
        assert c.get("/v1/jobs").json() == []
        assert [j["ID"] for j in c.get("/v1/jobs?namespace=llm").json()] == ["llmgw-tiny"]
        assert len(c.get("/v1/jobs?namespace=*").json()) == 1
        r = c.post("/v1/jobs?namespace=nope", json={"Job": cpu_job()})
        assert r.status_code == 500
        assert 'job "llmgw-tiny" is in nonexistent namespace "nope"' in r.text
        r = c.get("/v1/jobs?region=eu")
        assert (r.status_code, r.text) == (500, "No path to region")


def test_allocation_list_filters_and_resources(http: httpx.Client, nomad: FakeNomad) -> None:
    """/v1/allocations filters on NodeID/JobID and adds AllocatedResources on request."""
    register(http, cpu_job())
    register(http, gpu_job())
    nomad.settle()
    [gpu] = nomad.allocations("llmgw-qwen")
    listed = http.get("/v1/allocations", params={
        "resources": "true", "filter": f'NodeID == "{gpu.node_id}"'}).json()
    assert [a["JobID"] for a in listed] == ["llmgw-qwen"]
    assert listed[0]["AllocatedResources"]["Tasks"]["engine"]["Devices"]
    by_job = http.get("/v1/allocations", params={"filter": 'JobID == "llmgw-tiny"'}).json()
    assert [a["JobID"] for a in by_job] == ["llmgw-tiny"]
    assert "AllocatedResources" not in by_job[0]
    nodes = http.get("/v1/nodes", params={"resources": "true"}).json()
    assert all("NodeResources" in n and "ReservedResources" in n for n in nodes)
    full = http.get(f"/v1/node/{gpu.node_id}/allocations").json()
    assert [a["ID"] for a in full] == [gpu.id]
    assert "Job" in full[0]


def test_python_nomad_talks_to_the_fake(nomad: FakeNomad) -> None:
    """Python-nomad's wrapped calls work against the fake, so the backend can use both."""
    import nomad as python_nomad

    client = python_nomad.Nomad(address=nomad.address, timeout=30)
    client.jobs.register_job({"Job": cpu_job()})
    nomad.settle()
    assert [j["ID"] for j in client.jobs.get_jobs()] == ["llmgw-tiny"]
    allocs = client.job.get_allocations("llmgw-tiny")
    assert allocs[0]["ClientStatus"] == "running"
    bad = cpu_job()
    bad["TaskGroups"][0]["Tasks"][1]["Resources"]["CPU"] = 100
    with pytest.raises(python_nomad.api.exceptions.BaseNomadException) as err:
        client.jobs.register_job({"Job": bad})
    assert err.value.nomad_resp.status_code == 500


def test_command_line_entry_point() -> None:
    """``python -m llmgw.testing.fake_nomad --port 0`` serves the default fleet by hand."""
    with subprocess.Popen([sys.executable, "-m", "llmgw.testing.fake_nomad", "--port", "0"],
                          stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            address = line.split(" on ")[1].split(" ")[0]
            with httpx.Client(base_url=address, timeout=30) as c:
                assert len(c.get("/v1/nodes").json()) == 5
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    assert proc.returncode == 0


def test_not_found_reads_still_carry_the_index(http: httpx.Client) -> None:
    """A 404 from a read keeps X-Nomad-Index, as setMeta runs before the handler's 404."""
    r = http.get("/v1/job/ghost")
    assert r.status_code == 404
    assert int(r.headers["X-Nomad-Index"]) >= 1


def test_force_evaluate(http: httpx.Client, nomad: FakeNomad) -> None:
    """POST /v1/job/:id/evaluate queues a new evaluation; an unknown job is a 500."""
    register(http, cpu_job())
    nomad.settle()
    r = http.post("/v1/job/llmgw-tiny/evaluate")
    assert r.status_code == 200
    nomad.settle()
    ev = http.get(f"/v1/evaluation/{r.json()['EvalID']}").json()
    assert (ev["Status"], ev["TriggeredBy"]) == ("complete", "job-register")
    r = http.post("/v1/job/ghost/evaluate")
    assert (r.status_code, r.text) == (500, "job not found")
