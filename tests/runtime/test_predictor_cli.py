"""`vitdeploy predict` on the demo export: correct labels through every CPU backend, the output
formats, and bad input that never stops the rest."""

from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from vitdeploy.base.vocab import BACKEND_KINDS, RUNTIME_BACKENDS
from vitdeploy.cli import main
from vitdeploy.demo import DEMO_DIR as DEMO_MODEL_DIR
from vitdeploy.demo import IMAGES_DIR as DEMO_IMAGES_DIR
from vitdeploy.demo import LABELS_CSV as DEMO_LABELS_CSV

pytestmark = pytest.mark.integration


def run(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def expected_labels() -> dict[str, str]:
    with open(DEMO_LABELS_CSV, newline="") as fh:
        return {row["path"]: row["label"] for row in csv.DictReader(fh)}


def card_accuracy() -> float:
    text = (DEMO_MODEL_DIR / "MODEL_CARD.md").read_text()
    return float(re.search(r"Shipped-images top-1 accuracy: \*\*([0-9.]+)\*\*", text).group(1))


def predict_json(artifacts: Path, *inputs: str, backend: str = "auto"):
    res = run("predict", *inputs, "-a", str(artifacts), "-b", backend, "--json", "-k", "3")
    return res, [json.loads(line) for line in res.stdout.splitlines()]


#: every backend of the vocabulary that runs on a CPU (its file is in the demo export)
CPU_BACKENDS = [name for name in RUNTIME_BACKENDS if BACKEND_KINDS[name].device != "cuda"]


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_demo_digits_are_labelled_at_least_as_well_as_the_model_card_says(demo_artifacts: Path, backend: str):
    res, records = predict_json(demo_artifacts, str(DEMO_IMAGES_DIR), backend=backend)
    assert res.exit_code == 0, res.stderr
    truth = expected_labels()
    assert len(records) == len(truth)
    correct = sum(r["label"] == truth[Path(r["path"]).name] for r in records)
    assert correct / len(truth) >= card_accuracy()
    assert f"backend: {backend}" in res.stderr


def test_ort_and_torch_agree_on_top1_for_every_image(demo_artifacts: Path):
    _, ort = predict_json(demo_artifacts, str(DEMO_IMAGES_DIR), backend="ort")
    _, torch = predict_json(demo_artifacts, str(DEMO_IMAGES_DIR), backend="torch")
    assert [(r["path"], r["index"]) for r in ort] == [(r["path"], r["index"]) for r in torch]


def test_json_lines_have_the_documented_shape(demo_artifacts: Path):
    image = sorted(DEMO_IMAGES_DIR.glob("*.png"))[0]
    _, (rec,) = predict_json(demo_artifacts, str(image))
    assert set(rec) == {"path", "label", "index", "score", "top_k"}
    assert len(rec["top_k"]) == 3 and set(rec["top_k"][0]) == {"label", "index", "score"}
    assert rec["top_k"][0]["index"] == rec["index"] and 0 < rec["score"] <= 1
    assert [t["score"] for t in rec["top_k"]] == sorted((t["score"] for t in rec["top_k"]), reverse=True)


def test_a_bad_image_is_reported_and_the_others_still_predicted(demo_artifacts: Path, tmp_path: Path):
    for src in sorted(DEMO_IMAGES_DIR.glob("*.png"))[:3]:
        shutil.copy(src, tmp_path / src.name)
    (tmp_path / "broken.jpg").write_text("this is text, not a JPEG")
    (tmp_path / "empty.png").write_bytes(b"")
    res, records = predict_json(demo_artifacts, str(tmp_path))
    assert res.exit_code == 1
    errors = {Path(r["path"]).name: r["error"] for r in records if "error" in r}
    assert set(errors) == {"broken.jpg", "empty.png"}
    assert sum("label" in r for r in records) == 3


def test_table_output_is_readable(demo_artifacts: Path):
    res = run("predict", str(sorted(DEMO_IMAGES_DIR.glob("*.jpg"))[0]), "-a", str(demo_artifacts), "-b", "ort")
    assert res.exit_code == 0
    header, row = res.stdout.splitlines()[:2]
    assert header.split()[:3] == ["path", "label", "score"] and ".jpg" in row


def test_table_keeps_long_file_names_readable(demo_artifacts: Path, tmp_path: Path):
    deep = tmp_path / "a very long directory name for photos" / "from the summer holiday 2025" / "camera roll"
    deep.mkdir(parents=True)
    src = sorted(DEMO_IMAGES_DIR.glob("*.png"))[0]
    (deep / "IMG_20250812_my_digit.png").write_bytes(src.read_bytes())
    (deep / "one.png").write_bytes(src.read_bytes())
    res = run("predict", str(tmp_path), "-a", str(demo_artifacts), "-b", "ort")
    assert res.exit_code == 0, res.stderr
    rows = res.stdout.splitlines()[1:]
    assert len(rows) == 2
    for row, name in zip(rows, ("IMG_20250812_my_digit.png", "one.png")):
        shown = row[:48].rstrip()
        assert shown.endswith("/" + name) and shown.startswith(str(tmp_path)[:8]), row  # whole name, cut in the middle


def test_missing_artifacts_directory_is_one_line_exit_2(tmp_path: Path):
    res = run("predict", str(DEMO_IMAGES_DIR), "-a", str(tmp_path / "nowhere"))
    assert res.exit_code == 2
    assert res.stderr.strip().splitlines()[-1].startswith("error:") and "vitdeploy export" in res.stderr


def test_directory_without_images_is_an_error_record_and_exit_1(demo_artifacts: Path, tmp_path: Path):
    (tmp_path / "notes.txt").write_text("no images here")
    res = run("predict", str(tmp_path), "-a", str(demo_artifacts))
    assert res.exit_code == 1 and "no images" in res.stdout.lower()


@pytest.mark.parametrize(
    "backend, file",
    [
        ("ort", "model.ort.onnx"),
        ("ort-fp16", "model.fp16.onnx"),
        ("torch", "model.safetensors"),
        ("torch", "model.json"),
    ],
)
def test_tampered_model_is_refused(demo_artifacts: Path, tmp_path: Path, backend: str, file: str):
    copy = tmp_path / "art"
    shutil.copytree(demo_artifacts, copy)
    data = bytearray((copy / file).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (copy / file).write_bytes(bytes(data))
    res = run("predict", str(DEMO_IMAGES_DIR), "-a", str(copy), "-b", backend)
    assert res.exit_code == 2 and file in res.stderr and "sha256" in res.stderr


def test_runtime_section_of_the_config_sets_predict_defaults(demo_artifacts: Path, tmp_path: Path):
    """runtime.backend / top_k / max_image_pixels apply when the command line does not say."""
    cfg = tmp_path / "p.yaml"
    cfg.write_text("runtime: {backend: torch, top_k: 2, max_image_pixels: 1000}\n")
    big = sorted(DEMO_IMAGES_DIR.glob("*.png"))[0]  # 64x64 = 4096 pixels > 1000
    res = run("predict", str(big), "-a", str(demo_artifacts), "-c", str(cfg), "--json")
    assert "backend: torch" in res.stderr
    (rec,) = [json.loads(line) for line in res.stdout.splitlines()]
    assert res.exit_code == 1 and "4096" in rec["error"]
    cfg.write_text("runtime: {backend: torch, top_k: 2}\n")
    res = run("predict", str(big), "-a", str(demo_artifacts), "-c", str(cfg), "--json")
    (rec,) = [json.loads(line) for line in res.stdout.splitlines()]
    assert res.exit_code == 0 and len(rec["top_k"]) == 2
