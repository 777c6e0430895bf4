"""`vitdeploy validate`'s report logic: synthetic logits, label sources, thresholds, exit codes.

The end-to-end cases run on the tiny export of test_backends.py (a 32px, 2-block ViT), never on
the demo model, so they stay fast.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from helpers.tiny_export import LABELS  # tests/: on sys.path beside conftest.py

from vitdeploy.base.errors import ConfigError, InputError, MissingDependencyError, ValidationError
from vitdeploy.base.vocab import BACKENDS
from vitdeploy.evaluate.dataset import label_indices, load_validation_set, read_labels_csv
from vitdeploy.evaluate.drift import run_drift
from vitdeploy.evaluate.drift_judge import accuracy, judge_backend
from vitdeploy.evaluate.drift_report import DriftReport
from vitdeploy.evaluate.drift_table import format_drift_table
from vitdeploy.evaluate.specs import backend_specs, parse_backend_names

FP32 = {
    "max_abs_diff": 1e-3,
    "mean_abs_diff": 1e-4,
    "min_cosine": 0.99999,
    "min_top1_agreement": 1.0,
    "min_top5_overlap": 1.0,
}
CLASSES = ["cat", "dog", "eel", "fox", "gnu", "hen"]


@pytest.fixture(scope="module")
def tiny_dir(tiny_artifacts) -> Path:
    return tiny_artifacts(seed=3)


@pytest.fixture(scope="module")
def image_tree(tmp_path_factory) -> Path:
    """Eight PNGs in sub-folders named after the tiny model's classes, plus one corrupt file."""
    from PIL import Image

    root = tmp_path_factory.mktemp("drift_images")
    rng = np.random.default_rng(7)
    for i in range(8):
        folder = root / LABELS[i % 3]
        folder.mkdir(exist_ok=True)
        Image.fromarray(rng.integers(0, 256, size=(36, 40, 3), dtype=np.uint8)).save(folder / f"im{i}.png")
    (root / LABELS[0] / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    return root


def synthetic(n: int = 6, seed: int = 0) -> np.ndarray:
    """Logits with a clear winner per row (margin >= 2) so tiny noise never flips a row."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(0.0, 0.3, size=(n, len(CLASSES)))
    logits[np.arange(n), np.arange(n) % len(CLASSES)] += 3.0
    return logits.astype(np.float32)


# ----------------------------------------------------------------------------- report on synthetic logits


def test_a_flipped_image_is_listed_by_path_and_fails_top1_agreement():
    ref = synthetic()
    cand = ref + np.float32(1e-6)
    cand[2, 2], cand[2, 4] = ref[2, 4], ref[2, 2] + 0.5  # image 2: "eel" -> "gnu"
    names = [f"/data/img{i}.png" for i in range(6)]
    row = judge_backend("ort", cand, ref, FP32, names=names, true_index=[0, 1, 2, 3, 4, 5], classes=CLASSES)
    assert row.status == "failed"
    (flip,) = row.flipped
    assert {k: flip[k] for k in ("path", "reference", "candidate", "label")} == {
        "path": "/data/img2.png",
        "reference": "eel",
        "candidate": "gnu",
        "label": "eel",
    }
    # both top-3s, best first, with softmax probabilities (what the report shows beside the thumbnail)
    assert [c for c, _ in flip["reference_top3"]][0] == "eel" and [c for c, _ in flip["candidate_top3"]][0] == "gnu"
    assert all(
        p1 >= p2 for top in (flip["reference_top3"], flip["candidate_top3"]) for (_, p1), (_, p2) in zip(top, top[1:])
    )
    assert len(row.per_image["max_abs_diff"]) == len(row.per_image["cosine"]) == 6
    assert any(f.startswith("top1_agreement: expected >= 1") for f in row.failures)
    assert row.metrics["top1_agreement"] == pytest.approx(5 / 6)
    assert row.accuracy == pytest.approx(5 / 6)


def test_identical_logits_pass_and_each_threshold_is_judged():
    ref = synthetic()
    ok = judge_backend("ort", ref.copy(), ref, FP32, names=["a"] * 6, true_index=[None] * 6, classes=CLASSES)
    assert ok.status == "passed" and ok.failures == [] and ok.flipped == [] and ok.accuracy is None
    noisy = ref * np.float32(1.01)  # same direction and ranking, larger diff: only the diff thresholds fail
    row = judge_backend("ort", noisy, ref, FP32, names=["a"] * 6, true_index=[None] * 6, classes=CLASSES)
    failed = {f.split(":")[0] for f in row.failures}
    assert failed == {"max_abs_diff", "mean_abs_diff"}
    assert row.thresholds == FP32
    loose = dict(FP32, max_abs_diff=0.05, mean_abs_diff=0.05)
    assert (
        judge_backend("ort", noisy, ref, loose, names=["a"] * 6, true_index=[None] * 6, classes=CLASSES).status
        == "passed"
    )


def test_accuracy_counts_only_labelled_rows():
    logits = synthetic(4)  # predicts classes 0, 1, 2, 3
    assert accuracy(logits, [0, 1, 5, None]) == pytest.approx(2 / 3)
    assert accuracy(logits, [None] * 4) is None


def test_labels_match_class_names_or_indices():
    idx, unknown = label_indices(["dog", "3", None, "zebra"], CLASSES)
    assert idx == [1, 3, None, None]
    assert unknown == ["zebra"]


# ----------------------------------------------------------------------------- labels


def test_labels_from_csv_relative_to_the_csv_or_the_images_folder(tmp_path, image_tree):
    rel_to_images = tmp_path / "a.csv"
    rel_to_images.write_text("path,label\napple/im0.png,apple\nbanana/im1.png,banana\n")
    vset = load_validation_set(image_tree, rel_to_images)
    by_name = {p.name: lab for p, lab in zip(vset.paths, vset.labels)}
    assert by_name["im0.png"] == "apple" and by_name["im1.png"] == "banana"
    assert by_name["im3.png"] is None  # not in the CSV: unlabelled, still validated
    assert vset.label_source == f"csv:{rel_to_images}"

    rel_to_csv = image_tree / "labels-here.csv"  # paths relative to the CSV's own folder, no header
    rel_to_csv.write_text("cherry/im2.png,cherry\n")
    try:
        vset = load_validation_set(image_tree, rel_to_csv)
        assert {p.name: lab for p, lab in zip(vset.paths, vset.labels)}["im2.png"] == "cherry"
    finally:
        rel_to_csv.unlink()


def test_labels_from_sub_folder_names(image_tree):
    vset = load_validation_set(image_tree)
    assert vset.label_source == "sub-folders"
    assert {p.name: lab for p, lab in zip(vset.paths, vset.labels)}["im4.png"] == LABELS[4 % 3]
    assert vset.labelled == len(vset.paths)


def test_a_missing_labels_file_is_a_clear_input_error(tmp_path, image_tree):
    missing = tmp_path / "nope.csv"
    with pytest.raises(InputError, match=r"labels file .*nope\.csv not found.*path,label"):
        load_validation_set(image_tree, missing)


def test_a_malformed_labels_csv_names_the_line(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("path,label\na.png,cat\nb.png\n")
    with pytest.raises(InputError, match="line 3"):
        read_labels_csv(bad)


def test_unknown_backend_names_are_a_config_error():
    assert parse_backend_names("ort, trt") == ("ort", "trt")
    assert parse_backend_names(None) is None and parse_backend_names("all") is None
    with pytest.raises(ConfigError, match="'tensorflow'.*torch, ort, ort-fp16, ort-int8, torch-fp16, trt"):
        parse_backend_names("ort,tensorflow")


def test_threshold_sets_per_backend():
    specs = {s.name: s for s in backend_specs()}
    assert specs["torch"].is_reference
    assert {n: s.precision for n, s in specs.items()} == {
        "torch": "fp32",
        "ort": "fp32",
        "ort-fp16": "fp16",
        "ort-int8": "int8",
        "torch-fp16": "fp16",
        "trt": "fp16",
        "trt-int8": "int8",
        "openvino": "fp32",
        "openvino-int8": "int8",
        "openvino-bf16": "bf16",
    }
    assert specs["torch-fp16"].options.device == "cuda" and specs["torch-fp16"].options.precision == "fp16"
    assert (
        specs["trt-int8"].options.device == "cuda" and specs["trt-int8"].uses_cuda and not specs["ort-int8"].uses_cuda
    )
    from vitdeploy.runtime.backends import BackendOptions

    on_gpu = {s.name: s for s in backend_specs(None, BackendOptions(device="cuda:1"))}
    assert not on_gpu["torch"].is_reference and on_gpu["torch"].precision == "fp32"  # judged by the fp32 set
    assert on_gpu["torch-fp16"].options.device == "cuda:1"


# ----------------------------------------------------------------------------- a real run


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def test_run_drift_reports_every_backend_and_writes_the_report(tiny_dir, image_tree):
    report = run_drift(tiny_dir, images=image_tree)
    rows = {b.name: b for b in report.backends}
    assert list(rows) == [kind.name for kind in BACKENDS]  # every backend, in the vocabulary's order
    assert rows["torch"].status == "reference"
    assert rows["ort"].status == "passed", rows["ort"].failures
    assert rows["ort"].metrics["max_abs_diff"] < 1e-3 and rows["ort"].threshold_set == "fp32"
    assert rows["ort-fp16"].threshold_set == "fp16"
    if not _cuda():
        assert rows["torch-fp16"].status == "unavailable" and "CUDA" in rows["torch-fp16"].reason
    assert rows["trt"].status == "unavailable" and rows["trt"].reason  # the tiny export has no engine
    assert rows["ort-int8"].status == "unavailable" and "onnx-int8" in rows["ort-int8"].reason  # nor an INT8 graph
    # the corrupt image is listed, the eight good ones were evaluated, labels from sub-folders
    assert report.images["evaluated"] == 8 and report.images["labelled"] == 8
    assert [Path(u["path"]).name for u in report.images["unreadable"]] == ["broken.png"]
    assert rows["ort"].accuracy == report.reference["accuracy"]  # same top-1 on every image
    saved = json.loads((tiny_dir / "drift-report.json").read_text())
    assert saved["format"] == "vitdeploy-drift-report" and saved["passed"] is True
    assert [b["name"] for b in saved["backends"]] == list(rows)
    assert saved["backends"][5]["status"] == "unavailable" and saved["backends"][5]["reason"] == rows["trt"].reason
    table = "\n".join(format_drift_table(report))
    assert "trt" in table and rows["trt"].reason in table and "broken.png" in table


def _write_config(path: Path, **fp32: float) -> Path:
    limits = dict(FP32, **fp32)
    body = "validation:\n  fp32:\n" + "".join(f"    {k}: {v}\n" for k, v in limits.items())
    path.write_text(body)
    return path


def test_cli_exits_3_when_a_threshold_is_0(tiny_dir, image_tree, tmp_path):
    from vitdeploy.cli import main

    cfg = _write_config(tmp_path / "strict.yaml", max_abs_diff=0, mean_abs_diff=0)
    result = CliRunner().invoke(
        main, ["validate", "-a", str(tiny_dir), "--images", str(image_tree), "-b", "ort", "-c", str(cfg)]
    )
    assert result.exit_code == 3, result.output
    assert "FAIL" in result.output and "max_abs_diff: expected <= 0" in result.output
    saved = json.loads((tiny_dir / "drift-report.json").read_text())  # written before exiting
    assert saved["passed"] is False and saved["backends"][0]["status"] == "failed"
    assert saved["thresholds"]["fp32"]["max_abs_diff"] == 0


def test_cli_passes_and_prints_json(tiny_dir, image_tree):
    from vitdeploy.cli import main

    result = CliRunner().invoke(
        main, ["validate", "-a", str(tiny_dir), "--images", str(image_tree), "-b", "ort", "--json"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["passed"] is True and [b["name"] for b in data["backends"]] == ["ort"]


def test_a_requested_backend_that_cannot_run_is_listed_and_exits_4(tiny_dir, image_tree):
    report = run_drift(tiny_dir, images=image_tree, backends="trt", write_report=False)
    (row,) = report.backends
    assert row.status == "unavailable" and row.reason
    assert report.passed  # nothing drifted ...
    with pytest.raises(MissingDependencyError, match="trt"):  # ... but what was asked for did not run
        report.raise_for_failures()


def test_a_failed_report_raises_validation_error():
    from vitdeploy.evaluate.drift_report import BackendDrift

    report = DriftReport(
        artifacts="x",
        model="m",
        images={},
        reference={},
        thresholds={},
        backends=[BackendDrift("ort", "failed", failures=["cosine: expected >= 1, got 0.9"])],
    )
    with pytest.raises(ValidationError, match="ort: cosine"):
        report.raise_for_failures()


def test_nan_logits_fail_every_image_and_the_report_stays_strict_json():
    ref = synthetic()
    cand = ref.copy()
    cand[1, :] = np.nan  # e.g. an FP16 overflow
    row = judge_backend(
        "ort-fp16",
        cand,
        ref,
        FP32,
        names=[f"i{i}" for i in range(6)],
        true_index=[None] * 6,
        classes=CLASSES,
        precision="fp16",
    )
    assert row.status == "failed" and row.metrics["max_abs_diff"] == float("inf")
    report = DriftReport(artifacts="x", model="m", images={}, reference={}, thresholds={}, backends=[row])
    text = json.dumps(report.to_dict(), allow_nan=False)  # no bare NaN / Infinity tokens
    assert json.loads(text)["backends"][0]["metrics"]["max_abs_diff"] == "inf"
