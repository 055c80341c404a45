"""`llmgw jobspec render` and the checked-in jobspecs/ (STYLE rule 14)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmgw.catalog.build import build_catalog
from llmgw.cli import main
from llmgw.cli.jobspec import render_file
from llmgw.config import load_config
from llmgw.scheduler.nomad import jobspec as js
from llmgw.scheduler.nomad.jobui import Links
from llmgw.scheduler.nomad.render import static_jobs

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "server.yaml"
JOBSPECS = ROOT / "jobspecs"
REGENERATE = "env -u NOMAD_ADDR llmgw jobspec render --config examples/server.yaml --out jobspecs"


@pytest.fixture(autouse=True)
def _no_nomad_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("NOMAD_ADDR", "NOMAD_TOKEN", "NOMAD_NAMESPACE", "NOMAD_REGION", "NOMAD_CACERT",
                "NOMAD_CLIENT_CERT", "NOMAD_CLIENT_KEY"):
        monkeypatch.delenv(var, raising=False)


def test_jobspecs_directory_is_the_rendering_of_the_example_catalog():
    """jobspecs/ holds exactly the jobs examples/server.yaml renders; a stale file fails here."""
    cfg = load_config(EXAMPLE, env={})
    catalog = build_catalog(cfg.models, cfg.gpu_classes)
    expected = {f"{j.ID}.json": render_file(js.JobRegisterRequest(Job=j))
                for j in static_jobs(catalog, cfg.scheduler.nomad, cfg.mirror,
                                     links=Links.of(cfg))}
    present = {p.name: p.read_text() for p in JOBSPECS.glob("*.json")}
    assert sorted(present) == sorted(expected), f"regenerate with: {REGENERATE}"
    for name, text in expected.items():
        assert present[name] == text, f"jobspecs/{name} is stale; regenerate with: {REGENERATE}"


def test_render_prints_every_scheduled_model_as_a_register_body():
    """Without MODEL, a JSON list of {"Job": ...} bodies, one per scheduled model."""
    result = CliRunner().invoke(main, ["jobspec", "render", "--config", str(EXAMPLE)])
    assert result.exit_code == 0, result.output
    bodies = json.loads(result.output)
    ids = [b["Job"]["ID"] for b in bodies]
    assert ids == ["llmgw-llama-3-3-70b-instruct", "llmgw-qwen2-5-14b-instruct",
                   "llmgw-qwen2-5-coder-32b-instruct", "llmgw-nomic-embed-text"]
    assert "llmgw-hosted-fallback" not in ids   # external: nothing to schedule


def test_render_one_model_prints_its_job():
    """With MODEL, one {"Job": ...} body."""
    result = CliRunner().invoke(main, ["jobspec", "render", "--config", str(EXAMPLE),
                                       "nomic-embed-text"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["Job"]["ID"] == "llmgw-nomic-embed-text"


def test_render_an_unknown_model_fails_naming_the_scheduled_ones():
    """An unknown or external MODEL exits 1 and lists what can be rendered."""
    result = CliRunner().invoke(main, ["jobspec", "render", "--config", str(EXAMPLE),
                                       "hosted-fallback"])
    assert result.exit_code == 1
    assert "no scheduled model 'hosted-fallback'" in result.output
    assert "nomic-embed-text" in result.output


def test_render_a_broken_config_exits_2_naming_the_file(tmp_path: Path):
    """A configuration error is a usage error (exit 2) that names the file."""
    bad = tmp_path / "server.yaml"
    bad.write_text("scheduler:\n  kind: nomad\n  nomad:\n    adress: x\n")
    result = CliRunner().invoke(main, ["jobspec", "render", "--config", str(bad)])
    assert result.exit_code == 2
    assert str(bad) in result.output
    assert "adress" in result.output
