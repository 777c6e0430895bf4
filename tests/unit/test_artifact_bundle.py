"""Export folders that travel to other nodes: packed, unpacked once per node, verified there."""

from __future__ import annotations

import pytest

from vitdeploy.base.errors import ArtifactIntegrityError
from vitdeploy.runtime.artifact_bundle import fetch_uri, materialize, pack
from vitdeploy.runtime.backends import artifact_roles
from vitdeploy.runtime.predictor import Predictor


def test_a_bundle_unpacks_once_per_node_and_predicts_as_the_original(tiny_artifacts, tmp_path):
    src = tiny_artifacts()
    bundle = pack(src, artifact_roles("ort"))
    first = materialize(bundle, tmp_path / "cache")
    again = materialize(bundle, tmp_path / "cache")
    assert first.directory == again.directory and first.roles == ["onnx"]
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [bundle.key]  # no staging folder left behind
    x = __import__("numpy").random.default_rng(0).standard_normal((2, *first.input_shape)).astype("float32")
    with Predictor.from_artifacts(src, "ort") as ref, Predictor.from_artifacts(first, "auto") as moved:
        assert moved.backend_name == "ort"
        assert (moved.predict_logits(x) == ref.predict_logits(x)).all()


def test_a_tampered_cached_file_is_refused_on_open(tiny_artifacts, tmp_path):
    bundle = pack(tiny_artifacts(), artifact_roles("ort"))
    opened = materialize(bundle, tmp_path)
    onnx = opened.directory / opened.entry("onnx")["path"]
    data = bytearray(onnx.read_bytes())
    data[-1] ^= 1
    onnx.write_bytes(bytes(data))
    with pytest.raises(ArtifactIntegrityError, match="sha256"):
        materialize(bundle, tmp_path)


def test_fetch_from_a_file_uri_caches_by_manifest(tiny_artifacts, tmp_path):
    src = tiny_artifacts()
    opened = fetch_uri(src.resolve().as_uri(), ["onnx"], tmp_path)
    assert opened.roles == ["onnx"] and opened.directory.parent == tmp_path
    assert fetch_uri(src.resolve().as_uri(), ["onnx"], tmp_path).directory == opened.directory
