"""What `vitdeploy rollout` asks a server before it touches anything (vitdeploy/client/rollout/server.py): a
made-up HTTP server whose answers the test decides (with or without a serve token, vitdeploy's or not)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from vitdeploy.base.errors import BackendError, ConfigError
from vitdeploy.client.rollout.server import export_sha, find_server, served_sha
from vitdeploy.serve.auth import digest

TOKEN = "a-serve-token-of-32-characters-x"


class _Server:
    def __init__(self, token: str | None = None, name: str = "vitdeploy", models=("m",)) -> None:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                if token and self.headers.get("Authorization") != f"Bearer {token}":
                    return self._send(401, {"error": "this route needs the serve token"})
                if self.path == "/v2":
                    return self._send(200, {"name": name, "models": list(models)})
                if self.path.startswith("/v2/models/"):
                    return self._send(200, {"name": self.path.rsplit("/", 1)[-1], "versions": ["1"]})
                return self._send(404, {"error": "no such route"})

            def _send(self, status: int, doc: object) -> None:
                body = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        owner.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def __enter__(self) -> "_Server":
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_an_open_server_gives_its_one_model_and_the_candidate_no_token():
    with _Server() as srv:
        server = find_server(srv.url, None, TOKEN)
    assert (server.model, server.token, server.token_digest) == ("m", None, None)
    assert server.metadata["versions"] == ["1"]


def test_a_server_with_a_token_needs_the_same_and_the_candidate_requires_it():
    with _Server(token=TOKEN) as srv:
        with pytest.raises(ConfigError, match="needs the serve token: set VITDEPLOY_SERVE_TOKEN"):
            find_server(srv.url, None, None)
        with pytest.raises(ConfigError, match="refuses the serve token given") as err:
            find_server(srv.url, None, "another-token-of-32-characters-xx")
        assert "another-token" not in str(err.value)
        server = find_server(srv.url, None, TOKEN)
    assert server.token_digest == digest(TOKEN) and server.token == TOKEN


def test_the_model_is_named_when_several_are_served_and_must_be_one_of_them():
    with _Server(models=("a", "b")) as srv:
        with pytest.raises(ConfigError, match="serves a, b: name one with --model"):
            find_server(srv.url, None, None)
        with pytest.raises(ConfigError, match="--model c: .* serves a, b"):
            find_server(srv.url, "c", None)
        assert find_server(srv.url, "b", None).model == "b"


def test_a_server_without_vitdeploys_guard_is_refused_and_an_unreachable_one_said():
    with _Server(name="triton") as srv:
        with pytest.raises(BackendError, match="is not a `vitdeploy serve` with its proxy's guard"):
            find_server(srv.url, None, None)
        url = srv.url
    with pytest.raises(BackendError, match=f"cannot reach {url}"):
        find_server(url, None, None)


def test_the_export_sha_is_the_manifests_and_a_server_may_say_its_own(tiny_artifacts):
    import hashlib

    from vitdeploy.runtime.artifacts import Artifacts

    folder = tiny_artifacts(seed=0)
    assert export_sha(Artifacts.open(folder)) == hashlib.sha256((folder / "manifest.json").read_bytes()).hexdigest()
    assert served_sha({"parameters": {"vitdeploy_export_sha256": "ab12"}}) == "ab12"
    assert served_sha({"name": "m"}) is None
