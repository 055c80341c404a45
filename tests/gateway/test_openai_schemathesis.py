"""Schemathesis against OpenAI's own document, trimmed to the operations llmgw serves.

``llmgw serve`` runs on loopback with a key, in front of the engine double
(``tests.gateway.engine``, a process of its own); the document is made from
the pinned structural extract (``openai_schemas.json``) by
``llmgw.testing.openai_schemas.openapi_document``. Schemathesis generates
requests from the document — examples, boundary values, fuzzed bodies valid
and invalid, methods the document does not list, requests without the key —
and checks every answer: no 5xx, the body and headers of each documented
status match their schemas, the content type is documented, a method the
document does not list is a 405 whose ``Allow`` names the ones it does, a
request without the key is refused. A fixed seed, one worker and a bounded
number of examples keep the run the same every time (about 11,000 requests).

What the run leaves out, and why:

* ``negative_data_rejection`` and ``positive_data_acceptance``. llmgw reads
  only ``model`` and ``stream`` of an inference body and sends the rest to
  the engine, which validates it (the double answers a body it cannot read
  with a 400, as vLLM does, but checks no schema); and it refuses by design,
  with a 400 naming the field, some of what OpenAI's document allows and it
  cannot serve: built-in tools, background responses, purposes other than
  ``batch``, list limits past the bounds OpenAI's prose states.
* ``status_code_conformance``: the document lists 200 (and 429) only, so
  every 400, 401, 404 or 413 — all answered by OpenAI too — would count.
* Per operation, where the document is narrower than OpenAI's own API:
  the content type of speech (``audio/mpeg``), of a transcript asked for as
  text (``text/plain``), of a streamed completion (the document has no
  stream for ``/completions``) and of a file's content; and the body of a
  404 from deleting a response, which the document alone declares as a bare
  ``Error`` rather than the ``ErrorResponse`` every other error is.

And some changes to the document, each a fact about the run or about how
Schemathesis reads a document rather than about OpenAI's API:

* ``model`` is one of the models this server has, and a
  ``previous_response_id`` one it stored (else nearly every generated
  request would be a 404 and none would reach an engine);
* ``first_id`` and ``last_id`` may be null, as OpenAI answers on an empty
  page (the schema requires strings, which no empty page has);
* an event stream is described as Schemathesis reads one, a ``data`` string
  per event: the document gives the schema of the data where Schemathesis
  expects the event's (``test_openai_conformance`` validates every event);
* a ``discriminator`` without a ``mapping`` is left out: OpenAPI reads it as
  mapping schema names, while OpenAI's values are the items' ``type``
  strings (``message``), so Schemathesis would refuse every valid item; the
  ``oneOf`` it sits on still decides.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from llmgw.gateway.keys import add_key
from llmgw.testing.openai_schemas import openapi_document
from tests.gateway.test_files_batches import line

ROOT = Path(__file__).resolve().parents[2]
EXTRACT = json.loads((Path(__file__).with_name("openai_schemas.json")).read_text())
SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")
DEADLINE = 120.0
MODELS = ["chat", "native"]
# Schemas whose ``model`` is narrowed to MODELS: the requests', and ResponseProperties,
# which a Responses request and answer share (an answer names the model asked for).
WITH_MODEL = ("CreateChatCompletionRequest", "CreateCompletionRequest", "CreateEmbeddingRequest",
              "ResponseProperties", "CreateTranscriptionRequest", "CreateTranslationRequest",
              "CreateSpeechRequest")
# Operations whose answers' content type the document does not list, as OpenAI answers them.
OTHER_CONTENT_TYPES = ("POST /v1/audio/speech", "POST /v1/audio/transcriptions",
                       "POST /v1/audio/translations", "POST /v1/completions",
                       "GET /v1/files/{file_id}/content")
EVENT = {"type": "object", "required": ["data"],
         "properties": {"data": {"type": "string"}, "event": {"type": "string"}}}


def _narrow_model(schema: Any) -> None:
    if isinstance(schema, dict):
        if "model" in schema.get("properties", {}):
            schema["properties"]["model"] = {"enum": MODELS}
        for value in schema.values():
            _narrow_model(value)
    elif isinstance(schema, list):
        for value in schema:
            _narrow_model(value)


def _drop_unmapped_discriminators(schema: Any) -> None:
    if isinstance(schema, dict):
        if "mapping" not in schema.get("discriminator", {"mapping": None}):
            del schema["discriminator"]
        for value in schema.values():
            _drop_unmapped_discriminators(value)
    elif isinstance(schema, list):
        for value in schema:
            _drop_unmapped_discriminators(value)


def document(stored_response: str) -> dict[str, Any]:
    """The trimmed OpenAI document, with the run's changes (module docstring)."""
    doc = openapi_document(EXTRACT)
    schemas = doc["components"]["schemas"]
    _drop_unmapped_discriminators(schemas)
    for name in WITH_MODEL:
        _narrow_model(schemas[name])
    schemas["ResponseProperties"]["properties"]["previous_response_id"] = {
        "enum": [stored_response, None]}
    for name in ("ListFilesResponse", "ResponseItemList", "ListBatchesResponse"):
        for field in ("first_id", "last_id"):
            schemas[name]["properties"][field] = {
                "anyOf": [schemas[name]["properties"][field], {"type": "null"}]}
    for operations in doc["paths"].values():
        for op in operations.values():
            for response in op["responses"].values():
                if "text/event-stream" in response.get("content", {}):
                    response["content"]["text/event-stream"] = {"schema": EVENT}
    return doc


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _process(args: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=out, cwd=ROOT)
        try:
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(40)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            assert proc.stdout is not None
            proc.stdout.close()


