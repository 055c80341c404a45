"""``llmgw ctl`` against a real API on loopback: output, and exit codes 0 / 1 / 2."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from click.testing import CliRunner

from llmgw.api.app import create_app
from llmgw.catalog.model import Model, Profile, Scaling
from llmgw.catalog.source import Source
from llmgw.catalog.units import Size
from llmgw.cli import main
from llmgw.config import AdminToken, ServerConfig
from llmgw.control.context import AppContext
from llmgw.control.reservation import reservation_checker
from llmgw.modelsvc import ModelService
from llmgw.store import open_store
from tests.planner.gguf_headers import gemma_gguf

from .conftest import GPU_CLASSES, RecordingBackend

TOKEN = "t0ken-ops"
DECLARED = Model(name="prod-chat", source=Source.parse("/m.gguf"), engine="llama.cpp",
                 scaling=Scaling(min=2),
                 profiles=[Profile(name="cpu", cpu_cores=2, memory=Size.parse("4GiB"))])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def api_url(store_url: str) -> Iterator[str]:
    """A real control API served by uvicorn in a thread."""
    config = ServerConfig(admin_tokens=[AdminToken(name="ops", token=TOKEN)],
                          gpu_classes=GPU_CLASSES, models=[DECLARED])
    store = open_store(store_url)
    backend = RecordingBackend()
    svc = ModelService(config.models, GPU_CLASSES, store, placement_check=backend.check_placement)
    app = create_app(AppContext(config=config, models=svc, backend=backend, store=store,
                                reservation_check=reservation_checker(embedded=True)))

    async def startup() -> None:
        await store.open()
        await svc.load()

    async def shutdown() -> None:
        await store.close()

    app.on_startup.append(startup)
    app.on_shutdown.append(shutdown)
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error",
                                           lifespan="on"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "the API did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(30)


def ctl(url: str, *args: str, token: str | None = TOKEN) -> tuple[int, str]:
    env = {"LLMGW_URL": url, "LLMGW_ADMIN_TOKEN": token or ""}
    result = CliRunner().invoke(main, ["ctl", *args], env=env, catch_exceptions=False)
    return result.exit_code, result.output


MODEL_FILE = """\
name: trial
source: /models/trial.gguf
engine: llama.cpp
profiles:
  - name: cpu
    gpus: 0
    cpu_cores: 4
    memory: 8GiB
