"""The KServe v2 / Triton HTTP inference protocol with its binary-tensor extension, as `vitdeploy serve` speaks
it: :func:`parse_infer_request` (a JSON header + binary data, as ``tritonclient.http`` sends it; JSON tensors too)
and :func:`encode_infer_response`; Triton's binary BYTES layout (:func:`serialize_bytes`,
:func:`deserialize_bytes`). The gRPC transport (kserve_grpc.py) turns its messages into this form, so both check a
request the same way; the contract they share (names, images, metadata) is protocol.py.

A malformed request is a RequestError (400) with a one-line reason; too many images is 400 here (Triton's status
for a batch over ``max_batch_size``).
"""

from __future__ import annotations

import base64
import binascii
import json
import struct
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

from ..base.errors import BatchTooLargeError, RequestError
from ..base.vocab import IMAGE_SIZE_PARAM
from .image_sizes import requested_size
from .outputs import (
    DEFAULT_TOP_K,
    LOGITS,
    OUTPUTS,
    PATCH_TOKENS,
    TOPK_LABELS,
    TOPK_SCORES,
    default_outputs,
    output_arrays,
)
from .protocol import INPUT, MODEL_VERSION, check_image_count

#: The HTTP header of the v2 binary-tensor extension: length of the JSON part of the body.
HEADER_LENGTH = "Inference-Header-Content-Length"


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
    scores: str = "softmax",
) -> tuple[bytes, dict[str, str]]:
    """The v2 response body and its extra headers for ``logits`` (N, C) of ``request``'s images (with
    ``embedding``: the (N, D) vectors, answered as EMBEDDINGS; ``patch_tokens`` (N, P, D) as PATCH_TOKENS;
    ``version``: the model's version that answers; ``scores``: the export's score function, for TOPK_SCORES).

    Outputs the request asked for (all by default), JSON or binary as asked; with any
    binary output the body is the JSON header followed by the binary tensors and the headers
    carry ``Inference-Header-Content-Length``.
    """
    tensors = output_arrays(logits, labels, k, request.classification, embedding, patch_tokens, scores)
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


__all__ = [
    "HEADER_LENGTH",
    "InferRequest",
    "deserialize_bytes",
    "encode_infer_response",
    "parse_infer_request",
    "serialize_bytes",
]
