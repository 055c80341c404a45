"""A stand-in for the Hugging Face Hub on loopback, for huggingface-hub to talk to.

Point ``HF_ENDPOINT`` (or ``HfHub(endpoint=...)``) at ``FakeHub.url`` and the
real client runs against repositories held in memory. It answers what
llmgw's Hub adapter asks for:

* ``GET /api/models/{repo}[/revision/{rev}]`` — the repository's commit, its
  files (with sizes and LFS sums when ``blobs`` is asked, as
  ``model_info(files_metadata=True)`` does) and its safetensors parameter
  counts;
* ``HEAD`` and ``GET /{repo}/resolve/{rev}/{file}`` — file metadata
  (``X-Repo-Commit``, ``ETag``, ``Content-Length``) and downloads, with one
  ``Range`` (``bytes=FIRST-[LAST]``; 416 past the end of the file).

Errors come the way the Hub sends them: the ``X-Error-Code`` header
(``RepoNotFound``, ``RevisionNotFound``, ``EntryNotFound``, ``GatedRepo``) is
what huggingface-hub turns into its exception classes
(``huggingface_hub.utils._http.hf_raise_for_status``). A missing repository
and a private one seen without a token are both 401 ``RepoNotFound``, as on
the Hub. A gated repository's metadata is public, but its files answer 401
``GatedRepo`` to an anonymous client and 403 to a token without access.

Every request is recorded in ``seen`` (method, path without the query, query,
headers), so a test can say what was asked and that nothing was written.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

DEFAULT_COMMIT = "3f1c0a5e9b7d2c4a6e8f0b1d3c5e7a9b2d4f6a8c"


@dataclass
class FakeRepo:
    """One repository. ``tokens`` may read a private or gated one."""

    files: dict[str, bytes] = field(default_factory=dict)
    commit: str = DEFAULT_COMMIT
    branches: tuple[str, ...] = ("main",)
    gated: bool = False
    private: bool = False
    tokens: set[str] = field(default_factory=set)
    lfs: set[str] = field(default_factory=set)             # files stored in LFS
    wrong_lfs_sha: set[str] = field(default_factory=set)   # files whose recorded sum is wrong
    safetensors: dict[str, int] | None = None              # parameters by dtype

    def lfs_sha(self, path: str) -> str:
        if path in self.wrong_lfs_sha:
            return "0" * 64
        return hashlib.sha256(self.files[path]).hexdigest()


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]


class FakeHub:
    """The Hub's read API over ``repos``, served on 127.0.0.1 until ``stop``."""

    def __init__(self, repos: dict[str, FakeRepo]) -> None:
        self.repos = repos
        self.seen: list[Seen] = []
        # ETags by file: hashing a 250 MB file on every ranged read would make the
        # fake, not the client, the cost a test or a benchmark sees.
        self._etags: dict[int, tuple[bytes, str]] = {}
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                return None

            def do_GET(self) -> None:
                hub._handle(self, body=True)

            def do_HEAD(self) -> None:
                hub._handle(self, body=False)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=30)

    def __enter__(self) -> FakeHub:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def paths(self, method: str | None = None) -> Iterator[str]:
        """The paths requested (with ``method`` only, if given)."""
        return (s.path for s in self.seen if method in (None, s.method))

    # -- answers ---------------------------------------------------------------------------

    @staticmethod
    def _send(h: BaseHTTPRequestHandler, status: int, body: bytes,
              headers: dict[str, str]) -> None:
        h.send_response(status)
        for key, value in headers.items():
            h.send_header(key, value)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(body)

    def _error(self, h: BaseHTTPRequestHandler, status: int, code: str,
               commit: str | None = None) -> None:
        headers = {"X-Error-Code": code, "X-Error-Message": code,
                   "Content-Type": "application/json"}
        if commit:
            headers["X-Repo-Commit"] = commit
        self._send(h, status, json.dumps({"error": code}).encode(), headers)

    @staticmethod
    def _token(h: BaseHTTPRequestHandler) -> str | None:
        auth = h.headers.get("Authorization", "")
        scheme, _, token = auth.partition(" ")
        return token.strip() if scheme.lower() == "bearer" and token.strip() else None

    def _handle(self, h: BaseHTTPRequestHandler, *, body: bool) -> None:
        parts = urlsplit(h.path)
        path = unquote(parts.path)
        self.seen.append(Seen(h.command, path, parse_qs(parts.query),
                              dict(h.headers.items())))
        if path.startswith("/api/models/"):
            self._model_info(h, path[len("/api/models/"):], parse_qs(parts.query))
            return
        segments = path.lstrip("/").split("/")
        if len(segments) >= 5 and segments[2] == "resolve":
            self._resolve(h, f"{segments[0]}/{segments[1]}", segments[3],
                          "/".join(segments[4:]), body=body)
            return
        self._error(h, 404, "NotFound")

    def _visible(self, h: BaseHTTPRequestHandler, repo_id: str) -> FakeRepo | None:
        repo = self.repos.get(repo_id)
        if repo is None or (repo.private and self._token(h) not in repo.tokens):
            self._error(h, 401, "RepoNotFound")
            return None
        return repo

    def _model_info(self, h: BaseHTTPRequestHandler, rest: str,
                    query: dict[str, list[str]]) -> None:
        repo_id, _, rev = rest.partition("/revision/")
        repo = self._visible(h, repo_id)
        if repo is None:
            return
        if rev and rev not in repo.branches and rev != repo.commit:
            self._error(h, 404, "RevisionNotFound")
            return
        blobs = query.get("blobs", ["false"])[0].lower() == "true"
        siblings = []
        for name, data in sorted(repo.files.items()):
            item: dict[str, Any] = {"rfilename": name}
            if blobs:
                item["size"] = len(data)
                if name in repo.lfs:
                    item["lfs"] = {"size": len(data), "sha256": repo.lfs_sha(name),
                                   "pointerSize": 134}
            siblings.append(item)
        doc: dict[str, Any] = {"id": repo_id, "modelId": repo_id, "sha": repo.commit,
                               "private": repo.private,
                               "gated": "manual" if repo.gated else False,
                               "siblings": siblings}
        if repo.safetensors is not None:
            doc["safetensors"] = {"parameters": repo.safetensors,
                                  "total": sum(repo.safetensors.values())}
        self._send(h, 200, json.dumps(doc).encode(), {"Content-Type": "application/json"})

    def _etag(self, data: bytes) -> str:
        cached = self._etags.get(id(data))
        if cached is None or cached[0] is not data:
            cached = (data, f'"{hashlib.sha256(data).hexdigest()}"')
            self._etags[id(data)] = cached
        return cached[1]

    def _resolve(self, h: BaseHTTPRequestHandler, repo_id: str, rev: str, name: str, *,
                 body: bool) -> None:
        repo = self._visible(h, repo_id)
        if repo is None:
            return
        if rev not in repo.branches and rev != repo.commit:
            self._error(h, 404, "RevisionNotFound")
            return
        token = self._token(h)
        if repo.gated and token not in repo.tokens:
            self._error(h, 401 if token is None else 403, "GatedRepo")
            return
        if name not in repo.files:
            self._error(h, 404, "EntryNotFound", repo.commit)
            return
        data = repo.files[name]
        etag = self._etag(data)
        headers = {"X-Repo-Commit": repo.commit, "ETag": etag, "Accept-Ranges": "bytes"}
        if name in repo.lfs:
            headers["X-Linked-Etag"] = etag
            headers["X-Linked-Size"] = str(len(data))
        rng = h.headers.get("Range")
        if rng and rng.startswith("bytes=") and body:
            first, _, last = rng[6:].partition("-")
            start = int(first)
            end = min(int(last), len(data) - 1) if last else len(data) - 1
            if start >= len(data):
                self._send(h, 416, b"", {**headers, "Content-Range": f"bytes */{len(data)}"})
                return
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            self._send(h, 206, data[start:end + 1], headers)
            return
        self._send(h, 200, data, headers)
