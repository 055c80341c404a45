"""When services register and when check_restart's grace starts: group vs task services.

Group services register in the alloc runner's Prerun, task services in their task's
Poststart; check_restart watches a check from that moment
(client/serviceregistration/watcher.go ``Watch``).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from llmgw.testing import FakeNomad
from tests.testing.jobspec import S, cpu_job, register, task

GRACE = 600


@pytest.fixture
def manual() -> Iterator[tuple[FakeNomad, httpx.Client]]:
    """A fake whose clients start allocations only when told (auto_run off)."""
    with FakeNomad(auto_run=False) as nomad, \
            httpx.Client(base_url=nomad.address, timeout=30) as client:
        yield nomad, client


def _job(*, on_task: bool) -> dict[str, Any]:
    job = cpu_job()
    group = job["TaskGroups"][0]
    service = copy.deepcopy(group["Services"][0])
    service["Checks"][0]["CheckRestart"] = {"Limit": 3, "Grace": GRACE * S}
    if on_task:
        del group["Services"]
        task(job)["Services"] = [service]
    else:
        group["Services"] = [service]
    return job


def _started(nomad: FakeNomad, http: httpx.Client, *, on_task: bool) -> str:
    register(http, _job(on_task=on_task))
    nomad.settle()
    [alloc] = nomad.allocations("llmgw-tiny")
    nomad.run_alloc(alloc.id, through_prestart=False)   # the fetch is downloading
    return alloc.id


def _restarts(http: httpx.Client, alloc_id: str) -> dict[str, int]:
    states = http.get(f"/v1/allocation/{alloc_id}").json()["TaskStates"]
    return {name: s["Restarts"] for name, s in states.items()}


def test_a_group_service_registers_before_the_prestart_task_has_finished(
        manual: tuple[FakeNomad, httpx.Client]) -> None:
    """Prerun: the group's registration exists while the fetch still runs."""
    nomad, http = manual
    alloc_id = _started(nomad, http, on_task=False)
    [reg] = http.get("/v1/service/llmgw-tiny").json()
    assert reg["AllocID"] == alloc_id
    states = http.get(f"/v1/allocation/{alloc_id}").json()["TaskStates"]
    assert (states["fetch"]["State"], states["engine"]["State"]) == ("running", "pending")


def test_a_task_service_registers_only_once_its_task_has_started(
        manual: tuple[FakeNomad, httpx.Client]) -> None:
    """Poststart: nothing is registered during the fetch; the engine's start registers it."""
    nomad, http = manual
    alloc_id = _started(nomad, http, on_task=True)
    assert http.get("/v1/service/llmgw-tiny").json() == []
    [result] = http.get(f"/v1/allocation/{alloc_id}/checks").json().values()
    assert (result["Status"], result["Task"]) == ("pending", "engine")   # observed anyway
    nomad.finish_prestart(alloc_id)
    [reg] = http.get("/v1/service/llmgw-tiny").json()
    assert reg["ID"] == f"_nomad-task-{alloc_id}-engine-llmgw-tiny-http"


def test_a_group_check_restart_grace_expiring_restarts_the_fetch_mid_download(
        manual: tuple[FakeNomad, httpx.Client]) -> None:
    """The grace ran from Prerun, so it expires during the download and restarts it."""
    nomad, http = manual
    alloc_id = _started(nomad, http, on_task=False)
    nomad.advance(GRACE - 1)
    assert _restarts(http, alloc_id) == {"fetch": 0, "engine": 0}
    nomad.advance(2 * 10 + 2)                # Limit 3: two more intervals of failing
    assert _restarts(http, alloc_id) == {"fetch": 1, "engine": 0}
    events = http.get(f"/v1/allocation/{alloc_id}").json()["TaskStates"]["fetch"]["Events"]
    assert events[-1]["Type"] == "Restart Signaled"
    assert events[-1]["DisplayMessage"] == 'healthcheck: check "ready" unhealthy'


def test_a_task_check_restart_grace_starts_with_the_task(
        manual: tuple[FakeNomad, httpx.Client]) -> None:
    """During the download nothing is watched; after the engine starts, its grace counts."""
    nomad, http = manual
    alloc_id = _started(nomad, http, on_task=True)
    nomad.advance(3 * GRACE)
    assert _restarts(http, alloc_id) == {"fetch": 0, "engine": 0}
    nomad.finish_prestart(alloc_id)
    nomad.advance(GRACE + 2 * 10 - 1)
    assert _restarts(http, alloc_id) == {"fetch": 0, "engine": 0}
    nomad.advance(2)
    assert _restarts(http, alloc_id) == {"fetch": 0, "engine": 1}


def test_a_passing_check_is_never_restarted(manual: tuple[FakeNomad, httpx.Client]) -> None:
    """A check that passes inside its grace resets the count."""
    nomad, http = manual
    alloc_id = _started(nomad, http, on_task=True)
    nomad.finish_prestart(alloc_id)
    nomad.advance(GRACE / 2)
    nomad.set_check(alloc_id, "success")
    nomad.advance(10 * GRACE)
    assert _restarts(http, alloc_id) == {"fetch": 0, "engine": 0}


def test_restarts_past_the_restart_policy_fail_the_allocation(
        manual: tuple[FakeNomad, httpx.Client]) -> None:
    """Each restart restarts the grace; past Attempts the task fails its allocation."""
    nomad, http = manual
    alloc_id = _started(nomad, http, on_task=True)
    nomad.finish_prestart(alloc_id)
    for _ in range(3):                       # the default policy allows two restarts
        nomad.advance(GRACE + 2 * 10 + 1)
    assert http.get(f"/v1/allocation/{alloc_id}").json()["ClientStatus"] == "failed"
