"""The KServe v2 HTTP inference protocol as `vitdeploy serve` speaks it (vitdeploy/serve/kserve_http.py): requests
parsed, answers encoded, Triton's binary BYTES layout (no server needed)."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

from vitdeploy.serve import kserve_http as K
from vitdeploy.serve import protocol as P
from vitdeploy.serve.http_errors import status_of


def _png(size=(40, 30), colour=(200, 30, 10)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, format="PNG")
    return buf.getvalue()


def test_bytes_tensor_layout_round_trips_and_refuses_a_wrong_count():
    items = [b"", b"abc", bytes(range(256))]
    raw = K.serialize_bytes(items)
    assert raw[:4] == b"\x00\x00\x00\x00" and K.deserialize_bytes(raw, 3) == items
    with pytest.raises(P.RequestError, match="shape says 2"):
        K.deserialize_bytes(raw, 2)
    with pytest.raises(P.RequestError, match="claims 3 bytes"):
        K.deserialize_bytes(raw[:9], 2)


def test_tritonclient_request_is_parsed_and_the_response_read_back_by_tritonclient():
    httpclient = pytest.importorskip("tritonclient.http")
    from tritonclient.http._utils import _get_inference_request

    images = [_png(), _png((8, 9))]
    inp = httpclient.InferInput(P.INPUT, [2], "BYTES")
    inp.set_data_from_numpy(np.array(images, dtype=object))
    body, json_size = _get_inference_request([inp], "r1", None, 0, False, False, 0, None, None)
    req = K.parse_infer_request(body, json_size, max_images=8)
    assert req.images == images and req.id == "r1" and all(req.outputs.values())

    logits = np.array([[0.0, 2.0, 1.0], [3.0, 3.0, -1.0]], dtype=np.float32)
    out, headers = K.encode_infer_response("m", req, logits, ["a", "b", "c"], k=2)
    result = httpclient.InferResult.from_response_body(out, header_length=int(headers[K.HEADER_LENGTH]))
    np.testing.assert_array_equal(result.as_numpy(P.LOGITS), logits)
    assert result.as_numpy(P.TOPK_LABELS).tolist() == [[b"b", b"c"], [b"a", b"b"]]  # ties: lower index first
    scores = result.as_numpy(P.TOPK_SCORES)
    assert scores.dtype == np.float32 and scores.shape == (2, 2) and scores[0, 0] > scores[0, 1]


def test_json_tensors_in_and_out():
    body = json.dumps(
        {
            "inputs": [{"name": P.INPUT, "datatype": "BYTES", "shape": [1, 1], "data": [["abc"]]}],
            "outputs": [{"name": P.TOPK_LABELS}],
        }
    ).encode()
    req = K.parse_infer_request(body, None, max_images=4)
    assert req.images == [b"abc"] and req.outputs == {P.TOPK_LABELS: False}
    out, headers = K.encode_infer_response("m", req, np.array([[1.0, 0.0]], np.float32), ["x", "y"], k=5)
    assert K.HEADER_LENGTH not in headers
    assert json.loads(out)["outputs"] == [
        {"name": P.TOPK_LABELS, "datatype": "BYTES", "shape": [1, 2], "data": ["x", "y"]}
    ]


@pytest.mark.parametrize(
    "doc, status, fragment",
    [
        ({"inputs": []}, 400, "exactly one input"),
        ({"inputs": [{"name": "X", "datatype": "BYTES", "shape": [1], "data": ["a"]}]}, 400, "exactly one input"),
        ({"inputs": [{"name": "IMAGES", "datatype": "FP32", "shape": [1], "data": [1.0]}]}, 400, "datatype BYTES"),
        ({"inputs": [{"name": "IMAGES", "datatype": "BYTES", "shape": [1, 2], "data": ["a", "b"]}]}, 400, "shape"),
        ({"inputs": [{"name": "IMAGES", "datatype": "BYTES", "shape": [0], "data": []}]}, 400, "no image"),
        (
            {"inputs": [{"name": "IMAGES", "datatype": "BYTES", "shape": [9], "data": ["a"] * 9}]},
            400,
            "too many images",
        ),
        ({"inputs": [{"name": "IMAGES", "datatype": "BYTES", "shape": [2], "data": ["a"]}]}, 400, "data holds 1"),
        (
            {
                "inputs": [{"name": "IMAGES", "datatype": "BYTES", "shape": [1], "data": ["a"]}],
                "outputs": [{"name": "PROBS"}],
            },
            400,
            "unknown output 'PROBS'",
        ),
    ],
)
def test_malformed_requests_get_a_status_and_one_line(doc, status, fragment):
    with pytest.raises(P.RequestError) as info:
        K.parse_infer_request(json.dumps(doc).encode(), None, max_images=8)
    assert status_of(info.value) == status and fragment in str(info.value) and "\n" not in str(info.value)


def test_not_json_is_400():
    with pytest.raises(P.RequestError, match="not valid JSON") as info:
        K.parse_infer_request(b"\xff\xd8\xff", None, max_images=8)
    assert status_of(info.value) == 400


def test_json_bytes_are_base64_decoded_and_text_stays_utf8():
    png = _png()
    doc = {
        "inputs": [
            {
                "name": P.INPUT,
                "datatype": "BYTES",
                "shape": [2],
                "data": [__import__("base64").b64encode(png).decode(), "plain text"],
            }
        ]
    }
    req = K.parse_infer_request(json.dumps(doc).encode(), None, max_images=4)
    assert req.images == [png, b"plain text"]


@pytest.mark.parametrize(
    "flag, binary", [("false", False), ("FALSE", False), ("true", True), (False, False), (True, True)]
)
def test_binary_data_flags_read_strings_as_booleans(flag, binary):
    doc = {
        "inputs": [{"name": P.INPUT, "datatype": "BYTES", "shape": [1], "data": ["a"]}],
        "outputs": [{"name": P.LOGITS, "parameters": {"binary_data": flag}}],
    }
    assert K.parse_infer_request(json.dumps(doc).encode(), None, 4).outputs == {P.LOGITS: binary}


def test_a_binary_data_flag_that_is_not_a_boolean_is_400():
    doc = {
        "inputs": [{"name": P.INPUT, "datatype": "BYTES", "shape": [1], "data": ["a"]}],
        "parameters": {"binary_data_output": "yes"},
    }
    with pytest.raises(P.RequestError, match="binary_data_output must be true or false") as info:
        K.parse_infer_request(json.dumps(doc).encode(), None, 4)
    assert status_of(info.value) == 400
