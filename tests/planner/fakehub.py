"""A Hugging Face Hub on loopback, enough for huggingface-hub's download and model_info.

It answers the two requests the planner makes: ``HEAD``/``GET
/{repo}/resolve/{revision}/config.json`` (with the X-Repo-Commit and ETag
headers hf_hub_download requires) and ``GET /api/models/{repo}[/revision/{rev}]``
(with the safetensors parameter totals). Errors carry the X-Error-Code header
the real Hub sends, which huggingface-hub turns into its exception classes:
RepoNotFound (404, or 401 for a private repo without a token), GatedRepo (403),
EntryNotFound (404 for a missing file).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class HubRepo:
    config: bytes | None = None
    safetensors: dict[str, Any] | None = None
    gated: bool = False
    private: bool = False


@dataclass
class FakeHub:
    repos: dict[str, HubRepo] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)
    url: str = ""


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
                  ) -> None:
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _repo(self, repo_id: str) -> HubRepo | None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                self._send(404, b'{"error":"Repository not found"}',
                           {"X-Error-Code": "RepoNotFound"})
                return None
            if repo.private and "authorization" not in {k.lower() for k in self.headers}:
                self._send(401, b'{"error":"Invalid username or password."}',
                           {"X-Error-Code": "RepoNotFound"})
                return None
            if repo.gated:
                self._send(403, b'{"error":"Access to this model is restricted."}',
                           {"X-Error-Code": "GatedRepo",
                            "X-Error-Message": "Access to this model is restricted."})
                return None
            return repo

        def _serve(self) -> None:
            hub.requests.append(f"{self.command} {self.path}")
            path = self.path.split("?", 1)[0].strip("/").split("/")
            if path[:2] == ["api", "models"] and len(path) >= 4:
                repo = self._repo(f"{path[2]}/{path[3]}")
                if repo is None:
                    return
                body = {"id": f"{path[2]}/{path[3]}", "sha": COMMIT}
                if repo.safetensors is not None:
                    body["safetensors"] = repo.safetensors
                self._send(200, json.dumps(body).encode(), {"Content-Type": "application/json"})
                return
            if len(path) >= 5 and path[2] == "resolve":
                repo = self._repo(f"{path[0]}/{path[1]}")
                if repo is None:
                    return
                filename = "/".join(path[4:])
                if filename != "config.json" or repo.config is None:
                    self._send(404, b"Entry not found",
                               {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": COMMIT})
                    return
                self._send(200, repo.config, {"X-Repo-Commit": COMMIT, "ETag": '"cfg-etag"',
                                              "Content-Type": "application/json"})
                return
            self._send(404, b"not found")

        def do_GET(self) -> None:
            self._serve()

        def do_HEAD(self) -> None:
            self._serve()

    return Handler


@contextmanager
def running_hub(hub: FakeHub) -> Iterator[FakeHub]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=30)
