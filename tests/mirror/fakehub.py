"""A stand-in for the Hugging Face Hub on loopback, for huggingface-hub to talk to.

It implements what huggingface-hub (2.x) calls for ``model_info``
(``GET /api/models/{repo}[/revision/{rev}]``), file metadata
(``HEAD /{repo}/resolve/{rev}/{file}``, reading ``X-Repo-Commit``, ``ETag``
and ``Content-Length``) and downloads (``GET`` of the same URL, with Range),
and answers errors the way the Hub does: the ``X-Error-Code`` header
(``RepoNotFound``, ``RevisionNotFound``, ``EntryNotFound``, ``GatedRepo``) is
what huggingface-hub turns into its exception classes (see
``huggingface_hub.utils._http.hf_raise_for_status``).
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

from tests.mirror.servers import Seen


@dataclass
class FakeRepo:
    files: dict[str, bytes]
    commit: str = "3f1c0a5e9b7d2c4a6e8f0b1d3c5e7a9b2d4f6a8c"
    branches: tuple[str, ...] = ("main",)
    gated: bool = False
    lfs: set[str] = field(default_factory=set)           # files stored in LFS
    wrong_lfs_sha: set[str] = field(default_factory=set)  # files whose recorded sum is wrong

    def lfs_sha(self, path: str) -> str:
        if path in self.wrong_lfs_sha:
            return "0" * 64
        return hashlib.sha256(self.files[path]).hexdigest()


class FakeHub:
    def __init__(self, repos: dict[str, FakeRepo]) -> None:
        self.repos = repos
        self.seen: list[Seen] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                return None

            def do_GET(self) -> None:
                outer.seen.append(Seen("GET", self.path, dict(self.headers.items())))
                outer.handle(self, body=True)

            def do_HEAD(self) -> None:
                outer.seen.append(Seen("HEAD", self.path, dict(self.headers.items())))
                outer.handle(self, body=False)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    # -- answers --------------------------------------------------------------------------

    @staticmethod
    def _error(h: BaseHTTPRequestHandler, status: int, code: str, commit: str | None = None
               ) -> None:
        body = json.dumps({"error": code}).encode()
        h.send_response(status)
        h.send_header("X-Error-Code", code)
        h.send_header("X-Error-Message", code)
        if commit:
            h.send_header("X-Repo-Commit", commit)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(body)

    def _revision_ok(self, repo: FakeRepo, rev: str) -> bool:
        return rev in repo.branches or rev == repo.commit

    def handle(self, h: BaseHTTPRequestHandler, *, body: bool) -> None:
        path = unquote(urlsplit(h.path).path)
        if path.startswith("/api/models/"):
            self._model_info(h, path[len("/api/models/"):])
            return
        parts = path.lstrip("/").split("/")
        if len(parts) >= 5 and parts[2] == "resolve":
            repo_id = f"{parts[0]}/{parts[1]}"
            self._resolve(h, repo_id, parts[3], "/".join(parts[4:]), body=body)
            return
        self._error(h, 404, "NotFound")

    def _model_info(self, h: BaseHTTPRequestHandler, rest: str) -> None:
        repo_id, _, rev = rest.partition("/revision/")
        repo = self.repos.get(repo_id)
        if repo is None:
            self._error(h, 401, "RepoNotFound")
            return
        if rev and not self._revision_ok(repo, rev):
            self._error(h, 404, "RevisionNotFound")
            return
        siblings = []
        for name, data in sorted(repo.files.items()):
            item: dict[str, Any] = {"rfilename": name, "size": len(data)}
            if name in repo.lfs:
                item["lfs"] = {"size": len(data), "sha256": repo.lfs_sha(name),
                               "pointerSize": 134}
            siblings.append(item)
        doc = {"id": repo_id, "modelId": repo_id, "sha": repo.commit, "private": False,
               "gated": "manual" if repo.gated else False, "siblings": siblings}
        data = json.dumps(doc).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def _resolve(self, h: BaseHTTPRequestHandler, repo_id: str, rev: str, name: str, *,
                 body: bool) -> None:
        repo = self.repos.get(repo_id)
        if repo is None:
            self._error(h, 401, "RepoNotFound")
            return
        if not self._revision_ok(repo, rev):
            self._error(h, 404, "RevisionNotFound")
            return
        if repo.gated:
            self._error(h, 401, "GatedRepo")
            return
        if name not in repo.files:
            self._error(h, 404, "EntryNotFound", repo.commit)
            return
        data = repo.files[name]
        start = 0
        rng = h.headers.get("Range")
        if rng and rng.startswith("bytes=") and body:
            start = int(rng[6:].split("-")[0])
            h.send_response(206)
            h.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            h.send_response(200)
        h.send_header("X-Repo-Commit", repo.commit)
        h.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
        h.send_header("Accept-Ranges", "bytes")
        h.send_header("Content-Length", str(len(data) - start))
        h.end_headers()
        if body:
            h.wfile.write(data[start:])
