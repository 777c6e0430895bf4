"""The serving contract shared by `vitdeploy serve` (Ray Serve) and the generated Triton repository.

One module, numpy + Pillow only (no Ray, no Triton, no torch), so both servers give the same
answers for the same bytes (see SERVE_CONTRACT.md):

* :func:`model_name` - the model's name on the wire, from the manifest's ``name``;
* tensor names :data:`INPUT`, :data:`LOGITS`, :data:`TOPK_LABELS`, :data:`TOPK_SCORES` (a classifier's),
  :data:`EMBEDDINGS` (an embedding model's vectors; :data:`PATCH_TOKENS` its patch tokens, when asked for);
  :func:`output_tensors` lists a model's outputs;
* :func:`decode_image` / :func:`preprocess_images` - encoded image bytes -> the float32 NCHW
  batch with the runtime's own preprocessing (:class:`vitdeploy.runtime.preprocess.Preprocessor`,
  bit for bit), each bad image raised as a typed :class:`~vitdeploy.base.errors.ImageError` (a
  RequestError) with a one-line reason, no traceback and no server path; the HTTP status of every
  error type is chosen in one table, :mod:`vitdeploy.serve.http_errors`;
* :func:`top_k_arrays` - logits -> the top-k tensors of the v2 protocol (``POST /predict``
  answers with the Predictor's own ``predict --json`` objects);
* :func:`images_from_tensor` - a BYTES tensor (numpy object array, shape ``[N]`` or ``[N, 1]``)
  -> the list of encoded images;
* the KServe v2 / Triton HTTP inference protocol with its binary-tensor extension:
  :func:`parse_infer_request` (JSON header + binary data, as ``tritonclient.http`` sends it) and
  :func:`encode_infer_response`, plus :func:`model_metadata`.

Status codes: a bad image (empty, not an image, truncated, decompression bomb) is 400, as Triton
answers for a failed request; too many images is 413 on ``POST /predict`` and 400 on the v2 protocol
(Triton's status for a batch over ``max_batch_size``); too large a body is 413; a content type that is
neither an image, multipart nor the v2 protocol is 415. Requests beyond the server's queue get 503
from the server itself (Ray Serve's ``max_queued_requests``, Triton's queue policy).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import struct
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from ..base.errors import (
    BatchTooLargeError,
    EmptyImageError,
    EmptyRequestError,
    ImageError,
    InputError,
    RequestError,
    TooManyImagesError,
    first_line,
)
from ..base.vocab import EXPORT_BACKEND, EXPORT_IMAGE_SIZES, EXPORT_SHA256, IMAGE_SIZE_PARAM
from .http_errors import MAX_REASON
from .image_sizes import requested_size, sizes_parameter
from .outputs import (
    CONFIG_TYPES,
    DEFAULT_TOP_K,
    EMBEDDINGS,
    LOGITS,
    OUTPUTS,
    PATCH_TOKENS,
    TOPK_LABELS,
    TOPK_SCORES,
    classify,
    default_outputs,
    output_arrays,
    output_tensors,
    served_outputs,
    top_k_arrays,
)

#: Input tensor: the encoded images, datatype BYTES, shape [N] (or [N, 1]).
INPUT = "IMAGES"
#: The one model version both servers publish.
MODEL_VERSION = "1"
#: The HTTP header of the v2 binary-tensor extension: length of the JSON part of the body.
HEADER_LENGTH = "Inference-Header-Content-Length"

_NAME_OK = re.compile(r"[^A-Za-z0-9_-]+")


# --------------------------------------------------------------------------------------------
# names


def model_name(manifest_name: str) -> str:
    """The model name both servers publish: the manifest's ``name`` with every run of characters
    outside ``[A-Za-z0-9_-]`` replaced by one ``_`` (``"vit-demo-digits"`` stays as it is,
    ``"my model.v2"`` becomes ``"my_model_v2"``); ``"model"`` when nothing is left."""
    cleaned = _NAME_OK.sub("_", str(manifest_name or "")).strip("_")
    return cleaned or "model"


# --------------------------------------------------------------------------------------------
# which export a server runs

# The parameters both servers publish to say which export they run and on which backend (`vitdeploy validate
# --url` reads them; a rollout tells versions apart by them), named in base/vocab.py: EXPORT_SHA256 (the sha256
# of the export's manifest.json, Artifacts.manifest_sha256) and EXPORT_BACKEND (the backend that runs it, whose
# thresholds judge it). In the model's configuration (``GET /v2/models/<name>/config``, gRPC ``ModelConfig``;
# Triton's ``parameters``, each ``{"string_value": ...}``, the generated repository's ensemble ``config.pbtxt``)
# and, on `vitdeploy serve`, in the v2 metadata too (``GET /v2/models/<name>``: ``"parameters"``, plain strings).


def export_parameters(sha256: str, backend: str, sizes: Sequence[int] = ()) -> dict[str, str]:
    """``{EXPORT_SHA256: sha256, EXPORT_BACKEND: backend}``: what a server says about the export it runs; with
    ``sizes`` (an export for several sizes) :data:`EXPORT_IMAGE_SIZES` too, the sizes a request may ask for
    (serve/image_sizes.py)."""
    return {EXPORT_SHA256: str(sha256), EXPORT_BACKEND: str(backend), **sizes_parameter(sizes)}


def config_parameters(params: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """``params`` in the form of Triton's model configuration JSON: each value as ``{"string_value": ...}``."""
    return {str(k): {"string_value": str(v)} for k, v in params.items()}


