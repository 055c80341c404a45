"""The control API's OpenAPI document tells the truth: Schemathesis against a real server.

``llmgw serve`` runs on loopback with an admin token; Schemathesis reads the
checked-in ``api/openapi.json`` and sends what it describes — examples,
boundary values, fuzzed bodies and, in its stateful phase, sequences of
calls linked by the document — and checks every answer: a status the
document does not list, a body or a header that does not match its schema,
a 5xx, a request the schema refuses but the server accepts, a method the
server answers that OPTIONS does not name. A fixed seed and a bounded number
of examples keep the run the same every time and well under a minute.

One check is left out (``schemathesis.toml`` beside this file, with one
per-operation exception and why), ``positive_data_acceptance``: that every
request the schema admits is accepted. The API validates definitions beyond what JSON
Schema can say — a local source must exist on the server's host, a model's
architecture must be one the planner knows, a prefetch takes nodes or a
count but not both — and answers 400 naming the field for each; those are
answers the document lists, for reasons it cannot express.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.control.test_hostile_clients import TOKEN, llmgw_serve

SCHEMA = Path(__file__).resolve().parents[2] / "api" / "openapi.json"
SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")
# Per-operation exceptions, each with its reason (schemathesis.toml beside this file).
CONFIG = Path(__file__).resolve().parent / "schemathesis.toml"


def test_the_server_answers_what_its_openapi_document_says(tmp_path: Path) -> None:
    with llmgw_serve(tmp_path, "{}") as served:
        run = subprocess.run(
            [str(SCHEMATHESIS), "--config-file", str(CONFIG), "run", str(SCHEMA),
             "--url", served.url,
             "--header", f"Authorization: Bearer {TOKEN}",
             "--phases", "examples,coverage,fuzzing,stateful",
             "--seed", "20261201", "--max-examples", "20", "--workers", "1",
             "--generation-database", "none", "--request-timeout", "30", "--no-color"],
            capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False)
        log = served.log.read_text()
    assert run.returncode == 0, run.stdout[-20000:] + run.stderr[-5000:]
    assert "Traceback" not in log, log[-5000:]
