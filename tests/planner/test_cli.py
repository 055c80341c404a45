"""`llmgw ctl model plan`: exit codes, JSON fields, and the path through the API."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmgw.cli import main
from llmgw.testing.fake_hub import FakeHub, FakeRepo
from tests.planner.apps import FleetBackend, plan_app, serving, two_fabric_fleet
from tests.planner.fixtures import load_config

P4_FIELDS = {"quantization", "gpus", "pool", "weights_bytes_per_gpu", "weights_bytes_total",
             "host_bytes", "kv_bytes_per_token", "max_context", "fits", "reason"}
GiB = 1024**3


@pytest.fixture
def qwen_dir(tmp_path: Path) -> Path:
    d = tmp_path / "qwen2.5-14b"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(load_config("qwen2.5-14b-instruct")))
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 29_540_067_328}, "weight_map": {}}))
    return d


def run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["ctl", *args], env=env, catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_json_lists_every_candidate_with_p4_fields(qwen_dir: Path) -> None:
    """--output json prints a list of candidates with the P4 fields, fitting first."""
    code, out, err = run("model", "plan", str(qwen_dir), "--pool", "l40s=2x46068MiB@eth",
                         "-o", "json")
    assert code == 0, err
    rows = json.loads(out)
    assert isinstance(rows, list)
    assert rows
    assert all(set(r) >= P4_FIELDS for r in rows)
    assert rows[0]["fits"] is True
    fits = [r["fits"] for r in rows]
    assert fits == sorted(fits, reverse=True)
    assert {r["pool"] for r in rows} == {"l40s"}
    assert {r["fabric"] for r in rows} == {"eth"}


def test_table_shows_model_notes_and_reasons(qwen_dir: Path) -> None:
    """The table names the model's shape and gives a reason for each non-fitting row."""
    code, out, _ = run("model", "plan", str(qwen_dir), "--pool", "t4=1x16GB")
    assert code == 0
    assert "48 layers, 40 heads, 8 KV heads" in out
    assert "WEIGHTS/GPU" in out
    assert "exceed the" in out


@pytest.mark.parametrize("pool", ["h100", "h100=-1x80GB", "h100=8x0GB", "cpu=0x0GB",
                                  "h100=8xbig"])
def test_malformed_pool_is_a_usage_error(qwen_dir: Path, pool: str) -> None:
    """A malformed --pool or a zero/negative size exits 2 with the expected form."""
    code, _, err = run("model", "plan", str(qwen_dir), "--pool", pool)
    assert code == 2
    assert "--pool" in err


def test_calibrated_weights_show_as_the_total_in_json_and_table(qwen_dir: Path) -> None:
    """Qwen2.5-14B's llama.cpp figures, 14.62 GiB at q8_0 and 8.37 at q4_K_M, are the total."""
    args = ("model", "plan", str(qwen_dir), "--pool", "h100=1x81559MiB", "-q", "q8_0",
            "-q", "q4_K_M")
    code, out, err = run(*args, "-o", "json")
    assert code == 0, err
    totals = {r["quantization"]: r["weights_bytes_total"] / GiB for r in json.loads(out)}
    assert totals == {"q8_0": pytest.approx(14.62, rel=0.01),
                      "q4_K_M": pytest.approx(8.37, rel=0.01)}
    code, out, err = run(*args)
    assert code == 0, err
    assert "WEIGHTS TOTAL" in out
    rows = {line.split()[2]: line for line in out.splitlines() if "llama.cpp" in line}
    assert "14.62GiB" in rows["q8_0"]
    assert "8.37GiB" in rows["q4_K_M"]


def test_cpu_pool_plans_llama_cpp_in_host_memory(qwen_dir: Path) -> None:
    """--pool cpu=0x64GB lists llama.cpp on the CPU node, every weight in host memory."""
    code, out, err = run("model", "plan", str(qwen_dir), "--pool", "cpu=0x64GB", "-o", "json")
    assert code == 0, err
    rows = json.loads(out)
    assert {(r["engine"], r["gpus"]) for r in rows} == {("llama.cpp", 0)}
    q4 = next(r for r in rows if r["quantization"] == "q4_K_M")
    assert q4["fits"]
    assert q4["weights_bytes_per_gpu"] == 0
    assert q4["host_bytes"] == q4["weights_bytes_total"]
    assert q4["host_bytes"] / GiB == pytest.approx(8.37, rel=0.01)
    code, out, _ = run("model", "plan", str(qwen_dir), "--pool", "cpu=0x64GB")
    assert code == 0
    assert "cpu has no GPU: vLLM needs one" in out