def served_export(doc: Any) -> dict[str, str]:
    """The export parameters (:data:`EXPORT_SHA256`, :data:`EXPORT_BACKEND`, those present) of a model's v2
    metadata or configuration as JSON (a value plain, or Triton's ``{"string_value": ...}``); {} when it
    states none (a server of another make, or of a vitdeploy before they were published)."""
    params = doc.get("parameters") if isinstance(doc, Mapping) else None
    out: dict[str, str] = {}
    for key in (EXPORT_SHA256, EXPORT_BACKEND):
        value = params.get(key) if isinstance(params, Mapping) else None
        if isinstance(value, Mapping):
            value = value.get("string_value")
        if isinstance(value, str) and value:
            out[key] = value
    return out


# --------------------------------------------------------------------------------------------
# errors


def check_image_count(count: int, max_images: int, too_many: type[RequestError] = TooManyImagesError) -> None:
    """RequestError unless 1 <= ``count`` <= ``max_images`` (0: EmptyRequestError; too many: ``too_many``,
    TooManyImagesError (413) for POST /predict, BatchTooLargeError (400) on the v2 protocol as Triton answers)."""
    if count < 1:
        raise EmptyRequestError("the request holds no image; send one or more encoded images (JPEG, PNG, ...)")
    if count > max_images:
        raise too_many(f"too many images in one request: {count}, the limit is {max_images}; split the request")


# --------------------------------------------------------------------------------------------
# images -> batch (the runtime's preprocessing)


def decode_image(
    data: bytes | bytearray | memoryview, preprocessor: Callable[[bytes], np.ndarray], name: str = "image"
) -> np.ndarray:
    """Encoded bytes -> one float32 (3, H, W) image, through ``preprocessor`` (a
    :class:`~vitdeploy.runtime.preprocess.Preprocessor`: decoding limits, EXIF, resize,
    normalisation exactly as ``vitdeploy predict``).

    A bad image raises :class:`RequestError` (400) whose message starts with ``name`` (a
    multipart filename, ``"body"``, ``"IMAGES[3]"``...): never a server path, never a traceback.
    Thread-safe; servers call it from a thread pool, one image per call.
    """
    raw = bytes(data)
    if not raw:
        raise EmptyImageError(f"{name}: empty (0 bytes); expected an encoded image (JPEG, PNG, ...)")
    try:
        return preprocessor(raw)
    except InputError as exc:
        message = str(exc)
        if message.startswith("<bytes>"):
            message = name + message[len("<bytes>") :]
        # the same type (its HTTP status is chosen by type, in serve/http_errors.py), renamed, one line
        raise (type(exc) if isinstance(exc, ImageError) else ImageError)(first_line(message, MAX_REASON)) from None


