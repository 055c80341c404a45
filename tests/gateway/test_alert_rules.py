"""deploy/llmgw-rules.yml: the recording and alerting rules Prometheus loads are valid, pass
their unit tests (deploy/llmgw-rules_test.yml), and read only series that exist.

promtool is Debian's (the ``prometheus`` package; .ci/run installs it). Its build has no
Nomad service discovery, so it checks the rule files here and tests/nomad/test_prometheus.py
checks the scrape configuration around them.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import require_tool
from tests.gateway.test_dashboard import exported, metric_names

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
RULES = DEPLOY / "llmgw-rules.yml"
RULES_TEST = DEPLOY / "llmgw-rules_test.yml"
PROMETHEUS = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
# Prometheus's own series the rules read, from its self-scrape (job "prometheus").
PROMETHEUS_OWN = {"prometheus_sd_nomad_failures_total"}


def _rules() -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def _unit_tests() -> list[dict[str, Any]]:
    tests: list[dict[str, Any]] = yaml.safe_load(RULES_TEST.read_text())["tests"]
    return tests


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    promtool = require_tool("promtool", "apt-get install prometheus (Debian's, as .ci/run)")
    return subprocess.run([promtool, *args], cwd=DEPLOY, capture_output=True, text=True,
                          timeout=120, check=False)


def test_the_rule_files_pass_promtool_check():
    """Every rule parses, its PromQL is valid and no two rules record the same series."""
    done = _promtool("check", "rules", RULES.name)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in done.stdout


def test_every_rule_passes_its_promtool_unit_test():
    """promtool test rules: each alert fires on the input series that should page, after its
    `for` and not before, with the labels and annotations written, and not on the series
    beside it that should not; the recorded series have the values computed by hand."""
    done = _promtool("test", "rules", RULES_TEST.name)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_alert_has_a_case_that_fires_and_one_that_does_not():
    """A rule without a firing case is untested, and one without a quiet case could fire on
    anything: each alert has both, and every recorded series is read by an alert or checked
    by value."""
    firing: set[str] = set()
    quiet: set[str] = set()
    checked = " ".join(e["expr"] for t in _unit_tests() for e in t.get("promql_expr_test", []))
    for t in _unit_tests():
        for case in t.get("alert_rule_test", []):
            (firing if case["exp_alerts"] else quiet).add(case["alertname"])
    alerts = {r["alert"] for r in _rules() if "alert" in r}
    assert alerts == firing
    assert alerts == quiet
    read = " ".join(r["expr"] for r in _rules()) + " " + checked
    for rule in _rules():
        if "record" in rule:
            assert re.search(rf"(?<![\w:]){re.escape(rule['record'])}(?![\w:])",
                             read.replace(rule["expr"], "")), rule["record"]


def test_the_rules_read_only_series_llmgw_exports_or_they_record():
    """Each series an expression reads is in llmgw's registry (llmgw/gateway/README.md lists
    it), recorded by an earlier rule, or Prometheus's own, which deploy/prometheus.yml
    scrapes."""
    recorded = {r["record"] for r in _rules() if "record" in r}
    known = exported() | recorded | PROMETHEUS_OWN
    unknown = {name: rule.get("alert") or rule.get("record") for rule in _rules()
               for name in metric_names(rule["expr"]) if name not in known}
    assert unknown == {}
    assert any(c.get("static_configs") == [{"targets": ["localhost:9090"]}]
               for c in PROMETHEUS["scrape_configs"] if c["job_name"] == "prometheus")


@pytest.mark.parametrize("what", ["severity", "summary", "description"])
def test_every_alert_says_how_urgent_and_what_to_do(what: str):
    """Each alert carries a severity Alertmanager routes on (critical pages, warning opens a
    ticket), a summary naming what is wrong, and a description with the way out."""
    for rule in _rules():
        if "alert" not in rule:
            continue
        if what == "severity":
            assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
        else:
            assert rule["annotations"][what].strip(), rule["alert"]


def test_prometheus_loads_the_rules_and_the_readme_names_them():
    """deploy/prometheus.yml loads every rule file of deploy/ (read beside it), and the
    README's Prometheus section names each with its unit test."""
    shipped = {p.name for p in DEPLOY.glob("*-rules.yml")}
    assert set(PROMETHEUS["rule_files"]) == shipped == {RULES.name}
    assert yaml.safe_load(RULES_TEST.read_text())["rule_files"] == [RULES.name]
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n### Prometheus\n", 1)[1].split("\n### ", 1)[0]
    for name in (RULES.name, RULES_TEST.name):
        assert f"deploy/{name}" in section, name
