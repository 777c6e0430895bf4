"""The output side of the serving contract (vitdeploy/serve/outputs.py, re-exported by protocol): a classifier
answers LOGITS, TOPK_LABELS, TOPK_SCORES exactly as before; an embedding model answers its vectors alone as
EMBEDDINGS FP32 [N, D], in JSON, in the binary-tensor extension, in the metadata and the configuration."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vitdeploy.base.errors import RequestError
from vitdeploy.base.vocab import OUTPUT_TENSORS
from vitdeploy.serve import kserve_http, protocol
from vitdeploy.serve.kserve_model import model_config

VECTORS = np.array([[0.5, -1.25, 3.0, 1e-7], [2.0, 0.0, -0.125, 7.5]], dtype=np.float32)


def _request(outputs: list | None = None, binary: bool = False) -> bytes:
    doc: dict = {"inputs": [{"name": "IMAGES", "datatype": "BYTES", "shape": [2, 1], "data": ["a", "b"]}]}
    if outputs is not None:
        doc["outputs"] = outputs
    if binary:
        doc["parameters"] = {"binary_data_output": True}
    return json.dumps(doc).encode()


def test_the_embedding_output_is_the_vocabularys_graph_output_name():
    assert protocol.EMBEDDINGS == OUTPUT_TENSORS["embedding"] == "EMBEDDINGS"
    assert protocol.served_outputs(True) == ("EMBEDDINGS",)
    assert protocol.served_outputs(False) == protocol.OUTPUTS == ("LOGITS", "TOPK_LABELS", "TOPK_SCORES")


def test_output_tensors_per_kind():
    assert protocol.output_tensors(10, 5) == [
        ("LOGITS", "FP32", (10,)),
        ("TOPK_LABELS", "BYTES", (5,)),
        ("TOPK_SCORES", "FP32", (5,)),
    ]
    assert protocol.output_tensors(3, 5)[1:] == [("TOPK_LABELS", "BYTES", (3,)), ("TOPK_SCORES", "FP32", (3,))]
    assert protocol.output_tensors(384, 5, embedding=True) == [("EMBEDDINGS", "FP32", (384,))]
    assert protocol.output_tensors(384, 5, embedding=True, patch_shape=(256, 384)) == [
        ("EMBEDDINGS", "FP32", (384,)),
        ("PATCH_TOKENS", "FP32", (256, 384)),
    ]


def test_patch_tokens_are_served_only_when_named():
    """An export with patch tokens serves PATCH_TOKENS, but a request naming no output gets EMBEDDINGS alone; one
    naming it gets [N, P, D] (JSON or binary); class_count on it is refused."""
    served = protocol.served_outputs(True, patch_tokens=True)
    assert served == ("EMBEDDINGS", "PATCH_TOKENS")
    assert kserve_http.parse_infer_request(_request(), None, 8, served).outputs == {"EMBEDDINGS": False}
    tokens = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    req = kserve_http.parse_infer_request(_request([{"name": "PATCH_TOKENS"}], binary=True), None, 8, served)
    assert req.outputs == {"PATCH_TOKENS": True}
    body, headers = kserve_http.encode_infer_response("m", req, VECTORS, [], embedding=True, patch_tokens=tokens)
    head = int(headers[kserve_http.HEADER_LENGTH])
    (out,) = json.loads(body[:head])["outputs"]
    assert out["name"] == "PATCH_TOKENS" and out["shape"] == [2, 3, 4]
    assert np.array_equal(np.frombuffer(body[head:], np.float32).reshape(2, 3, 4), tokens)
    with pytest.raises(RequestError, match="output PATCH_TOKENS: the classification extension"):
        kserve_http.parse_infer_request(
            _request([{"name": "PATCH_TOKENS", "parameters": {"classification": 2}}]), None, 8, served
        )
    with pytest.raises(RequestError, match="unknown output 'PATCH_TOKENS'"):  # an export without them
        kserve_http.parse_infer_request(_request([{"name": "PATCH_TOKENS"}]), None, 8, protocol.served_outputs(True))


def test_an_embedding_answer_is_the_vectors_in_json_and_in_binary():
    req = kserve_http.parse_infer_request(_request(), None, 8, protocol.served_outputs(True))
    assert req.outputs == {"EMBEDDINGS": False}
    body, headers = kserve_http.encode_infer_response("m", req, VECTORS, [], embedding=True)
    assert headers == {"Content-Type": "application/json"}
    (out,) = json.loads(body)["outputs"]
    assert out["name"] == "EMBEDDINGS" and out["datatype"] == "FP32" and out["shape"] == [2, 4]
    np.testing.assert_array_equal(np.array(out["data"], np.float32).reshape(2, 4), VECTORS)

    req = kserve_http.parse_infer_request(_request(binary=True), None, 8, protocol.served_outputs(True))
    body, headers = kserve_http.encode_infer_response("m", req, VECTORS, [], embedding=True)
    head = int(headers[kserve_http.HEADER_LENGTH])
    (out,) = json.loads(body[:head])["outputs"]
    assert out["parameters"] == {"binary_data_size": VECTORS.nbytes} and out["shape"] == [2, 4]
    assert np.array_equal(np.frombuffer(body[head:], np.float32).reshape(2, 4), VECTORS)


@pytest.mark.parametrize("name", ["LOGITS", "TOPK_LABELS", "TOPK_SCORES"])
def test_an_embedding_model_refuses_a_classifiers_output_by_name(name):
    with pytest.raises(RequestError, match=f"unknown output '{name}'; this model has EMBEDDINGS"):
        kserve_http.parse_infer_request(_request([{"name": name}]), None, 8, protocol.served_outputs(True))
    with pytest.raises(RequestError, match="unknown output 'EMBEDDINGS'"):
        kserve_http.parse_infer_request(_request([{"name": "EMBEDDINGS"}]), None, 8)  # a classifier's


def test_class_count_on_embeddings_is_the_largest_values_as_triton_answers():
    req = kserve_http.parse_infer_request(
        _request([{"name": "EMBEDDINGS", "parameters": {"classification": 2}}]), None, 8, ("EMBEDDINGS",)
    )
    arrays = protocol.output_arrays(VECTORS, [], 5, req.classification, embedding=True)
    assert arrays["EMBEDDINGS"][1].tolist() == [[b"3.000000:2", b"0.500000:0"], [b"7.500000:3", b"2.000000:0"]]


def test_metadata_and_config_list_the_one_output_with_its_width():
    meta = protocol.model_metadata("m", 64, 5, "ray_serve", embedding=True)
    assert meta["inputs"] == [{"name": "IMAGES", "datatype": "BYTES", "shape": [-1, 1]}]
    assert meta["outputs"] == [{"name": "EMBEDDINGS", "datatype": "FP32", "shape": [-1, 64]}]
    config = model_config("m", 64, 5, 16, embedding=True)
    assert [(o["name"], o["data_type"], o["dims"]) for o in config["output"]] == [("EMBEDDINGS", "TYPE_FP32", [64])]


def test_a_classifiers_metadata_and_config_are_unchanged():
    meta = protocol.model_metadata("m", 10, 5, "ray_serve")
    assert meta["outputs"] == [
        {"name": "LOGITS", "datatype": "FP32", "shape": [-1, 10]},
        {"name": "TOPK_LABELS", "datatype": "BYTES", "shape": [-1, 5]},
        {"name": "TOPK_SCORES", "datatype": "FP32", "shape": [-1, 5]},
    ]
    config = model_config("m", 3, 5, 16)
    assert [(o["name"], o["data_type"], o["dims"], o["label_filename"]) for o in config["output"]] == [
        ("LOGITS", "TYPE_FP32", [3], ""),
        ("TOPK_LABELS", "TYPE_STRING", [3], ""),
        ("TOPK_SCORES", "TYPE_FP32", [3], ""),
    ]


def test_a_sigmoid_classifiers_top_k_scores_are_its_sigmoids_in_every_answer():
    """SigLIP's zero-shot classes (output.scores sigmoid): TOPK_SCORES are each class's sigmoid, best first (not a
    softmax), in the v2 answer as in predict; softmax stays the default."""
    logits = np.array([[3.0, -1.0, 2.0], [-4.0, -5.0, -6.0]], dtype=np.float32)
    labels, scores = protocol.top_k_arrays(logits, ["a", "b", "c"], 2, "sigmoid")
    assert labels.tolist() == [[b"a", b"c"], [b"a", b"b"]]
    np.testing.assert_allclose(scores, 1 / (1 + np.exp(-np.array([[3.0, 2.0], [-4.0, -5.0]]))), rtol=1e-6)
    _, softmaxed = protocol.top_k_arrays(logits, ["a", "b", "c"], 2)
    assert abs(float(softmaxed[1].sum()) - float(scores[1].sum())) > 0.5
    tensors = protocol.output_arrays(logits, ["a", "b", "c"], 2, {}, scores="sigmoid")
    np.testing.assert_array_equal(tensors["TOPK_SCORES"][1], scores)
    np.testing.assert_array_equal(tensors["LOGITS"][1], logits)
