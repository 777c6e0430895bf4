"""The image size a request asks for (serve/image_sizes.py): read from a v2 request (HTTP JSON, gRPC's
parameters carried over), a query string's text, refused when not a whole number; one model call per size."""

from __future__ import annotations

import json

import pytest

from vitdeploy.base.errors import RequestError
from vitdeploy.serve import kserve_http, protocol
from vitdeploy.serve.image_sizes import by_shape, requested_size, sizes_parameter


def _body(parameters=None) -> bytes:
    doc = {"inputs": [{"name": "IMAGES", "datatype": "BYTES", "shape": [1], "data": ["x"]}]}
    return json.dumps({**doc, **({"parameters": parameters} if parameters is not None else {})}).encode()


def test_a_v2_request_names_its_size_in_its_parameters():
    assert kserve_http.parse_infer_request(_body({"image_size": 336}), None, 4).image_size == 336
    assert kserve_http.parse_infer_request(_body({"binary_data_output": True}), None, 4).image_size is None
    assert kserve_http.parse_infer_request(_body(), None, 4).image_size is None
    with pytest.raises(RequestError, match=r"parameters.image_size must be a whole number .* got 33.5"):
        kserve_http.parse_infer_request(_body({"image_size": 33.5}), None, 4)


@pytest.mark.parametrize("value, size", [(None, None), ("", None), ("42", 42), (" 42 ", 42), (518, 518)])
def test_requested_size_reads_numbers_and_their_text(value, size):
    assert requested_size(value) == size


@pytest.mark.parametrize("value", [True, 0, -14, "big", "4.2", 42.0])
def test_requested_size_refuses_anything_else_naming_where(value):
    with pytest.raises(RequestError, match="^image_size must be a whole number"):
        requested_size(value, "image_size")


def test_one_group_per_size_in_order():
    shapes = [(3, 28, 28), (3, 56, 56), (3, 28, 28), (3, 42, 42), (3, 56, 56)]
    assert by_shape(shapes) == [[0, 2], [1, 4], [3]]


def test_the_sizes_are_published_only_for_an_export_for_several():
    assert sizes_parameter((28, 42, 56)) == {"vitdeploy_image_sizes": "28,42,56"}
    assert protocol.export_parameters("ab", "ort") == {"vitdeploy_export_sha256": "ab", "vitdeploy_backend": "ort"}


def test_grpc_parameters_reach_the_request_parsed():
    pytest.importorskip("tritonclient.grpc", reason="tritonclient not installed")
    from tritonclient.grpc import service_pb2

    from vitdeploy.serve.kserve_grpc import http_form

    request = service_pb2.ModelInferRequest(model_name="m")
    tensor = request.inputs.add(name="IMAGES", datatype="BYTES", shape=[1])
    tensor.contents.bytes_contents.append(b"img")
    for value, field in ((42, "int64_param"), ("42", "string_param")):
        request.parameters["image_size"].ClearField("parameter_choice")
        setattr(request.parameters["image_size"], field, value)
        body, head = http_form(request)
        assert kserve_http.parse_infer_request(body, head, 4).image_size == 42
