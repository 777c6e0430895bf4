"""The one HTTP client (vitdeploy/client/connection.py) against a loopback HTTPS server whose certificate the test
makes: reached with the CA bundle, refused without it, by every caller that goes through it (the load generator's
clients, a model's documents, what `vitdeploy rollout` asks); the token sent the same way everywhere."""

from __future__ import annotations

import pytest
from helpers.certs import make_certs
from helpers.scripted_server import ScriptedServer

from vitdeploy.base.errors import BackendError, ConfigError
from vitdeploy.client.connection import CA_BUNDLE_ENV, open_http, transport_errors
from vitdeploy.client.protocols import CONNECTION_ERROR, PREDICT, Target, model_document, open_client
from vitdeploy.client.rollout.server import get

pytest.importorskip("cryptography")
pytest.importorskip("httpx")
TOKEN = "connection-tests-token-0123456789"


@pytest.fixture()
def certs(tmp_path):
    return make_certs(tmp_path)


@pytest.fixture()
def https(certs):
    def answer(method, path, body):  # GETs answer their path; POSTs are the script's (recorded, 200)
        return (200, {"path": path}) if method == "GET" else None

    with ScriptedServer(answer=answer, certs=certs) as server:
        assert server.url.startswith("https://127.0.0.1:")
        yield server


def test_an_https_server_is_reached_with_its_ca_bundle_and_refused_without_it(https, certs, monkeypatch):
    monkeypatch.delenv(CA_BUNDLE_ENV, raising=False)
    with open_http(https.url, TOKEN, certs.ca) as http:
        answer = http.get("/v2/models/m/config")
    assert answer.status_code == 200 and answer.json() == {"path": "/v2/models/m/config"}
    with open_http(https.url, TOKEN) as http:  # the system's trust store does not know the test's CA
        with pytest.raises(transport_errors(), match="CERTIFICATE_VERIFY_FAILED"):
            http.get("/v2/models/m/config")


def test_the_ca_bundle_may_come_from_openssls_own_variable(https, certs, monkeypatch):
    monkeypatch.setenv(CA_BUNDLE_ENV, str(certs.ca))
    with open_http(https.url) as http:
        assert http.get("/v2").status_code == 200


def test_every_caller_verifies_through_the_one_client_and_sends_the_token_as_a_bearer(https, certs, monkeypatch):
    monkeypatch.delenv(CA_BUNDLE_ENV, raising=False)
    trusted = Target(https.url, PREDICT, token=TOKEN, ca_bundle=str(certs.ca))
    client = open_client(trusted)
    try:
        assert client.send(b"jpeg") == ("200", "")
    finally:
        client.close()
    assert model_document(trusted, "m")[0] == "200"
    assert get(https.url, "/v2", TOKEN, certs.ca) == (200, {"path": "/v2"})
    path, headers, _ = https.requests[0]  # the load generator's request, as the server saw it
    assert path == "/predict" and headers["Authorization"] == f"Bearer {TOKEN}"
    assert headers.get("Accept-Encoding") == "identity"  # an answer as any client gets it: never compressed

    untrusted = Target(https.url, PREDICT, token=TOKEN)
    client = open_client(untrusted)
    try:
        status, why = client.send(b"jpeg")
    finally:
        client.close()
    assert status == CONNECTION_ERROR and "CERTIFICATE_VERIFY_FAILED" in why
    assert model_document(untrusted, "m")[0] == CONNECTION_ERROR
    with pytest.raises(BackendError, match="cannot reach .*CERTIFICATE_VERIFY_FAILED"):
        get(https.url, "/v2", TOKEN)


def test_a_ca_bundle_that_is_not_one_is_named(https, tmp_path):
    with pytest.raises(ConfigError, match="CA bundle .*missing.pem: not a file"):
        open_http(https.url, ca_bundle=tmp_path / "missing.pem")
    (tmp_path / "junk.pem").write_text("not a certificate")
    with pytest.raises(ConfigError, match="CA bundle .*junk.pem: not a PEM CA bundle"):
        open_http(https.url, ca_bundle=tmp_path / "junk.pem")
