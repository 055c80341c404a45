"""The Nomad client: connection settings reach the wire, and every failure becomes an
llmgw error naming the Nomad address and what to check.

These run against a real HTTP(S) server on loopback that answers what each
test scripts, including the failures a healthy fake never produces: a 403, a
proxy's HTML, a leaderless cluster, a TLS server with an unknown CA.
"""

from __future__ import annotations

import json
import ssl
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from llmgw.config import NomadConfig, load_config
from llmgw.errors import (
    BackendPermissionError,
    BackendUnavailableError,
    ConfigError,
    NotFoundError,
)
from llmgw.scheduler.nomad.client import NomadClient, NomadRejectedError, ScaleBlockedError
from llmgw.scheduler.nomad.render import render_job

from ..conftest import require_tool
from .shapes import GPU_CLASSES
from .test_render import EMBED


class Scripted(ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.answers: dict[tuple[str, str], tuple[int, bytes, dict[str, str]]] = {}
        self.seen: list[dict[str, Any]] = []

    @property
    def url(self) -> str:
        scheme = "https" if isinstance(self.socket, ssl.SSLSocket) else "http"
        return f"{scheme}://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: Scripted

    def _answer(self) -> None:
        parts = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.server.seen.append({"method": self.command, "path": parts.path,
                                 "query": parse_qs(parts.query), "headers": dict(self.headers),
                                 "body": json.loads(body) if body else None})
        status, payload, headers = self.server.answers.get(
            (self.command, parts.path), (404, b"resource not found", {}))
        self.send_response(status)
        self.send_header("Content-Type", headers.pop("Content-Type", "application/json"))
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_PUT = do_DELETE = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[Scripted]:
    s = Scripted()
    t = threading.Thread(target=s.serve_forever, daemon=True)
    t.start()
    yield s
    s.shutdown()
    s.server_close()


def _client(url: str, **kw: Any) -> NomadClient:
    return NomadClient(NomadConfig(address=url, timeout=5.0, **kw))


def test_token_namespace_and_region_reach_every_request(server: Scripted):
    """X-Nomad-Token, namespace and region go with each call, including raw ones (scale)."""
    server.answers[("POST", "/v1/job/llmgw-a/scale")] = (200, b'{"EvalID":"e1"}', {})
    server.answers[("GET", "/v1/service/llmgw-a")] = (200, b"[]", {})
    c = _client(server.url, token="s3cret", namespace="llm", region="eu")
    c.scale("llmgw-a", "serve", 3, "why")
    assert c.service("llmgw-a") == []
    for req in server.seen:
        assert req["headers"]["X-Nomad-Token"] == "s3cret"
        assert req["query"]["namespace"] == ["llm"]
        assert req["query"]["region"] == ["eu"]
    assert server.seen[0]["body"] == {"Count": 3, "Target": {"Group": "serve"}, "Message": "why"}


def test_registering_sends_the_job_envelope_with_go_field_names(server: Scripted):
    """POST /v1/jobs carries {"Job": {...}} exactly as rendered."""
    server.answers[("POST", "/v1/jobs")] = (200, b'{"EvalID":"e","JobModifyIndex":7}', {})
    job = render_job(EMBED, EMBED.profiles[0], NomadConfig(), GPU_CLASSES, 1, None)
    answer = _client(server.url).register(job)
    assert answer.EvalID == "e"
    sent = server.seen[0]["body"]
    assert set(sent) == {"Job"}
    assert sent["Job"]["ID"] == "llmgw-nomic-embed-text"
    engine = next(t for t in sent["Job"]["TaskGroups"][0]["Tasks"] if t["Name"] == "engine")
    assert engine["Services"][0]["Provider"] == "nomad"


def test_an_unreachable_nomad_says_where_and_what_to_check():
    """Connection refused is BackendUnavailableError naming the address and NOMAD_ADDR."""
    s = Scripted()
    url = s.url
    s.server_close()
    with pytest.raises(BackendUnavailableError) as err:
        _client(url).jobs("llmgw-")
    assert url in err.value.message
    assert "NOMAD_ADDR" in err.value.message


def test_a_forbidden_token_is_named_with_the_capabilities_needed(server: Scripted):
    """403 Permission denied is a permission error, not an outage: it names the capability
    the refused call needs, in which namespace, and the token's configuration."""
    text = {"Content-Type": "text/plain"}
    server.answers[("GET", "/v1/jobs")] = (403, b"Permission denied", text)
    with pytest.raises(BackendPermissionError) as err:
        _client(server.url, namespace="llm").jobs("llmgw-")
    assert not isinstance(err.value, BackendUnavailableError)
    msg = err.value.message
    assert "403: Permission denied" in msg
    assert "NOMAD_TOKEN" in msg
    assert "list-jobs in namespace 'llm'" in msg
    assert err.value.needs == ("list-jobs in namespace 'llm'",)


def test_a_leaderless_cluster_is_unavailable_and_an_invalid_job_is_rejected(server: Scripted):
    """500 No cluster leader is an outage; a 500 refusing a job is that job's error."""
    server.answers[("GET", "/v1/jobs")] = (500, b"No cluster leader", {})
    with pytest.raises(BackendUnavailableError, match="No cluster leader"):
        _client(server.url).jobs("llmgw-")
    text = (b"1 error occurred:\n\t* Task group serve validation failed: 1 error occurred:\n"
            b"\t* Task can only ask for 'cpu' or 'cores' resource, not both.\n\n")
    server.answers[("POST", "/v1/jobs")] = (500, text, {"Content-Type": "text/plain"})
    job = render_job(EMBED, EMBED.profiles[0], NomadConfig(), GPU_CLASSES, 1, None)
    with pytest.raises(NomadRejectedError, match="not both"):
        _client(server.url).register(job)


def test_an_answer_that_is_not_nomads_json_is_an_outage_naming_the_address(server: Scripted):
    """A proxy's HTML page on 200 is not a list of jobs: say the address is not Nomad's."""
    html = {"Content-Type": "text/html"}
    server.answers[("GET", "/v1/jobs")] = (200, b"<html>login</html>", html)
    with pytest.raises(BackendUnavailableError) as err:
        _client(server.url).jobs("llmgw-")
    assert "not Nomad's JSON" in err.value.message
    assert server.url in err.value.message


def test_scale_refused_during_a_deployment_is_its_own_error(server: Scripted):
    """400 'job scaling blocked due to active deployment' raises ScaleBlockedError."""
    server.answers[("POST", "/v1/job/llmgw-a/scale")] = (
        400, b"job scaling blocked due to active deployment", {"Content-Type": "text/plain"})
    with pytest.raises(ScaleBlockedError):
        _client(server.url).scale("llmgw-a", "serve", 2, "")


def test_not_found_and_null_answers_are_told_apart(server: Scripted):
    """An unknown allocation is NotFound; an allocation without checks yet is {} (null)."""
    server.answers[("GET", "/v1/allocation/a1/checks")] = (200, b"null", {})
    assert _client(server.url).alloc_checks("a1") == {}
    with pytest.raises(NotFoundError):
        _client(server.url).alloc_checks("a2")


def test_blocking_queries_pass_index_and_wait_and_return_the_new_index(server: Scripted):
    """services(index, wait) sends ?index=&wait= and reads X-Nomad-Index."""
    server.answers[("GET", "/v1/services")] = (
        200, b'[{"Namespace":"default","Services":[{"ServiceName":"llmgw-a","Tags":[]}]}]',
        {"X-Nomad-Index": "42"})
    listing, index = _client(server.url).services(7, 2.0)
    assert index == 42
    assert listing[0].Services[0].ServiceName == "llmgw-a"
    assert server.seen[0]["query"]["index"] == ["7"]
    assert server.seen[0]["query"]["wait"] == ["2s"]


# ---- TLS --------------------------------------------------------------------

def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_tool("openssl", "apt-get install openssl")
    d = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca-key.pem",
             "-out", "ca.pem", "-days", "2", "-subj", "/CN=nomad-test-ca", cwd=d)
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    for name in ("server", "client"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}-key.pem",
                 "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca-key.pem",
                 "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", "san.ext",
                 cwd=d)
    return d


