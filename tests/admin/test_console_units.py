"""The console's pure parts: live figures from metric samples, budget gauges, the guided
form's YAML, the mirror's holdings."""

from __future__ import annotations

import math

import pytest

from llmgw.admin.console.gauges import gauges, key_costs
from llmgw.admin.console.guided import definition_text, form_field
from llmgw.admin.console.livefigures import Sampler, Snapshot, fold, live, quantile
from llmgw.tenancy import Limits
from llmgw.weights.mirror.listing import holdings
from llmgw.weights.mirror.uses import MirrorFile, Use

DAY = 1_796_256_000.0   # 2026-12-03 00:00 UTC


def samples(ok: float, refused: float, fast: float, slow: float,
            prompt: float = 0.0, cached: float = 0.0) -> list[tuple[str, dict[str, str], float]]:
    h = "llmgw_gateway_time_to_first_token_seconds_bucket"
    return [
        ("llmgw_gateway_requests_total", {"model": "chat", "status": "200"}, ok),
        ("llmgw_gateway_requests_total", {"model": "chat", "status": "502"}, refused),
        ("llmgw_gateway_requests_total", {"model": "", "status": "429"}, 3.0),
        (h, {"model": "chat", "le": "0.1"}, fast),
        (h, {"model": "chat", "le": "1.0"}, fast + slow),
        (h, {"model": "chat", "le": "+Inf"}, fast + slow),
        ("llmgw_gateway_tokens_total", {"model": "chat", "kind": "prompt"}, prompt),
        ("llmgw_gateway_tokens_total", {"model": "chat", "kind": "cached"}, cached),
    ]


def test_rates_error_shares_and_quantiles_are_over_the_window_not_the_process_life() -> None:
    """Between two samplings 10 s apart, 20 requests of which 5 were 502 give 2 req/s
    and a 25% error share; the TTFT median is in the window's buckets only."""
    old = fold(samples(ok=100, refused=0, fast=100, slow=0), at=0.0)
    new = fold(samples(ok=115, refused=5, fast=100, slow=20, prompt=1000, cached=250),
               at=10.0)
    f = live("chat", new.models["chat"], old.models["chat"], 10.0)
    assert f.requests_per_s == pytest.approx(2.0)
    assert f.errors == {"502": pytest.approx(0.25)}
    assert f.ttft_p50 is not None
    assert 0.1 < f.ttft_p50 <= 1.0          # all 20 of the window were slow
    assert f.prefix_hit_rate == pytest.approx(0.25)
    assert "" in new.models                  # refused before a model was read: kept


def test_without_an_older_sampling_there_are_no_rates() -> None:
    snap = fold(samples(ok=10, refused=0, fast=10, slow=0), at=5.0)
    f = live("chat", snap.models["chat"], None, None)
    assert f.requests_per_s is None
    assert f.tokens_per_s is None
    assert f.ttft_p50 is not None
    assert f.ttft_p50 <= 0.1


def test_quantile_interpolates_within_a_bucket_and_stops_at_infinity() -> None:
    assert quantile(0.5, {0.1: 0.0, 1.0: 10.0, math.inf: 10.0}) == pytest.approx(0.55)
    assert quantile(0.99, {1.0: 1.0, math.inf: 10.0}) == 1.0
    assert quantile(0.5, {math.inf: 0.0}) is None


def test_the_sampler_compares_with_a_sampling_a_window_back() -> None:
    s = Sampler()
    assert s.add(Snapshot(at=0.0, models={})) is None
    assert s.add(Snapshot(at=0.5, models={})) is None      # closer than MIN_GAP
    assert s.add(Snapshot(at=10.0, models={})).at == 0.0   # type: ignore[union-attr]
    s.add(Snapshot(at=40.0, models={}))
    assert s.add(Snapshot(at=45.0, models={})).at == 10.0  # type: ignore[union-attr]


def test_a_gauge_is_over_at_its_limit_and_resets_at_the_periods_end() -> None:
    """212,764 of 200,000 tokens a day is over, resetting at the next UTC midnight."""
    [g] = gauges(Limits(tokens_per_day=200_000), {"day": 212_764}, {}, DAY + 3600)
    assert g.state == "over"
    assert g.percent == 100
    assert g.resets_at == DAY + 86400
    [c] = gauges(Limits(cost_per_month=10.0), {}, {"month": 8.5}, DAY)
    assert c.state == "near"


def test_a_keys_cost_is_its_teams_shared_by_tokens() -> None:
    shares = key_costs({"ml": 3.0}, [("ml", "a", 100), ("ml", "b", 200), ("web", "c", 5)])
    assert shares == {"a": pytest.approx(1.0), "b": pytest.approx(2.0), "c": 0.0}


def test_the_guided_form_becomes_the_yaml_an_operator_would_write() -> None:
    text = definition_text({"name": "m", "source": "hf://a/b", "engine": "vllm",
                            "gpu_class": "h100-80g", "gpus": "2", "context": "",
                            "cpu_cores": "8", "memory": "32GiB", "min": "1", "max": ""})
    assert text == ("name: m\nsource: hf://a/b\nengine: vllm\nprofiles:\n- name: h100-80g\n"
                    "  gpu_class: h100-80g\n  gpus: 2\n  cpu_cores: 8\n  memory: 32GiB\n"
                    "scaling:\n  min: 1\n")
    assert form_field("profiles[0].gpus") == "gpus"
    assert form_field("scaling.max") == "max"
    assert form_field("source") == "source"


def test_mirror_holdings_name_users_unused_and_missing_paths() -> None:
    files = [MirrorFile(path="coder/v1/a.gguf", size=10), MirrorFile(path="old/v0/b", size=7),
             MirrorFile(path="old/v0/c", size=3)]
    uses = [Use(model="coder", source="http://m/coder/v1/a.gguf", path="coder/v1/a.gguf"),
            Use(model="gone", source="http://m/gone/v2", path="gone/v2")]
    held, missing = holdings(files, uses)
    assert [(h.path, h.size, h.users) for h in held] == [
        ("old/v0", 10, []), ("coder/v1", 10, ["coder"])]
    assert [m.model for m in missing] == ["gone"]
