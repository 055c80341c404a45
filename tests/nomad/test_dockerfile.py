"""The Dockerfile, checked instruction by instruction (no Docker engine runs here).

The same image serves the API and gateway and runs every job's ``llmgw fetch``; what
would break either is checked from the file itself.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KNOWN = {"FROM", "ENV", "WORKDIR", "COPY", "RUN", "USER", "EXPOSE", "CMD", "ARG", "LABEL",
         "ENTRYPOINT", "ADD", "HEALTHCHECK", "VOLUME", "STOPSIGNAL", "SHELL", "ONBUILD"}


def instructions() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text()
    joined = re.sub(r"\\\n", " ", text)
    out = []
    for raw in joined.splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_every_instruction_is_a_dockerfile_instruction():
    """A typo in an instruction would fail the build; none is there."""
    assert {word for word, _ in instructions()} <= KNOWN


def test_the_base_image_is_a_pinned_python_the_package_supports():
    """One FROM, a python image of a version pyproject.toml allows, never :latest."""
    froms = [rest for word, rest in instructions() if word == "FROM"]
    assert len(froms) == 1
    m = re.fullmatch(r"python:(\d+)\.(\d+)-slim", froms[0])
    assert m, froms[0]
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    low = re.search(r">=\s*(\d+)\.(\d+)", requires)
    assert (int(m.group(1)), int(m.group(2))) >= (int(low.group(1)), int(low.group(2)))


def test_it_installs_the_package_from_what_it_copies():
    """pyproject.toml, the README it names and the llmgw package are copied, then
    installed; nothing is fetched with ADD."""
    steps = instructions()
    copied = " ".join(rest for word, rest in steps if word == "COPY")
    readme = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"].get("readme")
    for needed in ("pyproject.toml", "llmgw", *([readme] if readme else [])):
        assert needed in copied, needed
    assert any(word == "RUN" and "pip install ." in rest for word, rest in steps)
    assert not any(word == "ADD" for word, _ in steps)


def test_it_runs_unprivileged_and_serves_on_the_published_port():
    """A non-root USER before the command; it exposes the port compose's llmgw listens on."""
    steps = instructions()
    users = [rest for word, rest in steps if word == "USER"]
    assert users
    assert users[-1] not in ("root", "0")
    assert [rest for word, rest in steps if word == "EXPOSE"] == ["8080"]


def test_nomads_fetch_command_runs_llmgw_fetch_in_it():
    """No ENTRYPOINT: the job's `command = "llmgw"` becomes the container's command, and
    an entrypoint would run in front of it; the default command serves."""
    steps = instructions()
    assert not any(word == "ENTRYPOINT" for word, _ in steps)
    [cmd] = [json.loads(rest) for word, rest in steps if word == "CMD"]
    assert cmd[:2] == ["llmgw", "serve"]


def test_the_build_context_leaves_out_what_the_image_does_not_need():
    """.dockerignore keeps the virtualenv and git history out of the context."""
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored
    assert ".git" in ignored
