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
* :func:`model_metadata` - the v2 model metadata; the v2 HTTP inference protocol itself (its requests and
  answers, the binary-tensor extension) is :mod:`vitdeploy.serve.kserve_http`.

Status codes: a bad image (empty, not an image, truncated, decompression bomb) is 400, as Triton
answers for a failed request; too many images is 413 on ``POST /predict`` and 400 on the v2 protocol
(Triton's status for a batch over ``max_batch_size``); too large a body is 413; a content type that is
neither an image, multipart nor the v2 protocol is 415. Requests beyond the server's queue get 503
from the server itself (Ray Serve's ``max_queued_requests``, Triton's queue policy).
"""

from __future__ import annotations

import re
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..base.errors import (
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
    "IMAGE_SIZE_PARAM",
    "INPUT",
    "LOGITS",
    "MODEL_VERSION",
    "OUTPUTS",
    "PATCH_TOKENS",
    "TOPK_LABELS",
    "TOPK_SCORES",
    "RequestError",
    "check_image_count",
    "classify",
    "config_parameters",
    "decode_image",
    "default_outputs",
    "error_record",
    "export_parameters",
    "images_from_tensor",
    "model_metadata",
    "model_name",
    "output_arrays",
    "output_tensors",
    "preprocess_images",
    "requested_size",
    "served_export",
    "served_outputs",
    "top_k_arrays",
]