@pytest.mark.parametrize("params", ["0", "-5", "lots"])
def test_bad_params_is_a_usage_error(qwen_dir: Path, params: str) -> None:
    """--params must be a positive count."""
    code, _, err = run("model", "plan", str(qwen_dir), "--pool", "h=1x80GB", "--params", params)
    assert code == 2
    assert "--params" in err


def test_dir_without_config_json_exits_1(tmp_path: Path) -> None:
    """A directory without config.json fails with exit 1 naming config.json."""
    code, _, err = run("model", "plan", str(tmp_path), "--pool", "h=1x80GB", "--params", "8B")
    assert code == 1
    assert "no config.json" in err


def test_config_missing_head_counts_exits_1(tmp_path: Path) -> None:
    """A config without head counts fails with exit 1 naming the key."""
    cfg = load_config("qwen2.5-14b-instruct")
    del cfg["num_attention_heads"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    code, _, err = run("model", "plan", str(tmp_path), "--pool", "h=1x80GB", "--params", "14.7B")
    assert code == 1
    assert "num_attention_heads is missing" in err


@pytest.fixture
def fake_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    config = json.dumps(load_config("qwen2.5-14b-instruct")).encode()
    with FakeHub({
        "Qwen/Qwen2.5-14B-Instruct": FakeRepo(files={"config.json": config},
                                              safetensors={"BF16": 14_770_033_664}),
        "meta-llama/Llama-3.3-70B-Instruct": FakeRepo(files={"config.json": b"{}"},
                                                      gated=True),
    }) as hub:
        yield hub


def test_hub_repo_through_hf_endpoint(fake_hub: FakeHub) -> None:
    """A repo id is read from the Hub that HF_ENDPOINT names."""
    code, out, err = run("model", "plan", "Qwen/Qwen2.5-14B-Instruct", "--pool", "h100=1x81559MiB",
                         "-q", "q4_K_M", "-o", "json", env={"HF_ENDPOINT": fake_hub.url})
    assert code == 0, err
    (row,) = json.loads(out)
    assert row["quantization"] == "q4_K_M"
    assert row["fits"]


def test_gated_hub_repo_exits_1(fake_hub: FakeHub) -> None:
    """A gated repo fails with exit 1 and says to accept the license and set HF_TOKEN."""
    code, _, err = run("model", "plan", "meta-llama/Llama-3.3-70B-Instruct", "--pool", "h=1x80GB",
                       env={"HF_ENDPOINT": fake_hub.url})
    assert code == 1
    assert "gated" in err
    assert "HF_TOKEN" in err


def test_without_pool_asks_the_api_for_the_live_fleet(qwen_dir: Path) -> None:
    """No --pool: the CLI posts to /api/v1/plan and prints the fleet's candidates."""
    backend = FleetBackend(two_fabric_fleet())
    with serving(plan_app(backend)) as url:
        code, out, err = run("--url", url, "model", "plan", str(qwen_dir), "-o", "json")
    assert code == 0, err
    assert backend.calls == 1
    rows = json.loads(out)
    assert {r["pool"] for r in rows} == {"h100-80g/ib-a", "h100-80g/ib-b"}
    assert max(r["gpus"] for r in rows) == 8


def test_without_pool_and_no_server_says_how_to_reach_it(qwen_dir: Path) -> None:
    """No --pool and no server: exit 1 and a message naming --url."""
    code, _, err = run("--url", "http://127.0.0.1:9", "model", "plan", str(qwen_dir))
    assert code == 1
    assert "--url" in err


class _Api:
    """The two answers `ctl model plan` reads after planning on the live fleet."""

    def __init__(self, models: list[dict[str, object]], nodes: list[dict[str, object]]) -> None:
        self.answers = {"/api/v1/models": models, "/api/v1/fleet": {"nodes": nodes}}

    def get(self, path: str) -> object:
        return self.answers[path]


def test_plan_names_the_nodes_warm_for_catalog_models_of_the_repository() -> None:
    """Each catalog model of the planned repository gets a line naming the nodes holding
    its weights; a model of another repository none."""
    from llmgw.cli.plan import warm_lines

    api = _Api([{"name": "qwen", "definition": {"source": "hf://Qwen/Qwen2.5-14B@abc/"}},
                {"name": "qwen-idle", "definition": {"source": "hf://qwen/qwen2.5-14b"}},
                {"name": "llama", "definition": {"source": "hf://meta/Llama-3"}}],
               [{"name": "gpu-1", "warm": ["qwen"]}, {"name": "gpu-2", "warm": ["qwen", "llama"]},
                {"name": "gpu-3", "warm": []}])
    assert warm_lines(api, "Qwen/Qwen2.5-14B") == [  # type: ignore[arg-type]
        "warm for qwen: gpu-1, gpu-2",
        "warm for qwen-idle: none yet (`llmgw ctl model prefetch` fetches ahead)"]


def test_lora_slots_show_their_reservation_beside_the_table(qwen_dir: Path) -> None:
    """--lora-slots puts the adapters' memory in the fit and says what it is."""
    code, out, err = run("model", "plan", str(qwen_dir), "--pool", "l40s=2x46068MiB@eth",
                         "--lora-slots", "4", "--lora-rank", "16")
    assert code == 0, err
    assert "lora:       adapter slots reserve" in out
    assert "on each of 1 GPU" in out
    assert "the host cache holds" in out
    code, out, _ = run("model", "plan", str(qwen_dir), "--pool", "l40s=2x46068MiB@eth")
    assert "lora:" not in out


@pytest.mark.parametrize(("source", "matches"), [
    ("hf://Qwen/Qwen2.5-14B", True),
    ("hf://qwen/qwen2.5-14b@main", True),               # the Hub ignores case
    ("hf://Qwen/Qwen2.5-14B@refs%2Fpr%2F3", True),      # a revision holding '/'
    ("hf://Qwen/Qwen2.5-14B/model-q4_k_m.gguf", True),  # one file of the repository
    ("hf://Qwen/Qwen2.5-14B@abc/sub/model.gguf", True),
    (" hf://Qwen/Qwen2.5-14B ", True),                  # the catalog strips a source
    ("hf://Qwen/Qwen2.5-14B-Instruct", False),
    ("hf://Qwen/Qwen2.5-14B@", False),                  # refused by the catalog
    ("hf://Qwen/Qwen2.5-14B/../x", False),
    ("hf://Qwen/Qwen2.5-14B@..%2Fmain", False),
    ("hf://Qwen", False),
    ("https://mirror.example/qwen--qwen2.5-14b/main/", False),
    ("/models/Qwen/Qwen2.5-14B", False),
    (None, False),
])
def test_a_catalog_model_is_of_the_planned_repository_as_the_catalog_reads_its_source(
        source: str | None, matches: bool) -> None:
    """The warm lines take a catalog model as one of the planned repository exactly when the
    catalog's own parser reads its source as that Hub repository."""
    from llmgw.catalog.source import HfSource, parse_source
    from llmgw.cli.plan import warm_lines

    try:
        parsed = parse_source(source)
    except ValueError:
        parsed = None
    assert matches == (isinstance(parsed, HfSource)
                       and parsed.repo_id.lower() == "qwen/qwen2.5-14b")
    api = _Api([{"name": "m", "definition": {"source": source}}], [{"name": "n", "warm": ["m"]}])
    assert warm_lines(api, "Qwen/Qwen2.5-14B") == (  # type: ignore[arg-type]
        ["warm for m: n"] if matches else [])


@pytest.mark.parametrize("source", ["Qwen/Qwen2.5-14B-Instruct", "hf://Qwen/Qwen2.5-14B-Instruct",
                                    "hf://Qwen/Qwen2.5-14B-Instruct@main",
                                    " hf://Qwen/Qwen2.5-14B-Instruct@main "])
def test_plan_reads_a_hub_repository_in_every_form_the_catalog_reads(
        fake_hub: FakeHub, source: str) -> None:
    """A repository id, or an hf:// source with or without a revision, plans that repository."""
    code, out, err = run("model", "plan", source, "--pool", "h100=1x81559MiB", "-q", "q4_K_M",
                         "-o", "json", env={"HF_ENDPOINT": fake_hub.url})
    assert code == 0, err
    assert json.loads(out)[0]["fits"]


@pytest.mark.parametrize(("source", "says"), [
    ("hf://Qwen/Qwen2.5-14B-Instruct@", "has an '@' but no revision after it"),
    ("hf://Qwen/Qwen2.5-14B-Instruct/../x", "cannot hold '..'"),
    ("hf://Qwen/Qwen2.5-14B-Instruct@..%2Fmain", "is not a branch, tag or commit"),
    ("hf://Qwen", "is not hf://ORG/REPO[@REVISION][/FILE]"),
    ("hf://Qwen/Qwen2.5-14B-Instruct/config.json", "neither a directory nor a Hub repository"),
])
def test_plan_refuses_what_the_catalog_refuses_and_files(fake_hub: FakeHub, source: str,
                                                         says: str) -> None:
    """A source the catalog refuses is refused with the catalog's reason, and one file of a
    repository is not a repository to plan; the Hub is not asked."""
    code, _, err = run("model", "plan", source, "--pool", "h100=1x81559MiB",
                       env={"HF_ENDPOINT": fake_hub.url})
    assert code == 1
    assert says in err
    assert fake_hub.seen == []
