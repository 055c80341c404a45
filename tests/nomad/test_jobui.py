"""The ``ui`` block of a model's job: what the Nomad UI shows, rendered safely."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import msgspec
import pytest
from markdown_it import MarkdownIt

from llmgw.catalog.build import DECLARED, Provenance
from llmgw.catalog.fingerprint import fingerprint
from llmgw.catalog.model import Model, Profile
from llmgw.catalog.source import Source
from llmgw.catalog.units import Size
from llmgw.config import NomadConfig, load_config
from llmgw.errors import ConfigError
from llmgw.scheduler.nomad.jobui import MAX_DESCRIPTION, Links, description, links, ui_block
from llmgw.scheduler.nomad.render import render_job, spec_hash

from .shapes import GPU_CLASSES

CFG = NomadConfig(namespace="llm", datacenters=["dc1"])
MIRROR = "http://mirror.internal:8070"
CONFIGURED = Links(public_url="https://llmgw.example.com/",
                   dashboard_url="https://grafana.example.com/d/llmgw/llmgw?var-model={model}")
QWEN = Model(
    name="qwen2-5-14b-instruct", description="Smaller general model; fallback for the 70B.",
    source=Source.parse("hf://Qwen/Qwen2.5-14B-Instruct"), engine="vllm",
    profiles=[Profile(name="l40s-1", gpu_class="l40s-48g", gpus=1, context=16384, cpu_cores=8,
                      memory=Size.parse("64GiB"))])
EMBED = Model(
    name="nomic-embed-text", engine="llama.cpp",
    source=Source.parse(f"{MIRROR}/nomic-embed-text-v1-5/q8_0/nomic-embed-text-v1.5.Q8_0.gguf"),
    profiles=[Profile(name="cpu-8", gpus=0, context=8192, cpu_cores=8, memory=Size.parse("4GiB"))])

# The Nomad UI renders the description as GitHub-flavoured Markdown with line breaks
# (docs/nomad-api.md §1.9); this is the same dialect, raw HTML let through.
MARKDOWN = MarkdownIt("commonmark", {"breaks": True, "html": True}).enable(
    ["table", "strikethrough"])


def _with(description: str) -> Model:
    return msgspec.structs.replace(QWEN, description=description)


def _rendered_lines(text: str) -> list[str]:
    """What a reader sees: the HTML Markdown makes, which must be one paragraph of plain
    lines (no tag but <p> and <br>), as text."""
    out = MARKDOWN.render(text)
    tags = set(re.findall(r"</?([a-zA-Z0-9]+)", out))
    assert tags <= {"p", "br"}, f"markup survived: {out!r}"
    return [html.unescape(line).strip() for line in re.sub(r"</?p>", "", out).split("<br />")]


def test_the_description_says_what_the_model_is_how_it_runs_and_where_it_came_from():
    """The model's description, then its engine and profile in force, then its origin."""
    lines = _rendered_lines(description(QWEN, QWEN.profiles[0], DECLARED))
    assert lines == [
        "Smaller general model; fallback for the 70B.",
        "Model qwen2-5-14b-instruct on vLLM, profile l40s-1: 1 l40s-48g GPU, 16384-token "
        "context.",
        "Declared in the server configuration.",
        "Managed by llmgw: change it with llmgw ctl or its admin site, not here.",
    ]
    cpu = _rendered_lines(description(EMBED, EMBED.profiles[0], DECLARED))
    assert cpu[0] == ("Model nomic-embed-text on llama.cpp server, profile cpu-8: 8 CPU cores, "
                      "4.0GiB memory, 8192-token context.")


def test_a_runtime_model_says_who_added_it():
    """A model added through the API or the admin site names the identity that added it."""
    lines = _rendered_lines(description(
        QWEN, QWEN.profiles[0], Provenance(origin="runtime", added_by="alice")))
    assert "Added at run time by alice." in lines
    assert "Declared in the server configuration." not in lines


def test_links_lead_to_the_admin_page_the_hub_and_the_dashboard():
    """The admin page under public_url, the Hub page of an hf:// source, the dashboard with
    the model's name filled in."""
    got = [(link.Label, link.URL) for link in links(QWEN, CONFIGURED)]
    assert got == [
        ("llmgw admin", "https://llmgw.example.com/admin/models/qwen2-5-14b-instruct"),
        ("Hugging Face", "https://huggingface.co/Qwen/Qwen2.5-14B-Instruct"),
        ("Dashboard", "https://grafana.example.com/d/llmgw/llmgw?var-model=qwen2-5-14b-instruct"),
    ]


def test_without_a_public_url_or_dashboard_no_link_is_invented():
    """Nothing configured: only the Hub page, which the source itself names; a mirror
    source has no page at all."""
    assert [link.Label for link in links(QWEN, Links())] == ["Hugging Face"]
    assert links(EMBED, Links()) == []


@pytest.mark.parametrize("typed", [
    "# Heading\nsecond line",
    "[click me](javascript:alert(1)) and ![x](http://evil/x.png)",
    "<script>alert(1)</script><img src=x onerror=alert(1)>",
    "**bold** _it_ `code` ~~gone~~ &lt;not a tag&gt;",
    "- item\n1. first\n> quote\n\n---\n| a | b |\n|---|---|",
    "    indented code\n\n```\nfence\n```",
    "2) two \\* escaped already",
    "> a quote first",
    "12. a list item first",
    "= setext? and snake_case_words stay, _but not these_",
])
def test_markup_and_newlines_in_a_description_show_as_the_characters_typed(typed: str):
    """Whatever a model's description holds, the Nomad UI shows it as one line of its own
    characters (whitespace runs as one space), never as markup or as more lines."""
    lines = _rendered_lines(description(_with(typed), QWEN.profiles[0], DECLARED))
    assert len(lines) == 4
    assert lines[0] == " ".join(typed.split())