@pytest.fixture
def tls_server(pki: Path) -> Iterator[Scripted]:
    s = Scripted()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki / "ca.pem"))
    ctx.load_cert_chain(pki / "server.pem", pki / "server-key.pem")
    ctx.verify_mode = ssl.CERT_REQUIRED          # Nomad's verify_https_client
    s.socket = ctx.wrap_socket(s.socket, server_side=True)
    s.answers[("GET", "/v1/jobs")] = (200, b"[]", {})
    t = threading.Thread(target=s.serve_forever, daemon=True)
    t.start()
    yield s
    s.shutdown()
    s.server_close()


def test_tls_with_our_ca_and_a_client_certificate_connects(tls_server: Scripted, pki: Path):
    """ca_cert verifies the server; client_cert/client_key satisfy verify_https_client."""
    c = _client(tls_server.url, ca_cert=str(pki / "ca.pem"),
                client_cert=str(pki / "client.pem"), client_key=str(pki / "client-key.pem"))
    assert c.jobs("llmgw-") == []


def test_tls_verification_is_on_without_a_ca(tls_server: Scripted, pki: Path):
    """Python-nomad's verify=False default is overridden: an unknown CA is refused."""
    c = _client(tls_server.url, client_cert=str(pki / "client.pem"),
                client_key=str(pki / "client-key.pem"))
    with pytest.raises(BackendUnavailableError, match="NOMAD_CACERT"):
        c.jobs("llmgw-")


