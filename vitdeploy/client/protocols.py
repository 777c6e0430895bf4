"""One request of the load generator (and of `vitdeploy validate --url`), in each protocol a vitdeploy or Triton
server speaks, through the one HTTP client (connection.py: the token, the CA bundle).

``predict``: ``POST /predict`` (or ``/v2/models/<m>/predict``) with the image as the body; ``v2-http``: KServe v2
``POST /v2/models/<m>/infer`` with input ``IMAGES`` in Triton's binary tensor form (one JPEG, shape [1, 1]) and
the top-k outputs asked for as JSON; ``v2-grpc``: the same through ``tritonclient.grpc`` (its extra; TLS at a
``grpcs://`` URL). Every client holds one connection (HTTP/1.1 keep-alive), as a real client would, and is used by
one thread at a time.

A reply is ``(status, example)``: the HTTP status (``"200"``), the gRPC code's name (``"OK"``,
``"UNAVAILABLE"``) or ``"connection error"``, and, for a failure, the start of what the server said.
:meth:`HttpClient.answer` / :meth:`GrpcClient.answer` send the same request and keep what was answered (the v2
output tensors as arrays, or ``/predict``'s JSON record); :func:`model_document` reads a model's v2 JSON
(``/config``, ``/stats``) over HTTP or gRPC.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol
from urllib.parse import urlsplit

from ..base._deps import require
from ..base.errors import ConfigError, first_line
from ..base.vocab import IMAGE_SIZE_PARAM
from ..serve.kserve_http import HEADER_LENGTH, deserialize_bytes, serialize_bytes
from ..serve.outputs import EMBEDDINGS
from ..serve.protocol import INPUT, TOPK_LABELS, TOPK_SCORES
from ..serve.stage_timing import HEADER as SERVER_TIMING
from ..serve.stage_timing import parse_server_timing
from .connection import TIMEOUT_S, CaBundle, auth_headers, open_grpc, open_http, transport_errors

PREDICT, V2_HTTP, V2_GRPC = "predict", "v2-http", "v2-grpc"
PROTOCOLS = (PREDICT, V2_HTTP, V2_GRPC)
OK = ("200", "OK")
EXAMPLE_CHARS = 300  # of a failed request's answer, kept as its status's example
CONNECTION_ERROR = "connection error"
#: v2 datatypes an answer is read back in (BYTES: a list of bytes)
_DTYPES = {"FP32": "<f4", "FP16": "<f2", "FP64": "<f8", "INT64": "<i8", "INT32": "<i4", "BOOL": "?"}


@dataclass(frozen=True)
class Target:
    """Where the load goes: the server's URL (``http://host:port``, ``https://...``; gRPC: ``host:port``,
    ``grpc://host:port`` or ``grpcs://host:port``), the model's name (needed by the v2 protocols), the protocol, the
    bearer token (never printed) and the CA bundle an HTTPS (grpcs) server's certificate is verified against
    (None: the system's trust store, connection.py)."""

    url: str
    protocol: str = PREDICT
    model: Optional[str] = None
    token: Optional[str] = field(default=None, repr=False)
    #: the v2 outputs asked for: a classifier's top-k (as a client shows it), or an embedding model's EMBEDDINGS
    outputs: tuple[str, ...] = (TOPK_LABELS, TOPK_SCORES)
    #: the size asked of an export for several sizes (request parameter ``image_size``); None: not asked
    image_size: Optional[int] = None
    ca_bundle: CaBundle = None
    #: the model's version every request names (``/v2/models/<m>/versions/K/...``, gRPC ``model_version``); None:
    #: unversioned, answered by whichever version the server routes it to
    version: Optional[str] = None

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
    def route(self) -> str:
        """The model's v2 route: ``/v2/models/<m>``, or ``/v2/models/<m>/versions/K`` when a version is pinned."""
        return f"/v2/models/{self.model}" + (f"/versions/{self.version}" if self.version else "")

    @property
    def host(self) -> str:
        return urlsplit(self.url if "://" in self.url else f"grpc://{self.url}").hostname or ""

    def headers(self) -> dict[str, str]:
        """The bearer token's header (gRPC metadata keys are lower case: grpc refuses ``Authorization``)."""
        return auth_headers(self.token, grpc=self.protocol == V2_GRPC)

    def open_http(self, timeout_s: Optional[float] = None) -> Any:
        """The one HTTP client (connection.py) for this server: its URL, token and CA bundle."""
        return open_http(self.url, self.token, self.ca_bundle, **({"timeout_s": timeout_s} if timeout_s else {}))


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
    """``predict`` or ``v2-http`` over one keep-alive connection (connection.py's client).
    ``server_timing``: the last answer's ``Server-Timing`` as {stage: ms} ({} when it had none)."""

    server_timing: dict[str, float] = {}

    def __init__(self, target: Target) -> None:
        self.http = target.open_http()
        self._errors = transport_errors()
        self.target = target
        if target.protocol == PREDICT:
            self.path = f"{target.route}/predict" if target.model else "/predict"
            if target.image_size is not None:
                self.path += f"?{IMAGE_SIZE_PARAM}={int(target.image_size)}"
        else:
            self.path = f"{target.route}/infer"

    def _request(self, image: bytes) -> tuple[bytes, dict[str, str]]:
        if self.target.protocol == PREDICT:
            return image, {"Content-Type": "application/octet-stream"}
        return infer_body(image, {}, self.target.outputs, self.target.image_size)

    def _exchange(self, image: bytes) -> tuple[str, bytes, Any]:
        """(status, body, response headers) of one request; ``CONNECTION_ERROR`` with the reason as the body."""
        body, headers = self._request(image)
        self.server_timing = {}
        try:
            response = self.http.post(self.path, content=body, headers=headers)
        except self._errors as exc:  # the next request opens a new connection
            return CONNECTION_ERROR, first_line(exc).encode(), {}
        self.server_timing = parse_server_timing(response.headers.get(SERVER_TIMING))
        return str(response.status_code), response.content, response.headers

    def send(self, image: bytes) -> tuple[str, str]:
        status, answer, _ = self._exchange(image)
        if status == "200":
            return status, ""
        return status, answer[:EXAMPLE_CHARS].decode("utf-8", "replace")

    def answer(self, image: bytes) -> tuple[str, Any]:
        """``("200", what was answered)``: the v2 outputs by name as arrays, or ``/predict``'s record of the image;
        else ``(status, the start of what the server said)``."""
        status, answer, headers = self._exchange(image)
        if status != "200":
            return status, answer[:EXAMPLE_CHARS].decode("utf-8", "replace")
        try:
            if self.target.protocol == PREDICT:
                records = json.loads(answer)
                return status, records[0] if isinstance(records, list) and records else records
            return status, read_infer_response(answer, headers.get(HEADER_LENGTH))
        except (ValueError, KeyError, TypeError) as exc:
            return "unreadable answer", first_line(exc)[:EXAMPLE_CHARS]

    def close(self) -> None:
        self.http.close()


def read_infer_response(body: bytes, header_length: Optional[str]) -> dict[str, Any]:
    """A v2 infer response (JSON, or JSON + binary tensors) -> its outputs by name: numeric ones as arrays of
    their shape, BYTES as a list of bytes. ValueError for a body that is none."""
    size = int(header_length) if header_length else len(body)
    doc, rest, pos = json.loads(body[:size]), body[size:], 0
    out: dict[str, Any] = {}
    for item in doc["outputs"]:
        shape, dtype = [int(d) for d in item["shape"]], item["datatype"]
        count = 1
        for d in shape:
            count *= d
        binary = (item.get("parameters") or {}).get("binary_data_size")
        if binary is not None:
            raw, pos = rest[pos : pos + int(binary)], pos + int(binary)
            if dtype == "BYTES":
                out[item["name"]] = deserialize_bytes(raw, count)
                continue
            import numpy as np

            out[item["name"]] = np.frombuffer(raw, dtype=_DTYPES[dtype]).reshape(shape)
        elif dtype == "BYTES":
            out[item["name"]] = [str(v).encode("utf-8") for v in item["data"]]
        else:
            import numpy as np

            out[item["name"]] = np.asarray(item["data"], dtype=_DTYPES[dtype]).reshape(shape)
    return out


def infer_body(
    image: bytes,
    headers: dict[str, str],
    outputs: tuple[str, ...] = (TOPK_LABELS, TOPK_SCORES),
    image_size: Optional[int] = None,
) -> tuple[bytes, dict[str, str]]:
    """A v2 infer request for one image: the JSON header, then the image in Triton's binary BYTES layout;
    ``outputs`` asked for as JSON (an embedding's vector in the binary tensor extension, as clients take it);
    ``image_size``: the size asked of an export for several sizes (the request's ``parameters``)."""
    data = serialize_bytes([image])
    doc: dict[str, Any] = {
        "inputs": [
            {"name": INPUT, "shape": [1, 1], "datatype": "BYTES", "parameters": {"binary_data_size": len(data)}}
        ],
        "outputs": [{"name": name, "parameters": {"binary_data": name == EMBEDDINGS}} for name in outputs],
    }
    if image_size is not None:
        doc["parameters"] = {IMAGE_SIZE_PARAM: int(image_size)}
    head = json.dumps(doc, separators=(",", ":")).encode()
    return head + data, {**headers, "Content-Type": "application/octet-stream", HEADER_LENGTH: str(len(head))}


class GrpcClient:
    """``v2-grpc``: KServe v2 ``ModelInfer`` through tritonclient.grpc (``pip install 'tritonclient[grpc]'``)."""

    def __init__(self, target: Target) -> None:
        import numpy as np

        self.client = open_grpc(target.url, target.ca_bundle, "vitdeploy loadtest --protocol v2-grpc")
        self._np, self._grpc = np, require("tritonclient.grpc", "--protocol v2-grpc")
        self.target = target
        self.outputs = [self._grpc.InferRequestedOutput(name) for name in target.outputs]

    def _infer(self, image: bytes) -> tuple[str, Any]:
        from tritonclient.utils import InferenceServerException

        tensor = self._grpc.InferInput(INPUT, [1, 1], "BYTES")
        tensor.set_data_from_numpy(self._np.array([[image]], dtype=object))
        try:
            result = self.client.infer(
                self.target.model,
                [tensor],
                model_version=self.target.version or "",
                outputs=self.outputs,
                headers=self.target.headers(),
                client_timeout=TIMEOUT_S,
                parameters=None if self.target.image_size is None else {IMAGE_SIZE_PARAM: int(self.target.image_size)},
            )
        except InferenceServerException as exc:
            return grpc_status(exc), str(exc.message() or exc)[:EXAMPLE_CHARS]
        return "OK", result

    def send(self, image: bytes) -> tuple[str, str]:
        status, result = self._infer(image)
        return (status, "") if status == "OK" else (status, result)

    def answer(self, image: bytes) -> tuple[str, Any]:
        """``("OK", the outputs by name as arrays)``, else ``(the gRPC code's name, what the server said)``."""
        status, result = self._infer(image)
        if status != "OK":
            return status, result
        return status, {name: result.as_numpy(name) for name in self.target.outputs}

    def close(self) -> None:
        self.client.close()


def open_client(target: Target) -> Client:
    return GrpcClient(target) if target.protocol == V2_GRPC else HttpClient(target)


def grpc_status(exc: Any) -> str:
    """A tritonclient InferenceServerException's gRPC code, by name (``"UNAVAILABLE"``)."""
    return str(exc.status() or "UNKNOWN").replace("StatusCode.", "")


def model_document(
    target: Target, model: str, what: str = "config", timeout_s: float = 30.0, version: Optional[str] = None
) -> tuple[str, Any]:
    """A model's v2 JSON document ``what`` (``config``, ``stats``, ``metadata``): ``(status, the document)``
    (``"200"`` over HTTP, ``"OK"`` over gRPC: Triton's ``ModelConfig`` / ``ModelStatistics`` / ``ModelMetadata`` as
    JSON, field names as in the HTTP form), else ``(status, the start of what the server said)``;
    ``CONNECTION_ERROR`` when nobody answers. ``version``: that version's document (None: the unversioned one)."""
    if target.protocol == V2_GRPC:
        return _grpc_document(target, model, what, version or "")
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "")
    path += "" if what == "metadata" else f"/{what}"
    with target.open_http(timeout_s) as http:
        try:
            response = http.get(path)
        except transport_errors() as exc:
            return CONNECTION_ERROR, first_line(exc)[:EXAMPLE_CHARS]
    body = response.content
    if response.status_code != 200:
        return str(response.status_code), body[:EXAMPLE_CHARS].decode("utf-8", "replace")
    try:
        return "200", json.loads(body)
    except ValueError as exc:
        return "unreadable answer", first_line(exc)[:EXAMPLE_CHARS]


