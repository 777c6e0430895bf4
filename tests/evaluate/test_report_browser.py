"""`vitdeploy report` opened in a real browser: Debian's Chromium driven by Playwright (never a browser a
tool downloads). From a file URL, with nothing else reachable: no console error, no network request at
all, every picture decoded with a size, the backends of the drift report listed, an INT8 graph's flipped
images each with its thumbnail and both top-3s, and a screenshot that is not blank.

CI installs Chromium (`.ci/run`, apt) and Playwright (the dev extra); a machine without them skips these
tests with the reason.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the dev extra)")
pytest.importorskip("matplotlib", reason="matplotlib is not installed (the report extra)")
if not CHROMIUM.exists():
    pytest.skip("no /usr/bin/chromium (apt-get install chromium; .ci/run installs it)", allow_module_level=True)

pytestmark = pytest.mark.integration

LOOSE = "{max_abs_diff: 1.0e9, mean_abs_diff: 1.0e9, min_cosine: -1, min_top1_agreement: 0, min_top5_overlap: 0}"
#: the screenshot docs/report.md shows, retaken by this test when VITDEPLOY_DOCS_SCREENSHOT=1 (never in CI: a
#: test run must not change the checkout)
DOCS_SHOT = Path(__file__).resolve().parents[2] / "docs" / "images" / "report.png"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vitdeploy.cli", *args], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def validated(demo_artifacts, tmp_path_factory) -> Path:
    """The demo export with `validate` and a short `bench` run on it: the report from all three."""
    folder = tmp_path_factory.mktemp("report") / "artifacts"
    shutil.copytree(demo_artifacts, folder)
    assert _cli("validate", "-a", str(folder)).returncode == 0
    res = _cli("bench", "-a", str(folder), "--batch-sizes", "1,4", "--iterations", "5", "--warmup", "1")
    assert res.returncode == 0, res.stderr
    res = _cli("report", "-a", str(folder))
    assert res.returncode == 0 and (folder / "report.html").is_file(), res.stdout + res.stderr
    return folder


def _near_tied_checkpoint(folder: Path) -> Path:
    """A random-weight ViT whose two first classes are near ties for every image: their head rows differ by
    a thousandth of their size and their biases put them far above the rest, so which one wins rests on
    a difference smaller than INT8's rounding of those rows (1/127 of their range): INT8 changes the
    top-1 class of about half the images, on any CPU."""
    import torch

    from vitdeploy.base.preprocess_spec import PreprocessSpec
    from vitdeploy.model import VisionTransformer, ViTConfig
    from vitdeploy.model.checkpoints import save_checkpoint

    torch.manual_seed(0)
    model = VisionTransformer(ViTConfig(image_size=32, patch_size=8, width=64, depth=2, heads=4, num_classes=7))
    with torch.no_grad():
        w = model.head.weight
        w[1] = w[0] + 1e-3 * w[0].abs().mean() * torch.randn_like(w[0])
        model.head.bias.zero_()
        model.head.bias[:2] = 10.0
    out = folder / "checkpoint"
    save_checkpoint(out, model.eval(), [f"c{i}" for i in range(7)], PreprocessSpec(height=32, width=32), "near-tied")
    return out


@pytest.fixture(scope="module")
def int8_flips(tmp_path_factory) -> Path:
    """That ViT exported with its INT8 graph forced through (no speed gate, a gate every graph passes): its
    top-1 flips under INT8 for some images, and the export writes the report itself."""
    folder = tmp_path_factory.mktemp("flips")
    checkpoint = _near_tied_checkpoint(folder)
    config = folder / "pipeline.yaml"
    config.write_text(
        f"model: {{checkpoint: {checkpoint}}}\n"
        f"validation: {{int8: {LOOSE}}}\n"
        "export: {fp16: {enabled: false}, int8: {enabled: true, min_speedup: 0, autopilot: false}}\n"
    )
    res = _cli("export", "-c", str(config), "-o", str(folder / "artifacts"), "--engine", "skip")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "report:" in res.stdout
    return folder / "artifacts"


def _open(page_path: Path, shot: Path | None = None) -> dict:
    """Load the page in headless Chromium from a file URL; what a reader's browser saw."""
    seen: dict = {"requests": [], "errors": []}
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1000, "height": 1200})
            page.on("request", lambda r: seen["requests"].append(r.url))
            page.on("console", lambda m: seen["errors"].append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: seen["errors"].append(str(e)))
            page.goto(page_path.as_uri(), wait_until="load")
            seen["images"] = page.eval_on_selector_all(
                "img", "els => els.map(e => [e.complete, e.naturalWidth, e.naturalHeight])"
            )
            seen["svgs"] = page.eval_on_selector_all(
                "svg", "els => els.map(e => { const r = e.getBoundingClientRect(); return [r.width, r.height]; })"
            )
            seen["text"] = page.inner_text("body")
            seen["flips"] = page.eval_on_selector_all(
                "div.flip", "els => els.map(e => [e.querySelectorAll('img').length, e.innerText])"
            )
            png = page.screenshot(full_page=False)
            seen["shot"] = png
            if shot is not None:
                shot.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(shot), clip={"x": 0, "y": 0, "width": 1000, "height": 900})
        finally:
            browser.close()
    return seen


def _not_blank(png: bytes) -> bool:
    import io

    import numpy as np
    from PIL import Image

    pixels = np.asarray(Image.open(io.BytesIO(png)).convert("L"), dtype=np.float32)
    return float(pixels.std()) > 10.0 and (pixels < 128).mean() > 0.01


