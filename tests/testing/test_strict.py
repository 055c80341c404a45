"""Request-shape strictness and Nomad's own validation, over real HTTP (docs/nomad-api.md §1, §7).

Sections marked § are those of docs/nomad-api.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from llmgw.testing import FakeNomad
from tests.testing.jobspec import S, check, cpu_job, gpu_job, register, task


@pytest.fixture
def lenient() -> Iterator[httpx.Client]:
    with FakeNomad(strict=False) as fake, httpx.Client(base_url=fake.address, timeout=30) as c:
        yield c


def test_unknown_nested_key_is_refused_in_strict_mode(http: httpx.Client) -> None:
    """A misspelt resource key ("Memory") is a 400 naming the key path, not a silent default."""
    job = cpu_job()
    task(job)["Resources"]["Memory"] = 4096
    r = register(http, job)
    assert r.status_code == 400
    assert r.text.startswith('json: unknown field "Memory" at Job.TaskGroups[0].Tasks[1].Resources')
    assert r.headers["content-type"].startswith("text/plain")


def test_unknown_key_is_dropped_in_lenient_mode(lenient: httpx.Client) -> None:
    """Like Go's decoder, lenient mode ignores the unknown key and the 300 MB default applies."""
    job = cpu_job()
    del task(job)["Resources"]["MemoryMB"]
    task(job)["Resources"]["Memory"] = 4096
    assert register(lenient, job).status_code == 200
    stored = lenient.get("/v1/job/llmgw-tiny").json()
    assert task(stored)["Resources"]["MemoryMB"] == 300
    assert "Memory" not in task(stored)["Resources"]


def test_key_case_is_exact_in_strict_mode_and_folded_in_lenient(
        http: httpx.Client, lenient: httpx.Client) -> None:
    """"MemoryMb" is refused strictly; leniently it matches MemoryMB as Go's decoder does."""
    job = cpu_job()
    res = task(job)["Resources"]
    res["MemoryMb"] = res.pop("MemoryMB")
    r = register(http, job)
    assert r.status_code == 400
    assert "case-insensitively to 'MemoryMB'" in r.text
    assert register(lenient, job).status_code == 200
    assert task(lenient.get("/v1/job/llmgw-tiny").json())["Resources"]["MemoryMB"] == 16_384


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda j: j["TaskGroups"][0].update(Count="2"),
     "json: cannot unmarshal string into Go struct field TaskGroup.Job.TaskGroups.Count "
     "of type int"),
    (lambda j: j["Meta"].update(replicas=2),
     "json: cannot unmarshal number into Go struct field Job.Job.Meta of type string"),
    (lambda j: check(j).update(Interval="10s"),
     "json: cannot unmarshal string into Go struct field "
     "ServiceCheck.Job.TaskGroups.Services.Checks.Interval of type time.Duration"),
    (lambda j: task(j)["Resources"].update(Cores=1.5),
     "json: cannot unmarshal number 1.5 into Go struct field "
     "Resources.Job.TaskGroups.Tasks.Resources.Cores of type int"),
    (lambda j: j.update(TaskGroups={"serve": {}}),
     "json: cannot unmarshal object into Go struct field Job.Job.TaskGroups of type "
     "[]*api.TaskGroup"),
])
def test_wrong_json_types_get_go_decoder_messages(http: httpx.Client, lenient: httpx.Client,
                                                  mutate: Callable[[Any], Any],
                                                  message: str) -> None:
    """Wrongly typed values are a 400 with the Go decoder's text, strict or not."""
    job = gpu_job()
    mutate(job)
    for client in (http, lenient):
        r = register(client, job)
        assert (r.status_code, r.text) == (400, message)


def test_malformed_json_and_empty_body(http: httpx.Client) -> None:
    """Syntax errors and empty bodies are 400s with Go's wording."""
    r = http.post("/v1/jobs", content=b'{"Job": {"ID": "x",}}')
    assert r.status_code == 400
    assert r.text.startswith("invalid character '}'")
    r = http.post("/v1/jobs", content=b"")
    assert (r.status_code, r.text) == (400, "Request body is empty")


def test_envelope_errors(http: httpx.Client) -> None:
    """Missing Job, missing ID and a URL/body mismatch are the agent's 400s (§1.1)."""
    r = http.post("/v1/jobs", json={})
    assert (r.status_code, r.text) == (400, "Job must be specified")
    r = http.post("/v1/jobs", json={"Job": {"Name": "x"}})
    assert (r.status_code, r.text) == (400, "Job ID hasn't been provided")
    r = http.post("/v1/job/other", json={"Job": cpu_job()})
    assert (r.status_code, r.text) == (400, "Job ID does not match name")