def test_control_and_direction_characters_are_dropped():
    """NUL, escape and a right-to-left override cannot reorder or hide what follows."""
    lines = _rendered_lines(description(_with("ok\x00\x1b[31m\u202egnp.exe"), QWEN.profiles[0],
                                        DECLARED))
    assert lines[0] == "ok[31mgnp.exe"


def test_who_added_a_model_is_plain_text_too():
    """A name with markup and a newline stays on its line, as typed."""
    lines = _rendered_lines(description(
        QWEN, QWEN.profiles[0], Provenance(origin="runtime", added_by="<b>eve</b>\nroot")))
    assert "Added at run time by <b>eve</b> root." in lines


@pytest.mark.parametrize("char", ["a", "é", "語", "🦙", "*"])
def test_a_long_description_is_cut_to_fit_nomads_limit_in_bytes(char: str):
    """Nomad refuses a description over 1,000 bytes; a long one, in any script or all
    markup, is cut on a character boundary with an ellipsis and the facts kept."""
    text = description(_with(char * 5000), QWEN.profiles[0],
                       Provenance(origin="runtime", added_by="x" * 500))
    assert len(text.encode()) <= MAX_DESCRIPTION
    lines = _rendered_lines(text)
    assert lines[0].endswith("…")
    assert set(lines[0][:-1]) == {char}
    assert lines[1].startswith("Model qwen2-5-14b-instruct on vLLM")
    assert lines[2].startswith("Added at run time by xxxx")
    assert lines[2].endswith("….")


def test_the_ui_block_changes_neither_the_spec_hash_nor_the_fingerprint():
    """A new description or new links render the same spec hash, meta and fingerprint, so
    no replica is marked stale (or replaced) for them."""
    p = QWEN.profiles[0]
    first = render_job(QWEN, p, CFG, GPU_CLASSES, 1, MIRROR,
                       ui=ui_block(QWEN, p, Links(), DECLARED))
    edited = _with("Now the default for code review.")
    second = render_job(edited, p, CFG, GPU_CLASSES, 1, MIRROR,
                        ui=ui_block(edited, p, CONFIGURED,
                                    Provenance(origin="runtime", added_by="bob")))
    assert first.UI != second.UI
    assert spec_hash(first) == spec_hash(second)
    assert first.Meta == second.Meta
    assert fingerprint(QWEN, p) == fingerprint(edited, p)
    assert msgspec.structs.replace(first, UI=None) == msgspec.structs.replace(second, UI=None)


def _config(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "server.yaml"
    path.write_text(f"listen: 127.0.0.1:8080\n{extra}\n")
    return path


def test_public_and_dashboard_urls_load_from_server_yaml(tmp_path: Path):
    """public_url and dashboard_url (with {model}) are read as written."""
    cfg = load_config(_config(tmp_path, "public_url: https://llmgw.example.com/ops\n"
                                        "dashboard_url: https://g/d/x?var-model={model}"), env={})
    assert Links.of(cfg) == Links(public_url="https://llmgw.example.com/ops",
                                  dashboard_url="https://g/d/x?var-model={model}")


@pytest.mark.parametrize(("line", "said"), [
    ("public_url: llmgw.example.com", "public_url: 'llmgw.example.com' is not an http(s) URL"),
    ("public_url: https://ops:s3cret@llmgw.example.com",
     "public_url: 'https://ops:***@llmgw.example.com' carries credentials"),
    ("public_url: https://llmgw.example.com/?x=1", "public_url: 'https://llmgw.example.com/?x=1' "
                                                   "has a query or fragment"),
    ("dashboard_url: https://g/d/x?var-model={name}", "dashboard_url: {name} is not a "
                                                      "placeholder llmgw fills"),
    ("dashboard_url: https://g/d/x?var-model={model", "dashboard_url: 'https://g/d/x?var-model="
                                                      "{model' has an unmatched brace"),
])
def test_a_link_that_would_mislead_or_leak_is_refused_at_startup(tmp_path: Path, line: str,
                                                                 said: str):
    """A URL that is not one, carries a password into every job, or has a placeholder llmgw
    does not fill is refused naming the file and key, never rendered."""
    with pytest.raises(ConfigError) as err:
        load_config(_config(tmp_path, line), env={})
    assert said in err.value.message
    assert "s3cret" not in err.value.message
    assert err.value.message.startswith(str(tmp_path / "server.yaml"))


def test_the_readme_shows_the_block_the_example_configuration_renders():
    """README's "What operators see" example is exactly the first example model's block."""
    from llmgw.catalog.build import Runtime, build_catalog
    from llmgw.scheduler.nomad import jobspec as js
    from llmgw.scheduler.nomad.render import static_jobs

    root = Path(__file__).resolve().parents[2]
    cfg = load_config(root / "examples" / "server.yaml", env={})
    catalog = build_catalog(cfg.models, cfg.gpu_classes, Runtime(scheduler="nomad",
                                                                 mirror=cfg.mirror))
    job = static_jobs(catalog, cfg.scheduler.nomad, cfg.mirror, links=Links.of(cfg))[0]
    section = (root / "README.md").read_text().split("### In the Nomad UI\n", 1)[1]
    shown = section.split("```json\n", 1)[1].split("```", 1)[0]
    assert json.loads("{" + shown + "}")["UI"] == js.to_builtins(job.UI)