def preprocess_images(
    images: Sequence[bytes], preprocessor: Callable[[bytes], np.ndarray], names: Sequence[str] | None = None
) -> tuple[np.ndarray, list[int], dict[int, RequestError]]:
    """Decode several images, one bad image never sinking the others.

    Returns ``(batch, good, errors)``: ``batch`` float32 (len(good), 3, H, W) for the images whose
    indices are in ``good`` (ascending) and ``errors`` mapping each failed index to its
    :class:`RequestError`. ``names`` default to ``IMAGES[i]``.
    """
    names = list(names) if names is not None else [f"{INPUT}[{i}]" for i in range(len(images))]
    rows: list[np.ndarray] = []
    good: list[int] = []
    errors: dict[int, RequestError] = {}
    for i, blob in enumerate(images):
        try:
            rows.append(decode_image(blob, preprocessor, names[i]))
        except RequestError as exc:
            errors[i] = exc
            continue
        good.append(i)
    shape = getattr(preprocessor, "output_shape", None)
    if rows:
        batch = np.stack(rows)
    else:
        batch = np.empty((0, *(shape or (3, 0, 0))), dtype=np.float32)
    return batch, good, errors


def images_from_tensor(tensor: np.ndarray) -> list[bytes]:
    """A BYTES tensor (numpy ``object`` or ``bytes_`` array, shape ``[N]`` or ``[N, 1]``) ->
    ``N`` encoded images. RequestError (400) for any other shape."""
    arr = np.asarray(tensor)
    if arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    if arr.ndim != 1:
        raise RequestError(f"input {INPUT} must have shape [N] or [N, 1] (N encoded images), got {list(arr.shape)}")
    out = []
    for item in arr.tolist():
        if isinstance(item, str):
            item = item.encode("utf-8")
        if not isinstance(item, (bytes, bytearray)):
            raise RequestError(f"input {INPUT} must hold encoded image bytes, got {type(item).__name__}")
        out.append(bytes(item))
    return out


# --------------------------------------------------------------------------------------------
# answers (the output tensors: vitdeploy/serve/outputs.py)


def error_record(name: str, error: RequestError | str) -> dict[str, str]:
    """The ``predict --json`` record of an image that could not be read."""
    return {"path": name, "error": str(error)}


# --------------------------------------------------------------------------------------------
# KServe v2 / Triton HTTP protocol


@dataclass
class InferRequest:
    """A parsed v2 infer request: the images, and how each requested output is to be sent."""

    images: list[bytes]
    id: str | None = None
    #: requested output name -> True when it goes in binary form; all outputs when none named.
    outputs: dict[str, bool] = field(default_factory=dict)
    #: output name -> class_count, where the classification extension was asked for (a numeric output)
    classification: dict[str, int] = field(default_factory=dict)
    #: the size asked (request ``parameters.image_size``, an export for several sizes); None: the base size
    image_size: int | None = None


def serialize_bytes(items: Iterable[bytes]) -> bytes:
    """Triton's binary BYTES layout: each element as a 4-byte little-endian length + its bytes."""
    return b"".join(struct.pack("<I", len(b)) + b for b in items)