def test_cpu_with_cores_is_a_500_multierror(http: httpx.Client) -> None:
    """CPU alongside Cores fails validation with Nomad's nested multierror body (§7)."""
    job = cpu_job()
    task(job)["Resources"]["CPU"] = 1000
    r = register(http, job)
    assert r.status_code == 500
    inner = "1 error occurred:\n\t* Task can only ask for 'cpu' or 'cores' resource, not both.\n\n"
    t = f"1 error occurred:\n\t* {inner}\n\n"
    tg = f"1 error occurred:\n\t* Task engine validation failed: {t}\n\n"
    assert r.text == f"1 error occurred:\n\t* Task group serve validation failed: {tg}\n\n"


def test_durations_must_be_nanoseconds(http: httpx.Client, lenient: httpx.Client) -> None:
    """An Interval of 10 (meant as seconds) is refused strictly; Nomad itself reads 10ns."""
    job = gpu_job()
    check(job)["Interval"] = 10
    r = register(http, job)
    assert r.status_code == 400
    assert "Job.TaskGroups[0].Services[0].Checks[0].Interval = 10 is 10ns" in r.text
    r = register(lenient, job)
    assert r.status_code == 500
    assert "interval (10ns) cannot be lower than 1s" in r.text


def test_check_interval_under_one_second_fails_validation(http: httpx.Client) -> None:
    """A 500 ms interval is valid JSON but below Nomad's 1 s minimum: 500 on register."""
    job = gpu_job()
    check(job)["Interval"] = S // 2
    r = register(http, job)
    assert r.status_code == 500
    assert "interval (500ms) cannot be lower than 1s" in r.text


def test_validate_endpoint_answers_200_with_errors(http: httpx.Client) -> None:
    """/v1/validate/job returns the same errors as a list, with status 200 (§1.1)."""
    job = gpu_job()
    check(job)["Timeout"] = S // 10
    r = http.post("/v1/validate/job", json={"Job": job})
    assert r.status_code == 200
    body = r.json()
    assert len(body["ValidationErrors"]) == 1
    assert "timeout (100ms) is lower than required minimum timeout 1s" in body["Error"]
    ok = http.post("/v1/validate/job", json={"Job": gpu_job()}).json()
    assert ok == {"DriverConfigValidated": True, "ValidationErrors": None, "Error": "",
                  "Warnings": ""}


@pytest.mark.parametrize(("mutate", "fragment"), [
    (lambda j: check(j).update(Path="http://10.0.0.1/health"),
     "http type must have relative http path"),
    (lambda j: j["TaskGroups"][0]["Services"][0].update(Name="llama-3.1-8b"),
     'Service name must be valid per RFC 1123 and can contain only alphanumeric characters or '
     'dashes and must be no longer than 63 characters: "llama-3.1-8b"'),
    (lambda j: j["TaskGroups"][0]["Constraints"][0].pop("Operand"), "Missing constraint operand"),
    (lambda j: j["Update"].update(MinHealthyTime=600 * S, HealthyDeadline=300 * S,
                                  ProgressDeadline=0),
     "Minimum healthy time must be less than healthy deadline: 10m0s > 5m0s"),
    (lambda j: j["Update"].update(HealthyDeadline=900 * S, ProgressDeadline=600 * S),
     "Healthy deadline must be less than progress deadline: 15m0s > 10m0s"),
    (lambda j: check(j).update(Type="grpc"), 'invalid check type ("grpc"), must be one of tcp, '
                                             "http"),
])
def test_nomad_validation_rules(http: httpx.Client, mutate: Callable[[Any], Any],
                                fragment: str) -> None:
    """Each rule Nomad enforces at registration comes back as a 500 with its own words."""
    job = gpu_job()
    mutate(job)
    r = register(http, job)
    assert r.status_code == 500, r.text
    assert fragment in r.text


def test_meta_values_must_be_strings(http: httpx.Client) -> None:
    """A number in task Meta is a decode error (400), as Meta is map[string]string."""
    job = gpu_job()
    task(job)["Meta"] = {"gpus": 2}
    r = register(http, job)
    assert r.status_code == 400
    assert "Go struct field Task.Job.TaskGroups.Tasks.Meta of type string" in r.text


def test_service_without_provider_is_consul_and_never_places(
        http: httpx.Client, nomad: FakeNomad) -> None:
    """Omitting Provider registers fine but adds the Consul constraint, so nothing places (§9.1)."""
    r = register(http, gpu_job(provider=None, fabric=None))
    assert r.status_code == 200
    nomad.settle()
    stored = http.get("/v1/job/llmgw-qwen").json()
    group = stored["TaskGroups"][0]
    assert group["Services"][0]["Provider"] == "consul"
    assert {"LTarget": "${attr.consul.version}", "RTarget": ">= 1.8.0",
            "Operand": "semver"} in group["Constraints"]
    ev = http.get(f"/v1/evaluation/{r.json()['EvalID']}").json()
    metric = ev["FailedTGAllocs"]["serve"]
    assert metric["ConstraintFiltered"] == {"${attr.consul.version} semver >= 1.8.0": 5}
    assert http.get("/v1/services").json() == []
    assert http.get("/v1/job/llmgw-qwen/allocations").json() == []
