"""Budget use and upstream health as the control plane reads them (pure parts)."""

from __future__ import annotations

from llmgw.catalog.model import Model
from llmgw.control.traffic import upstream_health
from llmgw.scheduler.base import ProbeReport
from llmgw.store.base import StatusCount

NOW = 1_780_000_000.0
EXTERNAL = Model(name="partner-llm", upstream=["http://10.0.7.3:8000/v1",
                                               "http://10.0.7.4:8000/v1"])


def count(status: int, requests: int, ago: float, model: str = "partner-llm") -> StatusCount:
    return StatusCount(team="web", key="web-prod", model=model, status=status,
                       requests=requests, last_at=NOW - ago)


def test_three_failures_after_the_last_success_are_failing() -> None:
    h = upstream_health(EXTERNAL, [count(200, 40, 60), count(502, 3, 2)], [], NOW)
    assert h.failing
    assert h.reason is not None
    assert h.reason.startswith("its last 3 requests failed (latest 502, 2 s ago)")


def test_failures_with_a_success_since_are_a_warning() -> None:
    h = upstream_health(EXTERNAL, [count(502, 3, 60), count(200, 9, 1)], [], NOW)
    assert not h.failing
    assert h.reason == "3 of 12 requests failed in the last 5 minutes (latest 502)"


def test_two_failures_are_not_yet_failing_and_other_models_do_not_count() -> None:
    h = upstream_health(EXTERNAL, [count(502, 2, 1), count(502, 50, 1, model="other")], [],
                        NOW)
    assert not h.failing
    assert h.failures == 2


def test_probes_decide_before_requests() -> None:
    """Every upstream down in one gateway's probes is failing; one of two is a warning."""
    one = ProbeReport(probed={"partner-llm": 2}, down={"partner-llm": [
        "http://10.0.7.3:8000/v1"]})
    both = ProbeReport(probed={"partner-llm": 2}, down={"partner-llm": list(EXTERNAL.upstream)})
    h = upstream_health(EXTERNAL, [count(200, 5, 1)], [one], NOW)
    assert not h.failing
    assert h.reason == "1 of 2 upstreams fail their health probe: http://10.0.7.3:8000/v1"
    assert upstream_health(EXTERNAL, [count(200, 5, 1)], [both], NOW).failing


def test_nothing_to_say_is_no_reason() -> None:
    h = upstream_health(EXTERNAL, [count(200, 5, 1)], [ProbeReport(probed={"partner-llm": 2})],
                        NOW)
    assert (h.failing, h.reason) == (False, None)


def test_a_gateways_probe_report_names_its_down_upstreams_masked() -> None:
    """What the prober publishes: per model the upstreams it probes, and those down,
    their credentials masked."""
    from llmgw.gateway.probes import UpstreamProber
    from llmgw.gateway.routing import Balancer

    secret = "https://ops:hunter2@api.example.test/v1"
    model = Model(name="partner-llm", upstream=["http://10.0.7.3:8000/v1", secret])
    prober = UpstreamProber(Balancer(1.0, 10.0), lambda: [model], lambda: NOW)
    prober.down.add(secret)
    report = prober.report()
    assert report.probed == {"partner-llm": 2}
    assert report.down == {"partner-llm": ["https://ops:***@api.example.test/v1"]}