def _engine(name: str, tmp_path: Path, *extra: str
            ) -> contextlib.AbstractContextManager[subprocess.Popen[bytes]]:
    return _process([sys.executable, "-m", "tests.gateway.engine", "--name", name, *extra],
                    tmp_path / f"{name}.log")


def _url_of(proc: subprocess.Popen[bytes]) -> str:
    assert proc.stdout is not None
    return proc.stdout.readline().decode().strip()


def _fixtures(url: str, key: str) -> dict[str, str]:
    """Objects for the operations that read one: files, a batch that stays in progress,
    stored responses; one of each kind kept apart for its DELETE."""
    auth = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=url, headers=auth, timeout=DEADLINE) as http:
        def upload(data: bytes) -> str:
            r = http.post("/v1/files", data={"purpose": "batch"},
                          files={"file": ("in.jsonl", data)})
            r.raise_for_status()
            return str(r.json()["id"])

        def respond() -> str:
            r = http.post("/v1/responses", json={"model": "chat", "input": "hi"})
            r.raise_for_status()
            return str(r.json()["id"])

        held = upload(line(0, model="held"))
        batch = http.post("/v1/batches", json={"input_file_id": held, "completion_window": "24h",
                                               "endpoint": "/v1/chat/completions"})
        batch.raise_for_status()
        return {"file": upload(line(0)), "file_to_delete": upload(line(1)),
                "batch": str(batch.json()["id"]), "response": respond(),
                "response_to_delete": respond()}


def _config(ids: dict[str, str]) -> str:
    lines = [
        "[checks]",
        "status_code_conformance.enabled = false",
        "negative_data_rejection.enabled = false",
        "positive_data_acceptance.enabled = false",
        "",
        "[parameters]",
        f'"path.file_id" = "{ids["file"]}"',
        f'"path.batch_id" = "{ids["batch"]}"',
        f'"path.response_id" = "{ids["response"]}"',
        '"path.model" = "chat"',
    ]
    for name in OTHER_CONTENT_TYPES:
        lines += ["", "[[operations]]", f'include-name = "{name}"',
                  "checks.content_type_conformance.enabled = false"]
    lines += ["", "[[operations]]", 'include-name = "DELETE /v1/responses/{response_id}"',
              "checks.response_schema_conformance.enabled = false",
              f'parameters = {{ "path.response_id" = "{ids["response_to_delete"]}" }}',
              "", "[[operations]]", 'include-name = "DELETE /v1/files/{file_id}"',
              f'parameters = {{ "path.file_id" = "{ids["file_to_delete"]}" }}']
    return "\n".join(lines) + "\n"


def test_the_gateway_answers_what_openais_document_says(tmp_path: Path) -> None:
    """Schemathesis finds nothing against OpenAI's document (the checks in the docstring)."""
    keys = tmp_path / "keys.json"
    key = add_key(keys, "schemathesis")
    with _engine("e", tmp_path) as engine, _engine("held", tmp_path, "--delay", "600") as held:
        port = _free_port()
        config = tmp_path / "server.yaml"
        answering, holding = _url_of(engine), _url_of(held)
        # chat is answered by translation to chat completions, native by the engine's own
        # Responses API; held never answers, so its batch stays in progress.
        config.write_text(
            f"listen: 127.0.0.1:{port}\ndatabase: sqlite:///{tmp_path}/llmgw.db\n"
            f"keys_file: {keys}\nmodels:\n"
            f"  - name: chat\n    upstream: [{answering}]\n    health: {{path: null}}\n"
            "    capabilities: [chat, completions, embeddings, audio, speech]\n"
            f"  - name: native\n    upstream: [{answering}]\n    health: {{path: null}}\n"
            "    capabilities: [chat, responses]\n"
            f"  - name: held\n    upstream: [{holding}]\n    health: {{path: null}}\n")
        serve_log = tmp_path / "serve.log"
        with _process([sys.executable, "-m", "llmgw", "serve", "-c", str(config),
                       "--log-level", "warning"], serve_log) as proc:
            url = f"http://127.0.0.1:{port}"
            _wait_until_serving(url, key, proc, serve_log)
            ids = _fixtures(url, key)
            (tmp_path / "openai.json").write_text(json.dumps(document(ids["response"])))
            (tmp_path / "schemathesis.toml").write_text(_config(ids))
            run = subprocess.run(
                [str(SCHEMATHESIS), "--config-file", str(tmp_path / "schemathesis.toml"), "run",
                 str(tmp_path / "openai.json"), "--url", url,
                 "--header", f"Authorization: Bearer {key}", "--mode", "all",
                 "--phases", "examples,coverage,fuzzing", "--seed", "20261203",
                 "--max-examples", "10", "--workers", "1", "--generation-database", "none",
                 "--request-timeout", "30", "--no-color"],
                capture_output=True, text=True, timeout=600, cwd=tmp_path, check=False)
        log = serve_log.read_text()
    assert run.returncode == 0, run.stdout[-20000:] + run.stderr[-5000:]
    assert "Traceback" not in log, log[-5000:]


def _wait_until_serving(url: str, key: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + DEADLINE
    while True:
        assert proc.poll() is None, log.read_text()
        with contextlib.suppress(httpx.HTTPError):
            r = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {key}"},
                          timeout=2)
            if r.status_code == 200:
                return
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)
