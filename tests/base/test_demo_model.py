"""The demo model shipped in vitdeploy/demo/ loads, is small, and reads its own held-out images."""

from __future__ import annotations

import csv
import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vitdeploy.base.preprocess_spec import PreprocessSpec
from vitdeploy.demo import CONFIG_PATH, DEMO_DIR, IMAGES_DIR, LABELS_CSV, WEIGHTS_PATH, demo_images, render_digit
from vitdeploy.runtime.preprocess import Preprocessor

torch = pytest.importorskip("torch", reason="the demo model's torch checks need torch")

from vitdeploy.model.checkpoints import load_checkpoint  # noqa: E402 (after the torch skip)

LABELS = tuple(str(i) for i in range(10))
SPEC = PreprocessSpec(style="hf", height=32, width=32, interpolation="bilinear", mean=(0.5,) * 3, std=(0.5,) * 3)
ROOT = Path(__file__).resolve().parents[2]
NAME_RE = re.compile(r"^digit(\d)_(\d{4})\.(png|jpg)$")


@pytest.fixture(scope="module")
def loaded():
    return load_checkpoint(DEMO_DIR)


def _card_figure(label: str) -> float:
    text = (DEMO_DIR / "MODEL_CARD.md").read_text(encoding="utf-8")
    m = re.search(rf"^{re.escape(label)}: \*\*([0-9.]+)\*\*", text, re.MULTILINE)
    assert m, f"MODEL_CARD.md has no '{label}: **x**' line"
    return float(m.group(1))


def _shipped_rows() -> list[dict[str, str]]:
    with open(LABELS_CSV, newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        assert reader.fieldnames == ["path", "label"]
        return list(reader)


def test_demo_checkpoint_loads_with_its_labels_and_preprocessing(loaded):
    assert loaded.source_format == "vitdeploy"
    assert loaded.name == "vit-demo-digits"
    assert loaded.labels == LABELS
    assert loaded.preprocess == SPEC
    assert loaded.config.image_size == 32 and loaded.config.num_classes == 10
    assert CONFIG_PATH.is_file()


def test_demo_weights_are_small():
    assert 0 < WEIGHTS_PATH.stat().st_size < 5 * 1024 * 1024


def test_labels_csv_covers_every_shipped_image_and_nothing_else():
    rows = _shipped_rows()
    on_disk = {p.name for p in IMAGES_DIR.iterdir() if p.suffix.lower() in (".png", ".jpg", ".jpeg")}
    listed = [r["path"] for r in rows]
    assert len(listed) == len(set(listed)), "labels.csv lists an image twice"
    assert set(listed) == on_disk
    assert len(rows) >= 40
    for r in rows:
        m = NAME_RE.match(r["path"])
        assert m, f"unexpected image name {r['path']!r}"
        assert r["label"] == m.group(1) and r["label"] in LABELS
    counts = {label: sum(r["label"] == label for r in rows) for label in LABELS}
    assert set(counts.values()) == {4}, counts
    assert {Path(p).suffix for p in listed} == {".png", ".jpg"}, "both PNG and JPEG must be shipped"
    assert [(p.name, lab) for p, lab in demo_images()] == [(r["path"], r["label"]) for r in rows]


def test_shipped_images_are_64px_so_preprocessing_resizes():
    for path, _ in demo_images():
        with Image.open(path) as im:
            assert im.size == (64, 64), path.name
            assert im.format == ("PNG" if path.suffix == ".png" else "JPEG"), path.name


def test_shipped_images_are_held_out_digits_rendered_by_render_digit():
    pytest.importorskip("sklearn", reason="checking the split needs scikit-learn")
    script = ROOT / "scripts" / "train_demo.py"
    spec = importlib.util.spec_from_file_location("train_demo", script)
    train_demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train_demo)
    x, y, train_idx, heldout_idx = train_demo.load_split(0.2, 0)  # the card's split
    assert not set(train_idx) & set(heldout_idx)
    for path, label in demo_images():
        index = int(NAME_RE.match(path.name).group(2))
        assert index in set(heldout_idx.tolist()), f"{path.name} was in the training split"
        assert str(y[index]) == label
        if path.suffix == ".png":  # lossless: exactly the training-time rendering
            with Image.open(path) as im:
                assert np.array_equal(np.asarray(im.convert("RGB")), np.asarray(render_digit(x[index])))


def test_demo_model_reads_its_shipped_images(loaded):
    items = demo_images()
    pixels = Preprocessor(loaded.preprocess).batch([str(p) for p, _ in items])
    with torch.no_grad():
        logits = loaded.model(torch.from_numpy(pixels))
    predicted = [loaded.labels[i] for i in logits.argmax(1).tolist()]
    truth = [label for _, label in items]
    accuracy = float(np.mean([p == t for p, t in zip(predicted, truth)]))
    wrong = [(p.name, pred) for (p, t), pred in zip(items, predicted) if pred != t]
    assert accuracy >= 0.95, f"accuracy {accuracy:.3f} on shipped images; wrong: {wrong}"
    assert accuracy >= _card_figure("Shipped-images top-1 accuracy"), f"below the model card; wrong: {wrong}"


def test_model_card_states_heldout_accuracy_of_at_least_97_percent():
    assert _card_figure("Held-out top-1 accuracy") >= 0.97
