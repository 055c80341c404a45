"""deploy/grafana/llmgw.json queries only metrics that exist, so it cannot drift from
the code: every metric a panel (or a template variable) reads is one llmgw's gateway
registry exports, or one of the engine and exporter metrics the README lists under
"What operators see"."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmgw.gateway.metrics import GatewayMetrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD: dict[str, Any] = json.loads((ROOT / "deploy" / "grafana" / "llmgw.json").read_text())
README = (ROOT / "README.md").read_text()


# The series names a family of each type exposes (prometheus_client's text format).
_SAMPLES = {"counter": ("_total", "_created"), "gauge": ("",), "untyped": ("",),
            "histogram": ("_bucket", "_sum", "_count", "_created"),
            "summary": ("_sum", "_count", "_created"), "info": ("_info",)}

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_GRAFANA_VAR = re.compile(r"\$\{[^}]*\}|\$\w+")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_OFFSET = re.compile(r"\boffset\s+-?\w+|@\s*\S+")
_NUMBER = re.compile(r"(?<![A-Za-z0-9_:])\d+(?:\.\d+)?(?:[eE][+-]?\d+)?")
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right", "bool",
                       "and", "or", "unless", "offset", "inf", "nan", "Inf", "NaN"})


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers that are neither a
    function or aggregation (followed by '('), nor a keyword, nor inside a string,
    a label matcher, a range, a grouping clause or a Grafana variable."""
    text = _STRING.sub(" ", expr)
    for pattern in (_MATCHERS, _RANGE, _GRAFANA_VAR, _GROUPING, _OFFSET, _NUMBER):
        text = pattern.sub(" ", text)
    names = set()
    for m in _IDENT.finditer(text):
        if m.group() in _KEYWORDS or text[m.end():].lstrip().startswith("("):
            continue
        names.add(m.group())
    return names


def variable_metrics(query: str) -> set[str]:
    """The metric of a Grafana ``label_values(metric, label)`` query (none for the
    one-argument form, which reads every series)."""
    m = re.fullmatch(r"\s*label_values\(\s*(.+?)\s*,\s*\w+\s*\)\s*", query)
    return metric_names(m.group(1)) if m else set()


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for p in board["panels"]:
        yield p
        yield from p.get("panels", [])


def queries() -> Iterator[tuple[str, str]]:
    """(where, PromQL) of every panel target and template variable."""
    for p in panels(DASHBOARD):
        for t in p.get("targets", []):
            yield f"panel {p['title']!r} target {t['refId']}", t["expr"]
    for v in DASHBOARD["templating"]["list"]:
        if v["type"] == "query":
            query = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            yield f"variable {v['name']}", query


def exported() -> set[str]:
    """Every series name llmgw's gateway registry exports."""
    gm = GatewayMetrics(lambda: ())
    return {family.name + suffix for family in gm.registry.collect()
            for suffix in _SAMPLES[family.type]}


def readme_listed() -> set[str]:
    """The metric names in the README's table of what the dashboard reads besides llmgw."""
    section = README.split("\n## What operators see\n", 1)[1].split("\n## ", 1)[0]
    table = section.split("\n| metric | from |", 1)[1].split("\n\n", 1)[0]
    return {m.group(1) for line in table.splitlines()[2:]
            for m in [re.match(r"\|\s*`([^`]+)`", line)] if m}


def used() -> dict[str, str]:
    """Metric name → where the dashboard first reads it."""
    out: dict[str, str] = {}
    for where, query in queries():
        names = variable_metrics(query) if where.startswith("variable") else metric_names(query)
        assert names, f"{where} reads no metric: {query}"
        for name in names:
            out.setdefault(name, where)
    return out