def deserialize_bytes(buf: bytes, count: int) -> list[bytes]:
    """Inverse of :func:`serialize_bytes`; RequestError (400) when ``buf`` holds other than
    exactly ``count`` well-formed elements."""
    out, pos, view = [], 0, memoryview(buf)
    while pos < len(buf):
        if pos + 4 > len(buf):
            raise RequestError(f"input {INPUT}: binary data ends inside an element's 4-byte length")
        (size,) = struct.unpack_from("<I", buf, pos)
        pos += 4
        if pos + size > len(buf):
            raise RequestError(f"input {INPUT}: element {len(out)} claims {size} bytes, only {len(buf) - pos} left")
        out.append(bytes(view[pos : pos + size]))
        pos += size
    if len(out) != count:
        raise RequestError(f"input {INPUT}: shape says {count} element(s), the binary data holds {len(out)}")
    return out


def parse_infer_request(
    body: bytes, header_length: int | str | None, max_images: int, served: Sequence[str] = OUTPUTS
) -> InferRequest:
    """Parse a v2 infer request body (JSON, or JSON + binary tensors when ``header_length``, the
    ``Inference-Header-Content-Length`` header, is given).

    The request must carry exactly one input, :data:`INPUT`, datatype BYTES, shape ``[N]`` or
    ``[N, 1]``, either as binary data (``parameters.binary_data_size``) or as a JSON list of
    strings (base64, else their UTF-8 bytes as Triton reads them); the outputs asked for are among
    ``served`` (the model's); the request's ``parameters.image_size`` (:data:`IMAGE_SIZE_PARAM`) is the size
    asked of an export for several sizes. RequestError (400, also beyond ``max_images``) otherwise.
    """
    if header_length is None or header_length == "":
        head, rest = body, b""
    else:
        try:
            size = int(header_length)
        except ValueError:
            raise RequestError(f"header {HEADER_LENGTH} must be an integer, got {header_length!r}") from None
        if not 0 < size <= len(body):
            raise RequestError(f"header {HEADER_LENGTH} = {size} does not fit a body of {len(body)} bytes")
        head, rest = body[:size], body[size:]
    try:
        doc = json.loads(head)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RequestError(
            f"the inference request is not valid JSON ({exc}); send the v2 protocol's JSON "
            f"(with {HEADER_LENGTH} for binary data)"
        ) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list):
        raise RequestError('the inference request must be a JSON object with an "inputs" list')
    inputs = doc["inputs"]
    if len(inputs) != 1 or not isinstance(inputs[0], dict) or inputs[0].get("name") != INPUT:
        got = [i.get("name") if isinstance(i, dict) else i for i in inputs]
        raise RequestError(f"expected exactly one input named {INPUT!r}, got {got}")
    tensor = inputs[0]
    if tensor.get("datatype") != "BYTES":
        raise RequestError(f"input {INPUT} must have datatype BYTES, got {tensor.get('datatype')!r}")
    count = _count_from_shape(tensor.get("shape"))
    # 400 beyond the batch limit, as Triton answers ("batch-size must be <= max_batch_size"), so one client
    # sees the same status from both servers.
    check_image_count(count, max_images, BatchTooLargeError)
    params = tensor.get("parameters") or {}
    if not isinstance(params, dict):
        raise RequestError(f'input {INPUT}: "parameters" must be an object')
    if "binary_data_size" in params:
        size = params["binary_data_size"]
        if not isinstance(size, int) or isinstance(size, bool) or size != len(rest):
            raise RequestError(
                f"input {INPUT}: binary_data_size {size!r} does not match the {len(rest)} bytes after the JSON header"
            )
        images = deserialize_bytes(rest, count)
    else:
        if rest:
            raise RequestError("binary data after the JSON header but no input declares binary_data_size")
        images = _images_from_json(tensor.get("data"), count)
    outputs, classification = _requested_outputs(doc, served)
    top = doc.get("parameters")
    size = requested_size(top.get(IMAGE_SIZE_PARAM)) if isinstance(top, dict) else None
    return InferRequest(
        images=images, id=_request_id(doc), outputs=outputs, classification=classification, image_size=size
    )


