"""One request of the load generator, in each protocol a vitdeploy or Triton server speaks.

``predict``: ``POST /predict`` (or ``/v2/models/<m>/predict``) with the image as the body; ``v2-http``: KServe v2
``POST /v2/models/<m>/infer`` with input ``IMAGES`` in Triton's binary tensor form (one JPEG, shape [1, 1]) and
the top-k outputs asked for as JSON; ``v2-grpc``: the same through ``tritonclient.grpc`` (its extra). Every
client holds one connection (HTTP/1.1 keep-alive), as a real client would, and is used by one thread at a time.

A reply is ``(status, example)``: the HTTP status (``"200"``), the gRPC code's name (``"OK"``,
``"UNAVAILABLE"``) or ``"connection error"``, and, for a failure, the start of what the server said.
"""

from __future__ import annotations

import http.client
import json
from dataclasses import dataclass
from typing import Any, Optional, Protocol
from urllib.parse import urlsplit

from ..base._deps import require
from ..base.errors import ConfigError, first_line
from ..serve.outputs import EMBEDDINGS
from ..serve.protocol import HEADER_LENGTH, INPUT, TOPK_LABELS, TOPK_SCORES, serialize_bytes

PREDICT, V2_HTTP, V2_GRPC = "predict", "v2-http", "v2-grpc"
PROTOCOLS = (PREDICT, V2_HTTP, V2_GRPC)
OK = ("200", "OK")
EXAMPLE_CHARS = 300  # of a failed request's answer, kept as its status's example
TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Target:
    """Where the load goes: the server's URL (``http://host:port``; gRPC: ``host:port`` or ``grpc://host:port``),
    the model's name (needed by the v2 protocols), the protocol and the bearer token (never printed)."""

    url: str
    protocol: str = PREDICT
    model: Optional[str] = None
    token: Optional[str] = None
    #: the v2 outputs asked for: a classifier's top-k (as a client shows it), or an embedding model's EMBEDDINGS
    outputs: tuple[str, ...] = (TOPK_LABELS, TOPK_SCORES)

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ConfigError(f"--protocol {self.protocol!r}: expected one of {', '.join(PROTOCOLS)}")
        if self.protocol != PREDICT and not self.model:
            raise ConfigError(f"--protocol {self.protocol} needs --model (the name in /v2/models/<name>)")
        if self.protocol != V2_GRPC and "://" not in self.url:  # host:port, as tritonclient takes it
            object.__setattr__(self, "url", f"http://{self.url}")
        if self.protocol != V2_GRPC and urlsplit(self.url).scheme not in ("http", "https"):
            raise ConfigError(f"URL {self.url!r}: expected http://host:port for --protocol {self.protocol}")

    @property
    def host(self) -> str:
        return urlsplit(self.url if "://" in self.url else f"grpc://{self.url}").hostname or ""

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}


def asked_outputs(artifacts: Any) -> tuple[str, ...]:
    """What a client of the export at ``artifacts`` asks for: an embedding model's EMBEDDINGS, else (or with no
    export named) the top-k."""
    from ..runtime.artifacts import Artifacts

    embedding = artifacts is not None and Artifacts.open(artifacts, verify=False).schema.is_embedding
    return (EMBEDDINGS,) if embedding else (TOPK_LABELS, TOPK_SCORES)


class Client(Protocol):
    def send(self, image: bytes) -> tuple[str, str]: ...

    def close(self) -> None: ...


class HttpClient:
    """``predict`` or ``v2-http`` over one keep-alive connection (the standard library's: the load generator
    often shares the cores with the server, so it should cost as little CPU as a real client can)."""

    def __init__(self, target: Target) -> None:
        parts = urlsplit(target.url)
        kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        self.conn = kind(parts.hostname, parts.port, timeout=TIMEOUT_S)
        self.target = target
        base = parts.path.rstrip("/")
        if target.protocol == PREDICT:
            self.path = f"{base}/v2/models/{target.model}/predict" if target.model else f"{base}/predict"
        else:
            self.path = f"{base}/v2/models/{target.model}/infer"

    def _request(self, image: bytes) -> tuple[bytes, dict[str, str]]:
        headers = self.target.headers()
        if self.target.protocol == PREDICT:
            return image, {**headers, "Content-Type": "application/octet-stream"}
        return infer_body(image, headers, self.target.outputs)

    def send(self, image: bytes) -> tuple[str, str]:
        body, headers = self._request(image)
        try:
            self.conn.request("POST", self.path, body=body, headers=headers)
            response = self.conn.getresponse()
            answer = response.read()
        except (OSError, http.client.HTTPException) as exc:
            self.conn.close()  # the next request opens a new connection
            return "connection error", first_line(exc)[:EXAMPLE_CHARS]
        if response.status == 200:
            return "200", ""
        return str(response.status), answer[:EXAMPLE_CHARS].decode("utf-8", "replace")

    def close(self) -> None:
        self.conn.close()


def infer_body(
    image: bytes, headers: dict[str, str], outputs: tuple[str, ...] = (TOPK_LABELS, TOPK_SCORES)
) -> tuple[bytes, dict[str, str]]:
    """A v2 infer request for one image: the JSON header, then the image in Triton's binary BYTES layout;
    ``outputs`` asked for as JSON (an embedding's vector in the binary tensor extension, as clients take it)."""
    data = serialize_bytes([image])
    doc = {
        "inputs": [
            {"name": INPUT, "shape": [1, 1], "datatype": "BYTES", "parameters": {"binary_data_size": len(data)}}
        ],
        "outputs": [{"name": name, "parameters": {"binary_data": name == EMBEDDINGS}} for name in outputs],
    }
    head = json.dumps(doc, separators=(",", ":")).encode()
    return head + data, {**headers, "Content-Type": "application/octet-stream", HEADER_LENGTH: str(len(head))}


class GrpcClient:
    """``v2-grpc``: KServe v2 ``ModelInfer`` through tritonclient.grpc (``pip install 'tritonclient[grpc]'``)."""

    def __init__(self, target: Target) -> None:
        grpc = require("tritonclient.grpc", "vitdeploy loadtest --protocol v2-grpc (pip install 'tritonclient[grpc]')")
        import numpy as np

        self._np, self._grpc = np, grpc
        address = target.url.split("://", 1)[-1].rstrip("/")
        self.client = grpc.InferenceServerClient(address)
        self.target = target
        self.outputs = [grpc.InferRequestedOutput(name) for name in target.outputs]

    def send(self, image: bytes) -> tuple[str, str]:
        from tritonclient.utils import InferenceServerException

        tensor = self._grpc.InferInput(INPUT, [1, 1], "BYTES")
        tensor.set_data_from_numpy(self._np.array([[image]], dtype=object))
        try:
            self.client.infer(
                self.target.model,
                [tensor],
                outputs=self.outputs,
                headers=self.target.headers(),
                client_timeout=TIMEOUT_S,
            )
        except InferenceServerException as exc:
            status = str(exc.status() or "UNKNOWN").replace("StatusCode.", "")
            return status, str(exc.message() or exc)[:EXAMPLE_CHARS]
        return "OK", ""

    def close(self) -> None:
        self.client.close()


def open_client(target: Target) -> Client:
    return GrpcClient(target) if target.protocol == V2_GRPC else HttpClient(target)


__all__ = [
    "PROTOCOLS",
    "PREDICT",
    "V2_HTTP",
    "V2_GRPC",
    "OK",
    "Target",
    "HttpClient",
    "GrpcClient",
    "open_client",
    "infer_body",
]