@pytest.mark.parametrize(("expr", "names"), [
    ('sum by (model) (rate(llmgw_gateway_requests_total{model=~"$model", status=~"5.."}'
     '[$__rate_interval]))', {"llmgw_gateway_requests_total"}),
    ('histogram_quantile(0.95, sum by (model, le) (rate(vllm:time_to_first_token_seconds_bucket'
     '{model=~"$model"}[5m])))', {"vllm:time_to_first_token_seconds_bucket"}),
    ("max by (model, alloc) (vllm:kv_cache_usage_perc) or max by (model, alloc) "
     "(vllm:gpu_cache_usage_perc)", {"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"}),
    ("sum(rate(a_total[1m] offset 1h)) / on(instance) group_left(node) b * 1e3 > bool 0.5",
     {"a_total", "b"}),
    ('up{job="llmgw-engines", model=~"${model:regex}"}', {"up"}),
    ("model:llmgw_gateway_ttft_seconds:p95_5m > 10", {"model:llmgw_gateway_ttft_seconds:p95_5m"}),
])
def test_metric_names_are_read_from_promql_as_prometheus_would(expr: str, names: set[str]):
    """Functions, aggregations, grouping labels, matchers, ranges, numbers and Grafana
    variables are not metrics; every selected series name is."""
    assert metric_names(expr) == names


def test_every_metric_the_dashboard_reads_is_exported_or_listed_in_the_readme():
    """Each name a panel or variable reads comes from the gateway's registry, the README's
    list of engine and exporter metrics, or the short list not yet exported."""
    known = exported() | readme_listed()
    unknown = {name: where for name, where in used().items() if name not in known}
    assert unknown == {}, ("add the metric to the README table under 'What operators see' "
                           "if an engine or exporter publishes it, or fix the query")


def test_the_readme_lists_each_engine_metric_by_its_exposed_name():
    """The README's names are series names as scraped: prefixed by their engine or
    exporter, counters with _total and histograms by bucket, none of them llmgw's."""
    listed = readme_listed()
    assert {"vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
            "vllm:prefix_cache_hits_total", "vllm:time_to_first_token_seconds_bucket",
            "llamacpp:requests_deferred", "DCGM_FI_DEV_FB_USED", "up"} <= listed
    assert not {n for n in listed if n.startswith("llmgw_")}
    for name in listed:
        assert re.fullmatch(r"(vllm:|llamacpp:)[a-z_]+|DCGM_FI_[A-Z_]+|up", name), name


@pytest.mark.parametrize(("view", "needs"), [
    ("requests per model", {"llmgw_gateway_requests_total"}),
    ("errors per model", {"llmgw_gateway_upstream_errors_total"}),
    ("time to first token per model", {"llmgw_gateway_time_to_first_token_seconds_bucket"}),
    ("tokens per second", {"llmgw_gateway_tokens_total", "vllm:generation_tokens_total",
                           "llamacpp:tokens_predicted_total"}),
    ("replicas ready and desired", {"llmgw_gateway_healthy_replicas",
                                    "llmgw_gateway_desired_replicas"}),
    ("queueing and 429s", {"llmgw_gateway_queued_requests",
                           "llmgw_gateway_admission_rejections_total"}),
    ("KV-cache use per replica", {"vllm:kv_cache_usage_perc", "llamacpp:kv_cache_usage_ratio"}),
    ("prefix-cache hit rate per replica", {"vllm:prefix_cache_hits_total",
                                           "vllm:prefix_cache_queries_total"}),
    ("GPU memory per node", {"DCGM_FI_DEV_FB_USED"}),
])
def test_the_dashboard_shows_the_views_operators_ask_for_first(view: str, needs: set[str]):
    """Each first question has a panel reading what answers it."""
    assert needs <= set(used()), f"no panel for {view}"


def test_every_panel_follows_the_chosen_datasource_and_models():
    """Every query uses the datasource variable, and every query of llmgw's or an engine's
    metrics is narrowed to the models picked (model=~"$model")."""
    for p in panels(DASHBOARD):
        for t in p.get("targets", []):
            assert t["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
            if metric_names(t["expr"]) - {"DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"}:
                selectors = re.findall(r"[\w:]+\{[^}]*\}", t["expr"])
                assert selectors, (p["title"], t["expr"])
                assert all('model=~"$model"' in s for s in selectors), (p["title"], t["expr"])


def test_panels_do_not_overlap_and_have_unique_ids():
    """A dashboard Grafana lays out as written: no two panels share a cell or an id."""
    cells: dict[tuple[int, int], str] = {}
    ids = [p["id"] for p in panels(DASHBOARD)]
    assert len(ids) == len(set(ids))
    for p in panels(DASHBOARD):
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, (p["title"], cells[(x, y)])
                cells[(x, y)] = p["title"]