def test_tls_without_a_client_certificate_is_refused_and_names_the_settings(
        tls_server: Scripted, pki: Path):
    """Servers with verify_https_client refuse a caller that presents no certificate; the
    error says llmgw presented none and which settings (and variables) give it one."""
    c = _client(tls_server.url, ca_cert=str(pki / "ca.pem"))
    with pytest.raises(BackendUnavailableError) as err:
        c.jobs("llmgw-")
    msg = err.value.message
    assert tls_server.url in msg
    assert "no client certificate" in msg
    for name in ("client_cert", "client_key", "NOMAD_CLIENT_CERT", "NOMAD_CLIENT_KEY",
                 "verify_https_client"):
        assert name in msg


def _nomad_config(tmp_path: Path, env: dict[str, str], **nomad: object) -> Path:
    path = tmp_path / "server.yaml"
    path.write_text(json.dumps({"scheduler": {"kind": "nomad", "nomad": nomad}}))
    return path


@pytest.mark.parametrize(("nomad", "env", "names"), [
    ({"address": "https://nomad.internal:4646", "client_cert": "/etc/llmgw/nomad-cli.pem"},
     {}, ("client_cert", "client_key")),
    ({"address": "https://nomad.internal:4646"},
     {"NOMAD_CLIENT_KEY": "/etc/llmgw/nomad-cli-key.pem"},
     ("client_key", "client_cert", "NOMAD_CLIENT_CERT")),
    ({"address": "http://nomad.internal:4646", "ca_cert": "/etc/llmgw/nomad-ca.pem"},
     {}, ("http://nomad.internal:4646", "ca_cert", "https://")),
    ({"address": "https://nomad.internal:4646", "ca_cert": "/etc/llmgw/nomad-ca.pem",
      "tls_skip_verify": True}, {}, ("tls_skip_verify", "ca_cert")),
], ids=["cert-without-key", "key-without-cert-from-env", "tls-on-http", "skip-beside-ca"])
def test_tls_settings_that_cannot_work_together_are_refused_at_load(
        tmp_path: Path, nomad: dict[str, object], env: dict[str, str], names: tuple[str, ...]):
    """A client certificate without its key (or the reverse) would be dropped silently and
    every call refused by servers that verify clients; a CA or certificate on an http://
    address is never used; tls_skip_verify beside a CA contradicts it. Each is a
    ConfigError at load naming the settings."""
    with pytest.raises(ConfigError) as err:
        load_config(_nomad_config(tmp_path, env, **nomad), env=env)
    for name in names:
        assert name in err.value.message
    assert (err.value.field or "").startswith("scheduler.nomad.")


def test_nomad_tls_variables_do_not_stop_a_server_that_schedules_locally(tmp_path: Path):
    """NOMAD_CACERT exported for an operator's CLI, with no https address, is no error for a
    server whose scheduler is local: it never connects to Nomad."""
    path = tmp_path / "server.yaml"
    path.write_text(json.dumps({"scheduler": {"kind": "local"}}))
    cfg = load_config(path, env={"NOMAD_CACERT": "/home/ops/.nomad/nomad-ca.pem"})
    assert cfg.scheduler.nomad.ca_cert == "/home/ops/.nomad/nomad-ca.pem"