def _count_from_shape(shape: Any) -> int:
    ok = isinstance(shape, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in shape)
    if ok and len(shape) == 1 and shape[0] >= 0:
        return shape[0]
    if ok and len(shape) == 2 and shape[1] == 1 and shape[0] >= 0:
        return shape[0]
    raise RequestError(f"input {INPUT} must have shape [N] or [N, 1], got {shape!r}")


def _images_from_json(data: Any, count: int) -> list[bytes]:
    flat: list[Any] = []
    stack = [data] if data is not None else []
    while stack:  # flatten nested lists ([[...]] for shape [N, 1]) in order
        item = stack.pop(0)
        if isinstance(item, list):
            stack[:0] = item
        else:
            flat.append(item)
    if not all(isinstance(v, str) for v in flat):
        raise RequestError(f"input {INPUT}: JSON data must be a list of strings (or send binary data)")
    if len(flat) != count:
        raise RequestError(f"input {INPUT}: shape says {count} element(s), data holds {len(flat)}")
    return [_json_bytes(v) for v in flat]


def _json_bytes(text: str) -> bytes:
    """One BYTES element sent as a JSON string: base64 (how binary data travels in JSON), else its
    UTF-8 bytes (Triton's reading). An encoded image is never valid UTF-8 text, so base64 is tried first."""
    compact = "".join(text.split())
    if compact and len(compact) % 4 == 0:
        try:
            return base64.b64decode(compact, validate=True)
        except (binascii.Error, ValueError):
            pass
    return text.encode("utf-8")