"""


def test_add_list_show_scale_remove_round_trip(api_url: str, tmp_path: Path) -> None:
    """The everyday flow works and every step exits 0."""
    f = tmp_path / "trial.yaml"
    f.write_text(MODEL_FILE)
    code, out = ctl(api_url, "model", "add", "-f", str(f), "--skip-source-check")
    assert code == 0, out
    assert "added trial" in out
    code, out = ctl(api_url, "model", "list")
    assert code == 0
    assert "trial" in out
    assert "runtime" in out
    assert "ops" in out
    code, out = ctl(api_url, "model", "list", "--output", "json")
    assert {m["name"] for m in json.loads(out)} == {"prod-chat", "trial"}
    code, out = ctl(api_url, "scale", "trial", "--min", "3")
    assert (code, out.strip()) == (0, "trial: scaling 3 (max 3)")
    code, out = ctl(api_url, "model", "resources", "trial", "--cpu-cores", "6", "--memory",
                    "12GiB")
    assert code == 0, out
    code, out = ctl(api_url, "model", "show", "trial")
    assert "cpu_cores: 6" in out
    assert "added by ops" in out
    code, out = ctl(api_url, "model", "remove", "trial")
    assert (code, out.strip()) == (0, "removed trial")


def test_a_reservation_below_the_need_is_added_with_a_warning_on_stderr(
        api_url: str, tmp_path: Path) -> None:
    """After "added ...", each warning is printed on stderr; the exit code is 0."""
    gguf = tmp_path / "gemma.gguf"
    gguf.write_bytes(gemma_gguf(tail=0))
    f = tmp_path / "gemma.yaml"
    f.write_text(MODEL_FILE.replace("/models/trial.gguf", str(gguf))
                 .replace("memory: 8GiB", "memory: 256MiB"))
    env = {"LLMGW_URL": api_url, "LLMGW_ADMIN_TOKEN": TOKEN}
    result = CliRunner().invoke(main, ["ctl", "model", "add", "-f", str(f)], env=env)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("added trial; scaling")
    assert result.stderr == (
        "warning: profile cpu reserves 256.0MiB but one replica needs 1008.7MiB of host "
        "memory (weights 405.2MiB, KV cache for 4096 tokens 72.0MiB, runtime 531.5MiB); raise "
        "memory to at least 1008.7MiB, or lower context\n")
    assert result.output.index("added trial") < result.output.index("warning: profile cpu")


def test_refusals_exit_1_with_the_servers_message(api_url: str) -> None:
    """A declared model cannot be scaled; the message says where to edit."""
    code, out = ctl(api_url, "scale", "prod-chat", "--min", "5")
    assert code == 1
    assert "declared in server.yaml" in out
    assert "reverts on the next restart" in out
    code, out = ctl(api_url, "model", "remove", "ghost")
    assert code == 1
    assert "no model named 'ghost'" in out


def test_a_bad_model_file_exits_1_naming_the_file_and_field(api_url: str,
                                                            tmp_path: Path) -> None:
    """The add file is checked locally with the same decoder as server.yaml."""
    f = tmp_path / "bad.yaml"
    f.write_text(MODEL_FILE.replace("gpus: 0", "gpus: none"))
    code, out = ctl(api_url, "model", "add", "-f", str(f))
    assert code == 1
    assert f"{f}: profiles[0].gpus: Expected `int`" in out


def test_usage_errors_exit_2(api_url: str) -> None:
    """A missing option or a negative count is a usage error."""
    assert ctl(api_url, "scale", "trial")[0] == 2
    assert ctl(api_url, "scale", "trial", "--min", "-1")[0] == 2
    assert ctl(api_url, "model", "resources", "t", "--cpu-cores", "2", "--memory", "lots")[0] == 2


def test_a_missing_token_is_explained(api_url: str) -> None:
    """401 says how to pass a token."""
    code, out = ctl(api_url, "model", "list", token=None)
    assert code == 1
    assert "LLMGW_ADMIN_TOKEN" in out


def test_an_unreachable_api_is_explained() -> None:
    """The error names the URL and how to change it."""
    code, out = ctl(f"http://127.0.0.1:{_free_port()}", "model", "list")
    assert code == 1
    assert "cannot reach the llmgw API" in out
    assert "LLMGW_URL" in out


def test_the_checked_in_cli_reference_is_current() -> None:
    """cli/llmgw.md is regenerated with `python -m llmgw.cli.reference`."""
    from llmgw.cli.reference import render

    checked_in = Path(__file__).resolve().parents[2] / "cli" / "llmgw.md"
    assert checked_in.read_text() == render(), (
        "cli/llmgw.md is stale: run `python -m llmgw.cli.reference > cli/llmgw.md`")


def test_prefetch_prints_each_nodes_progress_and_the_warm_nodes(api_url: str) -> None:
    """`ctl model prefetch NAME --nodes 2` starts one and prints the nodes' states; --status
    only reads it; --nodes with --node is a usage error."""
    code, out = ctl(api_url, "model", "prefetch", "prod-chat", "--nodes", "2")
    assert code == 0, out
    assert "node-1" in out
    assert "node-2" in out
    assert "40%" in out
    assert "nodes holding its weights: node-9" in out
    code, out = ctl(api_url, "model", "prefetch", "prod-chat", "--status")
    assert code == 0
    assert "fetching" in out
    code, out = ctl(api_url, "model", "prefetch", "prod-chat", "--nodes", "2", "--node", "x")
    assert code == 2
    assert "not both" in out


def test_replicas_shows_the_count_the_scaler_asked_for_and_why(api_url: str,
                                                               store_url: str) -> None:
    """ctl replicas lists, per model, desired and ready and the scaler's reason from the store."""
    import msgspec

    from llmgw.scheduler.base import SCALER_REPORT, ScalerDecision, ScalerDecisions

    decisions = ScalerDecisions(models={"prod-chat": ScalerDecision(
        desired=3, kind="load", reason="40 requests on 2 ready replicas against a target of "
        "16 per replica: 2 → 3", since=12.0)})

    async def publish() -> None:
        store = open_store(store_url)
        await store.open()
        try:
            await store.put_report(*SCALER_REPORT, msgspec.json.encode(decisions))
        finally:
            await store.close()

    asyncio.run(publish())
    code, out = ctl(api_url, "replicas")
    assert code == 0, out
    line = next(x for x in out.splitlines() if x.startswith("prod-chat"))
    assert "scaler (load): 40 requests on 2 ready replicas" in line
    assert "unchanged for 1" in line
    code, out = ctl(api_url, "model", "show", "prod-chat", "--output", "json")
    assert json.loads(out)["scaler"]["desired"] == 3


def test_team_and_key_commands(api_url: str) -> None:
    """`ctl team add|list|set|revoke` and `ctl key add|list|revoke`; a key is printed once."""
    code, out = ctl(api_url, "team", "add", "ml", "--models", "prod-chat,prod-chta",
                    "--tokens-per-day", "500000")
    assert code == 1, out
    assert "models 'prod-chta' is not in the catalog" in out
    code, out = ctl(api_url, "team", "add", "ml", "--models", "prod-chat", "--tokens-per-day",
                    "500000")
    assert code == 0, out
    assert "tokens per day 500000" in out
    code, out = ctl(api_url, "team", "add", "web", "--tokens-per-day", "0")
    assert code == 1, out
    assert "tokens_per_day" in out
    code, key = ctl(api_url, "key", "add", "ml-ci", "--team", "ml", "--models", "prod-chat")
    assert code == 0, key
    key = key.strip()
    assert key.startswith("sk-llmgw-")
    code, out = ctl(api_url, "key", "list", "-o", "json")
    assert code == 0
    assert key not in out
    assert json.loads(out)[0]["limits"] == {"models": ["prod-chat"]}
    code, out = ctl(api_url, "team", "list")
    assert "ml-ci" in out
    code, out = ctl(api_url, "team", "set", "ml", "--rpm", "30")
    assert code == 0, out
    assert "rpm 30" in out
    assert ctl(api_url, "key", "revoke", "ml-ci")[0] == 0
    assert ctl(api_url, "team", "revoke", "ml")[0] == 0
    code, out = ctl(api_url, "team", "revoke", "ml")
    assert code == 1
    assert "no team named 'ml'" in out


