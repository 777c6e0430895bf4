"""The wire protocol shared by `vitdeploy serve` and the Triton repository (no server needed)."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

from vitdeploy.base import errors as E
from vitdeploy.runtime.artifacts import Artifacts
from vitdeploy.runtime.predictor import Predictor
from vitdeploy.serve import protocol as P
from vitdeploy.serve.http_errors import error_body, status_of


def _png(size=(40, 30), colour=(200, 30, 10)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, format="PNG")
    return buf.getvalue()


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("vit-demo-digits", "vit-demo-digits"),
        ("my model.v2", "my_model_v2"),
        ("ViT/S 16 (in1k)", "ViT_S_16_in1k"),
        ("", "model"),
        ("...", "model"),
    ],
)
def test_model_name_keeps_only_the_wire_safe_characters(raw, expected):
    assert P.model_name(raw) == expected


@pytest.mark.integration  # the demo export
def test_bad_images_are_classified_and_the_good_ones_match_the_predictor(demo_artifacts):
    with Predictor.from_artifacts(Artifacts.open(demo_artifacts), backend="ort", max_pixels=10_000) as pred:
        good = _png()
        png = _png((64, 64))
        bomb = _png((200, 100))  # 20,000 pixels > max_pixels: refused from its header
        blobs = [good, b"", b"hello, this is text", png[: len(png) // 2], bomb, png]
        batch, ok, errors = P.preprocess_images(blobs, pred.preprocessor)
        assert ok == [0, 5]
        assert {i: e.kind for i, e in errors.items()} == {1: "empty", 2: "not_image", 3: "corrupt", 4: "too_large"}
        assert all(status_of(e) == 400 and str(e).startswith(f"IMAGES[{i}]: ") for i, e in errors.items())
        np.testing.assert_array_equal(batch, pred.preprocess([good, png]))
        labels, scores = P.top_k_arrays(pred.predict_logits(batch), pred.labels, 3)
        expected = pred.predict([good, png], top_k=3)
        assert [[b.decode() for b in row] for row in labels] == [[t[0] for t in p.top_k] for p in expected]
        np.testing.assert_allclose(scores, [[t[2] for t in p.top_k] for p in expected], rtol=1e-6)


def test_images_from_tensor_accepts_n_and_n_by_1():
    assert P.images_from_tensor(np.array([b"a", b"b"], dtype=object)) == [b"a", b"b"]
    assert P.images_from_tensor(np.array([[b"a"], [b"b"]], dtype=object)) == [b"a", b"b"]
    with pytest.raises(P.RequestError, match=r"\[N\] or \[N, 1\]"):
        P.images_from_tensor(np.array([[b"a", b"b"]], dtype=object))


def test_metadata_describes_the_contract():
    meta = P.model_metadata("demo", num_classes=3, k=5)
    assert meta["inputs"] == [{"name": "IMAGES", "datatype": "BYTES", "shape": [-1, 1]}]
    assert [o["shape"] for o in meta["outputs"]] == [[-1, 3], [-1, 3], [-1, 3]]
    assert "parameters" not in meta and P.served_export(meta) == {}  # a server that states no export
    export = P.export_parameters("0f" * 32, "ort")
    meta = P.model_metadata("demo", num_classes=3, k=5, parameters=export)
    assert meta["parameters"] == {"vitdeploy_export_sha256": "0f" * 32, "vitdeploy_backend": "ort"}
    assert P.served_export(meta) == export
    assert P.served_export({"parameters": {"vitdeploy_backend": {"string_value": ""}, "other": "x"}}) == {}


def test_vitdeploy_imports_without_ray():
    import subprocess
    import sys

    code = (
        "import sys; import vitdeploy.cli, vitdeploy.serve.protocol, vitdeploy.serve.runner; "
        "print(sorted(m for m in ('ray', 'fastapi', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "error, status",
    [
        (E.NotAnImageError, 400),
        (E.ImageTooLargeError, 400),
        (E.EmptyRequestError, 400),
        (E.NotFoundError, 404),
        (E.MethodNotAllowedError, 405),
        (E.RequestTimeoutError, 408),
        (E.BodyTooLargeError, 413),
        (E.TooManyImagesError, 413),
        (E.UnsupportedMediaError, 415),
        (E.UnavailableError, 503),
        (E.BackendError, 500),
        (RuntimeError, 500),
    ],
)
def test_the_status_comes_from_the_error_type_whatever_the_message_says(error, status):
    # the wording is irrelevant: a message mentioning another fault does not change the status
    assert status_of(error("decompression-bomb? not a recognised image, empty file, too many")) == status


def test_every_error_body_is_one_json_line_and_hides_internal_errors():
    assert json.loads(error_body(E.BodyTooLargeError("too big\nsecond line"))) == {"error": "too big"}
    hidden = json.loads(error_body(RuntimeError("/srv/secret/path failed")))["error"]
    assert "secret" not in hidden and "internal server error" in hidden
