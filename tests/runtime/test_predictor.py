"""Predictor: backend auto-selection, predictions, threads, batch prediction over paths."""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from helpers.tiny_export import LABELS  # tests/: on sys.path beside conftest.py

from vitdeploy.base.errors import ArtifactError, BackendError, ConfigError, InputError
from vitdeploy.runtime.postprocess import softmax, top_k
from vitdeploy.runtime.predictor import Prediction, Predictor


@pytest.fixture(scope="module")
def tiny_dir(tiny_artifacts) -> Path:
    return tiny_artifacts(seed=1)


@pytest.fixture(scope="module")
def ort_predictor(tiny_dir):
    with Predictor.from_artifacts(tiny_dir, backend="ort") as p:
        yield p


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    """Six distinct RGB images (two in a sub-folder), one corrupt .jpg and a text file."""
    from PIL import Image

    root = tmp_path_factory.mktemp("images")
    (root / "sub").mkdir()
    rng = np.random.default_rng(0)
    for i in range(6):
        pixels = rng.integers(0, 256, size=(40 + 4 * i, 36, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / ("sub" if i >= 4 else ".") / f"img{i}.png")
    (root / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 this is not a jpeg")
    (root / "notes.txt").write_text("not an image")
    return root


def batch(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 3, 32, 32)).astype(np.float32)


# ----------------------------------------------------------------------------- postprocess


def test_softmax_is_stable_and_top_k_is_ordered():
    probs = softmax(np.array([[1000.0, 1000.0, -1000.0], [1.0, 2.0, 3.0]], dtype=np.float32))
    assert np.isfinite(probs).all()
    np.testing.assert_allclose(probs.sum(axis=1), 1.0)
    np.testing.assert_allclose(probs[0], [0.5, 0.5, 0.0])
    assert top_k(probs[1], 2) == [(2, pytest.approx(probs[1, 2])), (1, pytest.approx(probs[1, 1]))]
    assert [i for i, _ in top_k(np.array([0.2, 0.4, 0.4]), 5)] == [1, 2, 0]  # ties: lower index first, k clamped
    with pytest.raises(InputError):
        top_k(probs[1], 0)


# ----------------------------------------------------------------------------- backend selection


def test_auto_on_a_cpu_machine_picks_a_cpu_backend_and_explains(tiny_dir, tmp_path, monkeypatch):
    """Which CPU backend is this machine's speed (tests/runtime/test_auto_choice.py, with made-up timings)."""
    from vitdeploy.runtime.auto_choice import cpu_candidates
    from vitdeploy.runtime.backends.ort import available_providers

    if "CUDAExecutionProvider" in available_providers():
        pytest.skip("onnxruntime has CUDA here: auto would pick ort-fp16")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    export = shutil.copytree(tiny_dir, tmp_path / "export")  # auto keeps its measurement beside the export
    with Predictor.from_artifacts(export) as p:
        assert p.backend_name in cpu_candidates()
        assert p.why.startswith("auto: trt unavailable (")
        assert "ort-fp16 needs CUDA" in p.why
        assert f"; chose {p.backend_name}, " in p.why


def test_auto_falls_back_to_torch_without_onnx(tiny_dir, tmp_path):
    shutil.copytree(tiny_dir, tmp_path / "t")
    manifest = json.loads((tmp_path / "t" / "manifest.json").read_text())
    for role in ("onnx", "onnx-fp16"):
        del manifest["artifacts"][role]
    (tmp_path / "t" / "manifest.json").write_text(json.dumps(manifest))
    with Predictor.from_artifacts(tmp_path / "t") as p:
        assert p.backend_name == "torch"
        assert "ort unavailable (manifest has no 'onnx' artifact)" in p.why


def test_auto_never_skips_a_tampered_file(tiny_dir, tmp_path):
    shutil.copytree(tiny_dir, tmp_path / "t")
    data = bytearray((tmp_path / "t" / "model.onnx").read_bytes())
    data[-20] ^= 0xFF
    (tmp_path / "t" / "model.onnx").write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="tampered or corrupt"):
        Predictor.from_artifacts(tmp_path / "t")


def test_explicit_backend_and_unknown_name(tiny_dir):
    with Predictor.from_artifacts(tiny_dir, backend="torch") as p:
        assert (p.backend_name, p.why) == ("torch", "requested torch")
    with pytest.raises(ConfigError, match="torch, ort, ort-fp16, ort-int8, trt"):
        Predictor.from_artifacts(tiny_dir, backend="onnx")


# ----------------------------------------------------------------------------- predictions


def test_predict_logits_checks_shape_and_dtype(ort_predictor):
    with pytest.raises(InputError, match=r"expects shape \(N, 3, 32, 32\).*got \(1, 3, 64, 64\)"):
        ort_predictor.predict_logits(np.zeros((1, 3, 64, 64), np.float32))
    with pytest.raises(InputError, match="float32, got uint8"):
        ort_predictor.predict_logits(np.zeros((1, 3, 32, 32), np.uint8))