def live_version(target: Target, model: str) -> tuple[Optional[str], str]:
    """``(the version of ``model`` the server answers unversioned requests with, a line saying so)`` when its
    metadata lists several versions (a rollout put one beside the other; serve/rollout/routes.py), judged by who
    answers its unversioned statistics; ``(None, "")`` with one version or none stated (nothing to pin), and
    ``(None, why)`` when several are listed but which one is live cannot be told."""
    if "/versions/" in model:  # the caller named a version already (`rollout`'s check of its candidate)
        return None, ""
    status, meta = model_document(target, model, "metadata", timeout_s=10)
    versions = [str(v) for v in (meta.get("versions") or [])] if status in OK and isinstance(meta, dict) else []
    if len(versions) < 2:
        return None, ""
    status, stats = model_document(target, model, "stats", timeout_s=10)
    rows = stats.get("model_stats") if status in OK and isinstance(stats, dict) else None
    answered = {str(r.get("version")) for r in rows or [] if isinstance(r, dict) and r.get("name") == model}
    listed = ", ".join(versions)
    if len(answered) != 1 or not answered <= set(versions):
        return None, f"model {model} has versions {listed} and the server does not say which is live: unpinned"
    (live,) = answered
    return live, f"judged version {live} of model {model} (the live one of versions {listed}): every request named it"


def _grpc_document(target: Target, model: str, what: str, version: str = "") -> tuple[str, Any]:
    client = open_grpc(target.url, target.ca_bundle)
    from tritonclient.utils import InferenceServerException

    kw = {"model_version": version, "headers": target.headers(), "as_json": True}
    try:
        if what == "config":
            return "OK", client.get_model_config(model, **kw).get("config", {})
        if what == "metadata":
            return "OK", client.get_model_metadata(model, **kw)
        return "OK", client.get_inference_statistics(model, **kw)
    except InferenceServerException as exc:
        status = grpc_status(exc)
        return (CONNECTION_ERROR if status == "UNAVAILABLE" else status), str(exc.message() or exc)[:EXAMPLE_CHARS]
    finally:
        client.close()


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
    "grpc_status",
    "live_version",
    "model_document",
    "read_infer_response",
    "CONNECTION_ERROR",
]