def test_the_report_renders_offline_with_every_backend_of_the_drift_report(validated):
    import os

    seen = _open(validated / "report.html", shot=DOCS_SHOT if os.environ.get("VITDEPLOY_DOCS_SCREENSHOT") else None)
    assert seen["errors"] == []
    assert [u for u in seen["requests"] if not u.startswith(("file:", "data:"))] == []  # no network at all
    assert all(w > 0 and h > 0 for w, h in seen["svgs"]) and len(seen["svgs"]) >= 3  # drift and speed plots
    assert all(done and w > 0 and h > 0 for done, w, h in seen["images"])
    drift = json.loads((validated / "drift-report.json").read_text())
    for backend in drift["backends"]:
        assert backend["name"] in seen["text"], backend["name"]
    assert "What to deploy" in seen["text"] and "vitdeploy serve -a" in seen["text"]
    assert "Speed on this machine" in seen["text"] and "images/s" in seen["text"]
    assert _not_blank(seen["shot"])


def test_an_int8_graph_that_flips_predictions_shows_each_flip_with_its_thumbnail_and_both_top3s(int8_flips):
    manifest = json.loads((int8_flips / "manifest.json").read_text())
    flips = manifest["validation"]["validate-int8"]["flips"]
    pictured = [f for f in flips if not f["input"].startswith("noise:")]
    assert pictured, f"the forced INT8 graph flipped no image ({len(flips)} flips in all)"
    seen = _open(int8_flips / "report.html")
    assert seen["errors"] == [] and [u for u in seen["requests"] if not u.startswith(("file:", "data:"))] == []
    shown = {text.split("\n", 1)[0].strip(): (imgs, text) for imgs, text in seen["flips"]}
    for flip in pictured:
        imgs, text = shown[flip["input"]]
        assert imgs == 1, flip["input"]  # its thumbnail
        for (ref_label, _), (cand_label, _) in zip(flip["reference"], flip["candidate"]):
            assert ref_label in text and cand_label in text
    assert all(done and w > 0 and h > 0 for done, w, h in seen["images"])
    assert _not_blank(seen["shot"])


def test_no_images_leaves_the_thumbnails_out(int8_flips, tmp_path):
    out = tmp_path / "report.html"
    res = _cli("report", "-a", str(int8_flips), "-o", str(out), "--no-images")
    assert res.returncode == 0, res.stderr
    seen = _open(out)
    assert seen["images"] == [] and seen["flips"] and "not shown: --no-images" in seen["text"]


def test_json_prints_the_recommendation_and_the_figures_behind_it(validated):
    res = _cli("report", "-a", str(validated), "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["recommendation"]["picks"] and {c["name"] for c in doc["candidates"]} >= {"torch", "ort"}
    picked = {p["backend"] for p in doc["recommendation"]["picks"]}
    assert all(next(c for c in doc["candidates"] if c["name"] == b)["passed"] for b in picked)


def test_bench_auto_runs_a_short_bench_once_and_keeps_it_beside_the_manifest(demo_artifacts, tmp_path):
    folder = tmp_path / "artifacts"
    shutil.copytree(demo_artifacts, folder)
    saved = folder / "bench-report.json"
    assert not saved.exists()
    res = _cli("report", "-a", str(folder), "--bench", "auto")
    assert res.returncode == 0 and saved.is_file(), res.stdout + res.stderr
    bench = json.loads(saved.read_text())
    assert {r["batch_size"] for r in bench["results"]} == {1, 8} and "contention" in bench["environment"]
    assert "threads_requested" in bench["environment"] and bench["environment"]["cpu"]
    assert "Speed on this machine" in (folder / "report.html").read_text() and "latency" in res.stdout
    before = saved.stat().st_mtime_ns
    assert _cli("report", "-a", str(folder), "--bench", "auto").returncode == 0
    assert saved.stat().st_mtime_ns == before  # a saved benchmark is used, not run again


def test_the_serving_section_draws_a_saved_loadtests_stage_split(tmp_path):
    """A saved `loadtest -a` result (made here from two levels, no server): the serving section's bars drawn with
    a size, their legend and the table's figures as a reader sees them, offline."""
    from collections import Counter

    from vitdeploy.client.loadgen import LevelResult
    from vitdeploy.client.loadtest import LoadReport, save_loadtest
    from vitdeploy.evaluate.report import write_report

    (tmp_path / "manifest.json").write_text(json.dumps({"name": "synthetic", "artifacts": {}, "validation": {}}))
    levels = []
    for clients, queue in ((1, 1.0), (8, 25.0)):
        level = LevelResult("concurrency", clients, 2.0, [20.0, 30.0, 40.0 + queue], Counter({"200": 3}))
        level.stages = {"read": 0.3, "decode": 3.0, "queue": queue, "model": 12.0, "post": 0.3, "batch": 6.3}
        level.stages["total"] = sum(level.stages[s] for s in ("read", "decode", "queue", "model", "post"))
        levels.append(level)
    save_loadtest(LoadReport({"url": "http://127.0.0.1:8000", "protocol": "predict", "model": None}, levels), tmp_path)
    seen = _open(write_report(tmp_path, images=False)[0])
    assert seen["errors"] == [] and [u for u in seen["requests"] if not u.startswith(("file:", "data:"))] == []
    assert len(seen["svgs"]) == 1 and all(w > 100 and h > 100 for w, h in seen["svgs"])  # the bars, drawn
    text = seen["text"]
    assert "Where a request's time goes" in text and "vitdeploy loadtest of http://127.0.0.1:8000" in text
    assert "batch queue" in text and "client p99" in text and "batch 6.3" in text  # legend and axis, in the SVG
    assert "8 clients\t" in text and "\t25.00\t12.00\t" in text  # the table's row: queue, model
