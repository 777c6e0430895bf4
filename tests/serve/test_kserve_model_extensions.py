"""`vitdeploy serve`'s Triton-protocol extensions without a server: compressed bodies (inflated within the
byte limit), the model configuration in Triton's own ModelConfig JSON, statistics in Triton's shape, and
the classification extension answered as Triton answers it on the generated ensemble."""

from __future__ import annotations

import asyncio
import gzip
import json
import zlib

import numpy as np
import pytest

from vitdeploy.serve import kserve_http as K
from vitdeploy.serve import protocol as P
from vitdeploy.serve.content_encoding import read_body
from vitdeploy.serve.http_errors import status_of
from vitdeploy.serve.kserve_model import InferenceStats, model_config


def _read(body: bytes, encoding: str | None, limit: int, chunk: int = 1000) -> bytes:
    async def chunks():
        for i in range(0, len(body), chunk):
            yield body[i : i + chunk]

    return asyncio.run(read_body(chunks(), encoding, limit))


PAYLOAD = json.dumps(
    {"inputs": [{"name": "IMAGES", "shape": [1], "datatype": "BYTES", "data": ["x" * 5000]}]}
).encode()


@pytest.mark.parametrize(
    "encoding, pack",
    [
        ("gzip", gzip.compress),
        ("deflate", zlib.compress),  # what tritonclient sends for "deflate": the zlib format
        ("deflate", lambda b: zlib.compress(b)[2:-4]),  # a raw deflate stream, as some clients send it
        ("identity", lambda b: b),
        (None, lambda b: b),
    ],
)
def test_compressed_bodies_are_inflated(encoding, pack):
    assert _read(pack(PAYLOAD), encoding, limit=1 << 20) == PAYLOAD


def test_the_limit_applies_to_the_inflated_size_without_inflating_a_bomb_in_full():
    bomb = gzip.compress(b"\0" * (50 << 20))  # 50 MB of zeros in ~50 kB
    assert len(bomb) < 100_000
    with pytest.raises(P.RequestError) as err:
        _read(bomb, "gzip", limit=1 << 20)
    assert (
        status_of(err.value) == 413 and "once inflated" in str(err.value) and "serve.max_request_mb" in str(err.value)
    )
    with pytest.raises(P.RequestError) as err:  # the wire size is capped too
        _read(b"x" * 5000, None, limit=4000)
    assert status_of(err.value) == 413


@pytest.mark.parametrize(
    "encoding, body, status, words",
    [
        ("br", b"abc", 415, "Content-Encoding 'br'"),
        ("gzip", b"not gzip at all", 400, "corrupt"),
        # mtime=0: the gzip header holds a timestamp, and every pytest-xdist worker must collect the same ids
        ("gzip", gzip.compress(PAYLOAD, mtime=0)[:-20], 400, "truncated"),
    ],
    ids=["brotli-unsupported", "gzip-corrupt", "gzip-truncated"],
)
def test_bad_encodings_are_one_line_4xx(encoding, body, status, words):
    with pytest.raises(P.RequestError) as err:
        _read(body, encoding, limit=1 << 20)
    assert status_of(err.value) == status and words in str(err.value) and "\n" not in str(err.value)


def test_the_model_config_is_tritons_model_config_json():
    pb = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    from google.protobuf import json_format

    export = P.export_parameters("ab" * 32, "ort-int8")
    cfg = model_config("demo", num_classes=10, k=5, max_batch_size=32, parameters=export)
    parsed = json_format.ParseDict(cfg, pb.ModelConfig())  # raises on any key or value Triton would not have
    assert parsed.max_batch_size == 32
    # which export and backend, in Triton's form (what the generated ensemble states), read back by one function
    assert {k: v.string_value for k, v in parsed.parameters.items()} == export
    assert (
        P.served_export(json_format.MessageToDict(parsed, preserving_proto_field_name=True))
        == export
        == P.served_export(cfg)
    )
    assert [(i.name, i.data_type, list(i.dims)) for i in parsed.input] == [("IMAGES", pb.TYPE_STRING, [1])]
    assert [(o.name, o.data_type, list(o.dims)) for o in parsed.output] == [
        ("LOGITS", pb.TYPE_FP32, [10]),
        ("TOPK_LABELS", pb.TYPE_STRING, [5]),
        ("TOPK_SCORES", pb.TYPE_FP32, [5]),
    ]


def test_statistics_count_successes_failures_and_times():
    stats = InferenceStats()
    stats.success(3, total_ns=100, queue_ns=10, input_ns=20, infer_ns=60, output_ns=5)
    stats.success(1, total_ns=50, queue_ns=1, input_ns=2, infer_ns=40, output_ns=3)
    stats.failure(total_ns=7)
    (entry,) = stats.to_json("demo")["model_stats"]
    assert entry["name"] == "demo" and entry["version"] == "1"
    assert entry["inference_count"] == 4 and entry["execution_count"] == 2 and entry["last_inference"] > 0
    s = entry["inference_stats"]
    assert s["success"] == {"count": 2, "ns": 150} and s["fail"] == {"count": 1, "ns": 7}
    assert s["queue"]["ns"] == 11 and s["compute_input"]["ns"] == 22 and s["compute_infer"]["ns"] == 100
    assert s["compute_output"] == {"count": 2, "ns": 8}


def _request(outputs: list) -> bytes:
    doc = {"inputs": [{"name": "IMAGES", "shape": [1, 1], "datatype": "BYTES", "data": ["x"]}], "outputs": outputs}
    return json.dumps(doc).encode()


def test_class_count_on_a_numeric_output_answers_as_triton_does():
    """Triton classifies LOGITS and TOPK_SCORES of the generated ensemble into b"value:index", largest first
    (read off the bundled tritonserver); the same here, never ignored."""
    req = K.parse_infer_request(_request([{"name": "LOGITS", "parameters": {"classification": 3}}]), None, 4)
    assert req.outputs == {"LOGITS": False} and req.classification == {"LOGITS": 3}
    logits = np.array([[0.5, 4.16733, -0.043378, 0.171809]], np.float32)
    body, _ = K.encode_infer_response("m", req, logits, ["a", "b", "c", "d"], k=2)
    (out,) = json.loads(body)["outputs"]
    assert out == {
        "name": "LOGITS",
        "datatype": "BYTES",
        "shape": [1, 3],
        "data": ["4.167330:1", "0.500000:0", "0.171809:3"],
    }


@pytest.mark.parametrize("value", [-1, "3", True, 2.5])
def test_a_class_count_that_is_no_count_is_refused(value):
    with pytest.raises(P.RequestError, match="classification must be a whole number"):
        K.parse_infer_request(_request([{"name": "LOGITS", "parameters": {"classification": value}}]), None, 4)


def test_class_count_on_the_label_strings_is_refused_with_400():
    """Triton itself fails on it (the bundled tritonserver closed the connection and exited): refused here."""
    with pytest.raises(P.RequestError) as err:
        K.parse_infer_request(_request([{"name": "TOPK_LABELS", "parameters": {"classification": 3}}]), None, 4)
    assert status_of(err.value) == 400 and "needs a numeric output" in str(err.value)