def _flag(value: Any, what: str) -> bool:
    """A protocol boolean: true/false, or the strings "true"/"false" (any case); RequestError otherwise."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise RequestError(f"{what} must be true or false, got {value!r}")


def _request_id(doc: dict[str, Any]) -> str | None:
    rid = doc.get("id")
    return None if rid is None else str(rid)


def _requested_outputs(doc: dict[str, Any], served: Sequence[str]) -> tuple[dict[str, bool], dict[str, int]]:
    params = doc.get("parameters") or {}
    default_binary = (
        _flag(params.get("binary_data_output", False), "parameters.binary_data_output")
        if isinstance(params, dict)
        else False
    )
    requested = doc.get("outputs")
    if not requested:
        return {name: default_binary for name in default_outputs(served)}, {}
    if not isinstance(requested, list):
        raise RequestError('"outputs" must be a list of {"name": ...} objects')
    out: dict[str, bool] = {}
    classes: dict[str, int] = {}
    for item in requested:
        name = item.get("name") if isinstance(item, dict) else None
        if name not in served:
            raise RequestError(f"unknown output {name!r}; this model has {', '.join(served)}")
        p = item.get("parameters") or {}
        if isinstance(p, dict) and "classification" in p:
            classes[name] = _class_count(name, p["classification"])
        out[name] = (
            _flag(p.get("binary_data", default_binary), f"output {name}: parameters.binary_data")
            if isinstance(p, dict)
            else default_binary
        )
    return out, classes


def _class_count(name: str, value: Any) -> int:
    """The classification extension's class_count for output ``name``: on LOGITS and TOPK_SCORES (numbers), as
    Triton answers it; refused on TOPK_LABELS (strings), where Triton itself fails."""
    if name == PATCH_TOKENS:
        raise RequestError(f"output {name}: the classification extension (class_count) needs a row of numbers")
    if name == TOPK_LABELS:
        raise RequestError(
            f"output {name}: the classification extension (class_count) needs a numeric output; ask it of "
            f"{LOGITS} or {TOPK_SCORES}, or read {TOPK_LABELS} as it is"
        )
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise RequestError(f"output {name}: parameters.classification must be a whole number >= 0, got {value!r}")
    return value


def encode_infer_response(
    model: str,
    request: InferRequest,
    logits: np.ndarray,
    labels: Sequence[str],
    k: int = DEFAULT_TOP_K,
    embedding: bool = False,
    patch_tokens: np.ndarray | None = None,
    version: str = MODEL_VERSION,
) -> tuple[bytes, dict[str, str]]:
    """The v2 response body and its extra headers for ``logits`` (N, C) of ``request``'s images (with
    ``embedding``: the (N, D) vectors, answered as EMBEDDINGS; ``patch_tokens`` (N, P, D) as PATCH_TOKENS;
    ``version``: the model's version that answers).

    Outputs the request asked for (all by default), JSON or binary as asked; with any
    binary output the body is the JSON header followed by the binary tensors and the headers
    carry ``Inference-Header-Content-Length``.
    """
    tensors = output_arrays(logits, labels, k, request.classification, embedding, patch_tokens)
    outputs, blobs = [], []
    for name, binary in request.outputs.items():
        datatype, arr = tensors[name]
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(arr.shape)}
        if binary:
            raw = serialize_bytes(arr.ravel().tolist()) if datatype == "BYTES" else arr.tobytes()
            entry["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        elif datatype == "BYTES":
            entry["data"] = [b.decode("utf-8") for b in arr.ravel().tolist()]
        else:
            entry["data"] = [float(v) for v in arr.ravel()]
        outputs.append(entry)
    doc: dict[str, Any] = {"model_name": model, "model_version": version, "outputs": outputs}
    if request.id is not None:
        doc["id"] = request.id
    head = json.dumps(doc, separators=(",", ":")).encode("utf-8")
    if not blobs:
        return head, {"Content-Type": "application/json"}
    return head + b"".join(blobs), {HEADER_LENGTH: str(len(head)), "Content-Type": "application/octet-stream"}


def model_metadata(
    model: str,
    num_classes: int,
    k: int = DEFAULT_TOP_K,
    platform: str = "vitdeploy",
    embedding: bool = False,
    patch_shape: Sequence[int] | None = None,
    parameters: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The v2 model metadata (``GET /v2/models/<name>``) of the contract's model (``num_classes``: an embedding
    model's dimension; ``patch_shape``: (P, D) of its PATCH_TOKENS, where it has them); ``parameters``
    (:func:`export_parameters`: which export, which backend) as plain strings."""
    meta: dict[str, Any] = {
        "name": model,
        "versions": [MODEL_VERSION],
        "platform": platform,
        # [-1, 1] as the Triton ensemble publishes it; requests with shape [N] are accepted too.
        "inputs": [{"name": INPUT, "datatype": "BYTES", "shape": [-1, 1]}],
        "outputs": [
            {"name": name, "datatype": dtype, "shape": [-1, *dims]}
            for name, dtype, dims in output_tensors(num_classes, k, embedding, patch_shape)
        ],
    }
    if parameters:
        meta["parameters"] = {str(k): str(v) for k, v in parameters.items()}
    return meta


__all__ = [
    "CONFIG_TYPES",
    "DEFAULT_TOP_K",
    "EMBEDDINGS",
    "EXPORT_BACKEND",
    "EXPORT_IMAGE_SIZES",
    "EXPORT_SHA256",
    "HEADER_LENGTH",
    "IMAGE_SIZE_PARAM",
    "INPUT",
    "LOGITS",
    "MODEL_VERSION",
    "OUTPUTS",
    "PATCH_TOKENS",
    "TOPK_LABELS",
    "TOPK_SCORES",
    "InferRequest",
    "RequestError",
    "check_image_count",
    "classify",
    "config_parameters",
    "decode_image",
    "default_outputs",
    "deserialize_bytes",
    "encode_infer_response",
    "error_record",
    "export_parameters",
    "images_from_tensor",
    "model_metadata",
    "model_name",
    "output_arrays",
    "output_tensors",
    "parse_infer_request",
    "preprocess_images",
    "requested_size",
    "serialize_bytes",
    "served_export",
    "served_outputs",
    "top_k_arrays",
]