def test_usage_command_prints_a_table_and_json(api_url: str, store_url: str) -> None:
    """`ctl usage` reads /api/v1/usage: buckets by default, totals with --totals."""
    from llmgw.store.base import UsageRecord

    hour = 1_773_500_400          # 2026-03-14T15:00:00Z

    async def record() -> None:
        store = open_store(store_url)
        await store.open()
        try:
            await store.record_usage([UsageRecord(
                id=f"r{i}", at=hour + i, key="k1", team=team, model="m", replica="r",
                gpu_class="", prompt_tokens=10, cached_tokens=0, completion_tokens=2,
                status=200, latency=0.1, ttft=None) for i, team in enumerate(["ml", "ml", "web"])])
        finally:
            await store.close()

    asyncio.run(record())
    span = ["--since", "2026-03-14T15:00:00Z", "--until", "2026-03-14T16:00:00Z"]
    code, out = ctl(api_url, "usage", *span)
    assert code == 0, out
    lines = out.splitlines()
    assert lines[1].split() == ["HOUR", "TEAM", "REQUESTS", "PROMPT", "CACHED", "COMPLETION",
                                "TOTAL"]
    assert lines[2].split() == ["2026-03-14T15:00:00Z", "ml", "2", "20", "0", "4", "24"]
    code, out = ctl(api_url, "usage", "--totals", "--by", "key", *span)
    assert out.splitlines()[2].split() == ["k1", "3", "30", "0", "6", "36"]
    code, out = ctl(api_url, "usage", "-o", "json", *span)
    assert code == 0
    assert [t["group"] for t in json.loads(out)["totals"]] == ["ml", "web"]


def test_costs_command_prints_teams_and_models(api_url: str) -> None:
    """`ctl costs` prints the cost per team and per model (nothing metered: all zero)."""
    code, out = ctl(api_url, "costs", "--since", "2026-03-14T00:00:00Z", "--until",
                    "2026-03-15T00:00:00Z")
    assert code == 0, out
    assert out.startswith("cost from 2026-03-14T00:00:00Z to 2026-03-15T00:00:00Z: 0.00")
    assert "PER 1M TOKENS" in out
    code, out = ctl(api_url, "costs", "-o", "json")
    assert code == 0
    assert json.loads(out)["overhead_account"] == "overhead"


def test_team_logs_settings_and_command(api_url: str) -> None:
    """`ctl team add --log-requests bodies` sets the team's logging; `ctl team logs`
    prints its (empty) logs as JSON."""
    code, out = ctl(api_url, "team", "add", "audited", "--log-requests", "bodies",
                    "--log-retention-days", "7")
    assert code == 0, out
    assert "log requests bodies; log retention days 7" in out
    code, out = ctl(api_url, "team", "logs", "audited")
    assert code == 0, out
    assert json.loads(out) == []


def test_ctl_adapter_add_from_a_file_list_and_remove(api_url: str, tmp_path: Path) -> None:
    """An adapters: entry in a file adds as it would declare; a bad base exits 1 naming it."""
    runner = CliRunner()
    ctl = ["ctl", "--url", api_url, "--token", TOKEN]
    base = tmp_path / "base.yaml"
    base.write_text("name: qwen\nsource: /models/qwen\nengine: vllm\nlora: {slots: 2}\n"
                    "profiles: [{name: h100, gpu_class: h100-80g, gpus: 1}]\n")
    added = runner.invoke(main, [*ctl, "model", "add", "-f", str(base), "--skip-source-check"])
    assert added.exit_code == 0, added.output
    entry = tmp_path / "sql.yaml"
    entry.write_text("name: qwen-sql\nbase: qwen\nsource: /adapters/sql\nrank: 8\n")
    r = runner.invoke(main, [*ctl, "adapter", "add", "-f", str(entry), "--skip-source-check"])
    assert r.exit_code == 0, r.output
    assert "added qwen-sql on qwen" in r.output
    listed = runner.invoke(main, [*ctl, "adapter", "list", "-o", "json"])
    assert [(a["name"], a["base"], a["rank"]) for a in json.loads(listed.output)] == [
        ("qwen-sql", "qwen", 8)]
    bad = runner.invoke(main, [*ctl, "adapter", "add", "qwen-x", "--base", "nope",
                               "--source", "/adapters/x", "--skip-source-check"])
    assert bad.exit_code == 1
    assert "there is no model 'nope'" in bad.output
    removed = runner.invoke(main, [*ctl, "adapter", "remove", "qwen-sql"])
    assert removed.exit_code == 0, removed.output
    assert json.loads(runner.invoke(main, [*ctl, "adapter", "list", "-o", "json"]).output) == []
