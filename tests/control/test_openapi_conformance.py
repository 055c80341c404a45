"""The control API's OpenAPI document tells the truth: Schemathesis against a real server.

``llmgw serve`` runs on loopback with an admin token; Schemathesis reads the
checked-in ``api/openapi.json`` and sends what it describes — examples,
boundary values, fuzzed bodies and, in its stateful phase, sequences of
calls linked by the document — and runs every check it has on every answer:
a status the document does not list, a body or a header that does not match
its schema, a 5xx, a request the schema refuses but the server accepts, one
the schema admits but the server refuses, a deleted resource still there, a
method the server answers that OPTIONS does not name.

One check is turned off for four operations, and only for them:
``positive_data_acceptance`` (every request the schema admits is accepted) on
the operations in ``llmgw.api.contract.BEYOND_SCHEMA``, whose bodies are
checked against the world — a local source must exist on the server's host,
a profile's GPU class must be one server.yaml defines, an adapter's base must
serve adapters, the planner must know the model's architecture — which no
schema can state; their 400 says so in the document.

The run is the same every time and bounded on a loaded machine: a fixed seed
in deterministic mode (which keeps no example database), one worker, at most 20 examples
per operation, no Hypothesis deadline (Schemathesis sets none) and the
too-slow health check off, since it measures this machine's load rather than
the API; a generous timeout per request and for the whole run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from llmgw.api.contract import BEYOND_SCHEMA
from tests.control.test_hostile_clients import TOKEN, llmgw_serve

SCHEMA = Path(__file__).resolve().parents[2] / "api" / "openapi.json"
SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")


def beyond_schema_config(tmp_path: Path) -> Path:
    """A schemathesis.toml running every check, with positive_data_acceptance off for the
    BEYOND_SCHEMA operations alone (``--checks all`` on the command line would override it)."""
    names = ", ".join(json.dumps(f"{method.upper()} {path}") for method, path in BEYOND_SCHEMA)
    config = tmp_path / "schemathesis.toml"
    config.write_text("[checks]\nenabled = true\n\n"
                      f"[[operations]]\ninclude-name = [{names}]\n"
                      "checks.positive_data_acceptance.enabled = false\n")
    return config


def test_the_server_answers_what_its_openapi_document_says(tmp_path: Path) -> None:
    """Every Schemathesis check passes on every operation (bar the BEYOND_SCHEMA
    ones' positive_data_acceptance)."""
    config = beyond_schema_config(tmp_path)
    with llmgw_serve(tmp_path, "{}") as served:
        run = subprocess.run(
            [str(SCHEMATHESIS), "--config-file", str(config), "--no-color", "run", str(SCHEMA),
             "--url", served.url, "--header", f"Authorization: Bearer {TOKEN}",
             "--phases", "examples,coverage,fuzzing,stateful",
             "--seed", "20261201", "--generation-deterministic", "--max-examples", "20",
             "--workers", "1", "--request-timeout", "60",
             "--suppress-health-check", "too_slow"],
            capture_output=True, text=True, timeout=600, cwd=tmp_path, check=False)
        log = served.log.read_text()
    assert run.returncode == 0, run.stdout[-20000:] + run.stderr[-5000:]
    assert "Traceback" not in log, log[-5000:]


def test_only_the_operations_beyond_the_schema_skip_a_check() -> None:
    """The operations excused from positive_data_acceptance exist, and each one's 400 in the
    document says what it checks beyond the schema."""
    document = json.loads(SCHEMA.read_text())
    for (method, path), why in BEYOND_SCHEMA.items():
        assert document["paths"][path][method]["responses"]["400"]["description"] == why
    assert len(BEYOND_SCHEMA) == 4