def test_predict_on_a_preprocessed_batch_matches_logits(ort_predictor):
    x = batch(5)
    logits = ort_predictor.predict_logits(x)
    preds = ort_predictor.predict(x, top_k=3)
    assert len(preds) == 5 and all(isinstance(p, Prediction) for p in preds)
    probs = softmax(logits)
    for row, pred in zip(probs, preds):
        best = int(np.argmax(row))
        assert (pred.index, pred.label) == (best, LABELS[best])
        assert pred.score == pytest.approx(row[best])
        assert [t[1] for t in pred.top_k] == list(np.argsort(-row)[:3])
        assert [t[0] for t in pred.top_k] == [LABELS[i] for i in np.argsort(-row)[:3]]
    assert len({p.index for p in preds}) > 1  # different inputs, different answers: the test can fail
    d = preds[0].to_dict()
    assert set(d) == {"label", "index", "score", "top_k"}
    assert d["top_k"][0] == {"label": d["label"], "index": d["index"], "score": d["score"]}
    json.dumps(d)  # plain JSON types


def test_predict_images_single_and_list(ort_predictor, images):
    paths = sorted(images.glob("img*.png"))
    many = ort_predictor.predict(paths, top_k=2)
    one = ort_predictor.predict(paths[1])
    assert len(many) == len(paths) and len(one) == 1
    assert one[0].index == many[1].index and one[0].score == pytest.approx(many[1].score, abs=1e-6)
    assert ort_predictor.predict([]) == []


def test_ort_and_torch_predictors_agree_on_images(tiny_dir, ort_predictor, images):
    paths = sorted(images.glob("img*.png"))
    with Predictor.from_artifacts(tiny_dir, backend="torch") as torch_predictor:
        x = ort_predictor.preprocess(paths)
        assert np.abs(ort_predictor.predict_logits(x) - torch_predictor.predict_logits(x)).max() <= 1e-4
        assert [p.index for p in ort_predictor.predict(paths)] == [p.index for p in torch_predictor.predict(paths)]


@pytest.mark.parametrize("backend", ["ort", "torch"])
def test_threads_give_the_same_results_as_serial(tiny_dir, backend):
    inputs = [batch(1 + i % 3, seed=i) for i in range(16)]
    with Predictor.from_artifacts(tiny_dir, backend=backend) as p:
        serial = [p.predict_logits(x) for x in inputs]
        with ThreadPoolExecutor(max_workers=4) as pool:
            for _ in range(2):
                threaded = list(pool.map(p.predict_logits, inputs))
                for a, b in zip(serial, threaded):
                    np.testing.assert_array_equal(a, b)


def test_closed_predictor_refuses(tiny_dir):
    p = Predictor.from_artifacts(tiny_dir, backend="ort")
    p.close()
    with pytest.raises(BackendError, match="closed"):
        p.predict_logits(batch(1))


def test_preprocess_disagreeing_with_io_shape_is_an_artifact_error(tiny_dir, images):
    """The manifest's preprocess section (64 px) and io shape (32 px) disagree: the artifact is
    inconsistent, not the user's image."""
    from vitdeploy.runtime.artifacts import Artifacts
    from vitdeploy.runtime.preprocess import Preprocessor

    artifacts = Artifacts.open(tiny_dir)
    with Predictor.from_artifacts(artifacts, backend="ort") as p:
        p._preprocessor = Preprocessor(artifacts.preprocess.replace(height=64, width=64))
        with pytest.raises(ArtifactError) as info:
            p.predict(images / "img0.png")
    msg = str(info.value)
    assert "(1, 3, 64, 64)" in msg and "(N, 3, 32, 32)" in msg and "manifest.json" in msg
    assert not isinstance(info.value, InputError)


# ----------------------------------------------------------------------------- batch prediction


def test_predict_paths_keeps_going_past_a_bad_image(ort_predictor, images):
    from vitdeploy.runtime.batch_predict import predict_paths

    progress = []
    rows = list(
        predict_paths(
            ort_predictor, [images], batch_size=4, top_k=2, progress=lambda done, total: progress.append((done, total))
        )
    )
    by_name = {Path(r["path"]).name: r for r in rows}
    assert set(by_name) == {"img0.png", "img1.png", "img2.png", "img3.png", "img4.png", "img5.png", "broken.jpg"}
    assert "error" in by_name["broken.jpg"] and "label" not in by_name["broken.jpg"]
    singles = {p.name: ort_predictor.predict(p, top_k=2)[0] for p in images.rglob("img*.png")}
    for name, pred in singles.items():
        row = by_name[name]
        assert set(row) == {"path", "label", "index", "score", "top_k"}
        assert (row["label"], row["index"]) == (pred.label, pred.index)
        assert row["score"] == pytest.approx(pred.score, abs=1e-6)
        assert [t["index"] for t in row["top_k"]] == [t[1] for t in pred.top_k]
    assert progress[-1] == (7, 7)
    assert [d for d, _ in progress] == sorted(d for d, _ in progress)
    json.dumps(rows)


def test_predict_paths_on_a_missing_path_reports_it(ort_predictor, tmp_path):
    from vitdeploy.runtime.batch_predict import predict_paths

    (rec,) = predict_paths(ort_predictor, [tmp_path / "nope.png"])  # a record, never an exception
    assert rec == {"path": str(tmp_path / "nope.png"), "error": f"{tmp_path / 'nope.png'}: no such file or directory"}
