"""A Hugging Face Hub on 127.0.0.1 that answers the file API for repos a test writes, so that
``huggingface_hub`` itself downloads, caches and resolves revisions (``HF_ENDPOINT`` pointed at it).

What it answers, as the Hub does (huggingface_hub 2.x reads these):

* ``GET /api/models/{org}/{name}[/revision/{rev}]`` -> ``{"id", "sha", "siblings"}`` (``resolve_revision``,
  ``model_info``); ``GET /api/models/{org}/{name}/tree/{rev}`` -> the files (``list_repo_files``);
* ``HEAD`` / ``GET /{org}/{name}/resolve/{rev}/{file}``: ``X-Repo-Commit`` (the commit ``rev`` is),
  ``ETag`` (the git blob sha1); the weights (``LFS`` suffixes) answer ``302`` with ``X-Linked-Etag`` (their
  sha256), ``X-Linked-Size`` and a ``Location`` on another host name (``localhost``: the CDN, where the
  client sends no token), served by ``GET /cdn/{sha256}`` (``Range`` honoured);
* errors with the Hub's ``X-Error-Code``: ``RepoNotFound`` (401 for a private repo without its token),
  ``RevisionNotFound``, ``EntryNotFound`` (404, with ``X-Repo-Commit``), ``GatedRepo`` (403).

Every request is counted (``requests``), so a test can tell that HF_HUB_OFFLINE=1 made none.
``cut(filename)``: the next download of that file stops halfway (the connection closed under a
Content-Length that promised more) and the client's resume attempts get 503 until ``heal()``.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Optional
from urllib.parse import unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin", ".h5", ".msgpack", ".onnx")


@dataclass
class FakeRepo:
    repo_id: str
    token: Optional[str] = None  # set: gated (403 GatedRepo) or private (401 RepoNotFound) without it
    private: bool = False
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)  # commit -> {file: bytes}
    refs: dict[str, str] = field(default_factory=dict)  # branch or tag -> commit

    def commit(self, files: dict[str, bytes | Path], branch: str = "main", tag: Optional[str] = None) -> str:
        """A new commit of ``files`` (bytes, or a file to read) on ``branch`` (and ``tag``): its sha."""
        content = {name: (data.read_bytes() if isinstance(data, Path) else data) for name, data in files.items()}
        digest = hashlib.sha1(self.refs.get(branch, "").encode())
        for name in sorted(content):
            digest.update(name.encode() + hashlib.sha256(content[name]).digest())
        sha = digest.hexdigest()
        self.commits[sha] = content
        self.refs[branch] = sha
        if tag:
            self.refs[tag] = sha
        return sha

    def resolve(self, rev: str) -> Optional[str]:
        return rev if rev in self.commits else self.refs.get(rev)


def folder_files(folder: Path) -> dict[str, bytes | Path]:
    """Every file of a saved checkpoint folder, as a commit takes them."""
    return {p.name: p for p in sorted(folder.iterdir()) if p.is_file()}


class FakeHub:
    def __init__(self) -> None:
        self.repos: dict[str, FakeRepo] = {}
        self.requests: list[tuple[str, str]] = []
        self._cut: set[str] = set()
        self._failing: set[str] = set()
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def add(self, repo_id: str, token: Optional[str] = None, private: bool = False) -> FakeRepo:
        self.repos[repo_id] = FakeRepo(repo_id, token, private)
        return self.repos[repo_id]

    def count(self) -> int:
        with self._lock:
            return len(self.requests)

    def cut(self, filename: str) -> None:
        self._cut.add(filename)

    def heal(self) -> None:
        self._cut.clear()
        self._failing.clear()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def blob(self, sha256: str) -> Optional[tuple[str, bytes]]:
        for repo in self.repos.values():
            for files in repo.commits.values():
                for name, data in files.items():
                    if hashlib.sha256(data).hexdigest() == sha256:
                        return name, data
        return None


def _git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\x00" % len(data) + data).hexdigest()


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet
            pass

        def do_HEAD(self) -> None:
            self._route(head=True)

        def do_GET(self) -> None:
            self._route(head=False)

        # ------------------------------------------------------------------ answers

        def _send(self, status: int, body: bytes = b"", head: bool = False, **headers: str) -> None:
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key.replace("_", "-"), value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def _error(self, status: int, code: str, head: bool, **headers: str) -> None:
            body = b"" if head else json.dumps({"error": code}).encode()
            self._send(status, body, head, X_Error_Code=code, Content_Type="application/json", **headers)

        def _json(self, data: object) -> None:
            self._send(200, json.dumps(data).encode(), Content_Type="application/json")

        def _authorized(self, repo: FakeRepo) -> bool:
            return repo.token is None or self.headers.get("Authorization") == f"Bearer {repo.token}"

        # ------------------------------------------------------------------ routes

        def _route(self, head: bool) -> None:
            path = urlsplit(self.path).path
            with hub._lock:
                hub.requests.append((self.command, path))
            parts = [unquote(p) for p in path.strip("/").split("/")]
            if parts[:2] == ["api", "models"] and len(parts) >= 4:
                return self._api(parts[2] + "/" + parts[3], parts[4:], head)
            if parts[:1] == ["cdn"] and len(parts) == 2:
                return self._cdn(parts[1], head)
            if len(parts) >= 5 and parts[2] == "resolve":
                return self._resolve(parts[0] + "/" + parts[1], parts[3], "/".join(parts[4:]), head)
            self._error(404, "NotFound", head)

        def _repo(self, repo_id: str, head: bool) -> Optional[FakeRepo]:
            repo = hub.repos.get(repo_id)
            if repo is None or (repo.private and not self._authorized(repo)):
                self._error(401 if repo is not None else 404, "RepoNotFound", head)
                return None
            return repo

        def _api(self, repo_id: str, rest: list[str], head: bool) -> None:
            repo = self._repo(repo_id, head)
            if repo is None:
                return
            rev = rest[1] if len(rest) >= 2 and rest[0] in ("revision", "tree") else "main"
            commit = repo.resolve(rev)
            if commit is None:
                return self._error(404, "RevisionNotFound", head)
            files = repo.commits[commit]
            if rest[:1] == ["tree"]:
                return self._json(
                    [
                        {"type": "file", "path": n, "size": len(d), "oid": _git_sha1(d)}
                        for n, d in sorted(files.items())
                    ]
                )
            gated = "manual" if repo.token and not repo.private else False
            siblings = [{"rfilename": n} for n in sorted(files)]
            self._json({"id": repo_id, "sha": commit, "siblings": siblings, "private": repo.private, "gated": gated})

        def _resolve(self, repo_id: str, rev: str, filename: str, head: bool) -> None:
            repo = self._repo(repo_id, head)
            if repo is None:
                return
            if not self._authorized(repo):
                return self._error(403, "GatedRepo", head)
            commit = repo.resolve(rev)
            if commit is None:
                return self._error(404, "RevisionNotFound", head)
            data = repo.commits[commit].get(filename)
            if data is None:
                return self._error(404, "EntryNotFound", head, X_Repo_Commit=commit)
            common = {"X_Repo_Commit": commit, "ETag": f'"{_git_sha1(data)}"'}
            if filename.endswith(LFS_SUFFIXES):
                sha = hashlib.sha256(data).hexdigest()
                self.send_response(302)
                for key, value in {
                    **common,
                    "X_Linked_Etag": f'"{sha}"',
                    "X_Linked_Size": str(len(data)),
                    "Location": f"http://localhost:{hub.port}/cdn/{sha}",
                }.items():
                    self.send_header(key.replace("_", "-"), value)
                self.send_header("Content-Length", "0")
                return self.end_headers()
            self._send(200, data, head, **common)

        def _cdn(self, sha: str, head: bool) -> None:
            found = hub.blob(sha)
            if found is None:
                return self._error(404, "NotFound", head)
            name, data = found
            if name in hub._failing:
                return self._error(503, "Unavailable", head)
            start = 0
            ranged = self.headers.get("Range", "")
            if ranged.startswith("bytes="):
                start = int(ranged[6:].split("-")[0] or 0)
            body = data[start:]
            if not head and name in hub._cut:  # promise everything, send half, hang up
                hub._cut.discard(name)
                hub._failing.add(name)
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)
                return
            status = 206 if start else 200
            self._send(status, body, head, Content_Type="application/octet-stream")

    return Handler


def point_at(hub: FakeHub, monkeypatch, home: Path) -> Path:
    """HF_ENDPOINT at ``hub``, a fresh HF_HOME (``home``), no token, online; returns the hub cache folder.
    huggingface_hub read its constants at import: the endpoint it reports to (its user agent's registry) and
    its URL template are pointed at the fake Hub too, as HF_ENDPOINT set before import would, so nothing leaves
    loopback."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_HOME", str(home))
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "ENDPOINT", hub.url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", hub.url + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))  # no saved login
    return home / "hub"
