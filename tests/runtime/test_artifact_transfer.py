"""Export folders that travel to other nodes: packed, unpacked once per node, verified there."""

from __future__ import annotations

import pytest

from vitdeploy.base.errors import ArtifactIntegrityError
from vitdeploy.runtime.artifact_transfer import fetch_uri, materialize, open_in_place, pack
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
    with Predictor.from_artifacts(src, "ort") as ref, Predictor.from_artifacts(first, "ort") as moved:
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


def test_a_folder_opened_in_place_is_the_one_the_driver_read_and_is_verified_again(tiny_artifacts, tmp_path):
    """A worker on the driver's machine opens the folder where it lies (no copy): only the roles it was given,
    each file's sha256 checked again, and refused when the manifest or a file changed since the driver read it."""
    import hashlib
    import shutil

    from helpers.bad_input import edit_manifest

    src = tmp_path / "export"
    shutil.copytree(tiny_artifacts(), src)
    digest = hashlib.sha256((src / "manifest.json").read_bytes()).hexdigest()
    opened = open_in_place(src, digest, ["onnx"])
    assert opened.directory == src and opened.roles == ["onnx"]
    onnx = src / opened.entry("onnx")["path"]
    data = bytearray(onnx.read_bytes())
    data[-1] ^= 1
    onnx.write_bytes(bytes(data))
    with pytest.raises(ArtifactIntegrityError, match="sha256"):
        open_in_place(src, digest, ["onnx"])
    edit_manifest(src, lambda m: m.__setitem__("name", "another"))
    with pytest.raises(ArtifactIntegrityError, match="changed while the job ran"):
        open_in_place(src, digest, ["onnx"])


def test_fetch_from_a_file_uri_caches_by_manifest(tiny_artifacts, tmp_path):
    src = tiny_artifacts()
    opened = fetch_uri(src.resolve().as_uri(), ["onnx"], tmp_path)
    assert opened.roles == ["onnx"] and opened.directory.parent == tmp_path
    assert fetch_uri(src.resolve().as_uri(), ["onnx"], tmp_path).directory == opened.directory


@pytest.fixture(scope="module")
def tiny_with_ort_graph(tiny_artifacts, tmp_path_factory):
    """The tiny export plus model.ort.onnx (role onnx-ort), the fused graph "ort" runs when listed."""
    import shutil

    from helpers.bad_input import edit_manifest
    from helpers.tiny_export import TINY, file_entry

    from vitdeploy.export.optimize import optimize_for_ort

    d = tmp_path_factory.mktemp("tiny_ort") / "export"
    shutil.copytree(tiny_artifacts(), d)
    optimize_for_ort(d / "model.onnx", d / "model.ort.onnx", num_heads=TINY["heads"], hidden_size=TINY["width"])
    edit_manifest(d, lambda m: m["artifacts"].__setitem__("onnx-ort", file_entry(d, "model.ort.onnx")))
    return d


def test_shipped_roles_add_the_optional_roles_a_backend_reads_when_listed(tiny_artifacts, tiny_with_ort_graph):
    from vitdeploy.runtime.artifacts import Artifacts
    from vitdeploy.runtime.backends import shipped_roles

    assert shipped_roles("ort", Artifacts.open(tiny_with_ort_graph)) == ("onnx", "onnx-ort")
    assert shipped_roles("ort", Artifacts.open(tiny_artifacts())) == ("onnx",)
    assert shipped_roles("torch", Artifacts.open(tiny_artifacts())) == artifact_roles("torch")
    assert shipped_roles("auto", Artifacts.open(tiny_artifacts())) is None  # every listed role travels


def test_a_bundle_packed_for_ort_runs_the_fused_graph_and_answers_as_the_original(tiny_with_ort_graph, tmp_path):
    from vitdeploy.runtime.artifacts import Artifacts
    from vitdeploy.runtime.backends import shipped_roles

    src = Artifacts.open(tiny_with_ort_graph)
    moved = materialize(pack(src, shipped_roles("ort", src)), tmp_path)
    assert sorted(moved.roles) == ["onnx", "onnx-ort"]
    x = __import__("numpy").random.default_rng(1).standard_normal((3, *src.input_shape)).astype("float32")
    with Predictor.from_artifacts(tiny_with_ort_graph, "ort") as ref, Predictor.from_artifacts(moved, "ort") as there:
        assert there.backend.onnx_path.name == ref.backend.onnx_path.name == "model.ort.onnx"  # the same graph runs
        assert (there.predict_logits(x) == ref.predict_logits(x)).all()
    # packed with the required roles alone, the copy falls back to model.onnx: what the fix prevents
    plain = materialize(pack(src, artifact_roles("ort")), tmp_path)
    with Predictor.from_artifacts(plain, "ort") as there:
        assert there.backend.onnx_path.name == "model.onnx"
