"""The report page's tables: the model's source as fields (never a dict repr), and an accuracy table whose
columns are the metrics the validations report: a classifier's top-1, an embedding model's recall@k and
cosine percentiles, without empty columns or a flips section for what was not measured."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

pytest.importorskip("matplotlib", reason="matplotlib is not installed (the report extra)")

from vitdeploy.evaluate.report import write_report  # noqa: E402

SOURCE = {
    "path": "demo",
    "format": "vitdeploy",
    "heads_origin": "checkpoint: model.json",
    "resampled_pos_embed": False,
    "notes": ["heads read from model.json", "no labels"],
}
#: what an embedding model's validation reports (no class: no top-1, no flips)
EMBEDDING_METRICS = {
    "cosine": 0.99991,
    "cosine_p01": 0.99995,
    "cosine_p50": 0.9999991,
    "recall_at_k": 0.975,
    "k": 10,
    "max_abs_diff": 2.5e-3,
}
CLASSIFIER_METRICS = {"max_abs_diff": 1.6e-3, "cosine": 0.9999999, "top1_agreement": 1.0, "top5_overlap": 1.0}
PER_IMAGE = {"max_abs_diff": [0.0, 1e-3, 2.5e-3], "cosine": [1.0, 0.99995, 0.99991]}


def _manifest(validation: dict | None = None) -> dict:
    return {
        "name": "synthetic",
        "created": "2026-11-27T00:00:00+00:00",
        "model": {"vit": {"width": 64, "depth": 2}, "source": SOURCE},
        "preprocess": {"height": 32, "width": 32},
        "artifacts": {},
        "validation": validation or {},
        "versions": {"numpy": "2"},
    }


def _drift(metrics: dict, reference: dict) -> dict:
    backend = {"status": "passed", "metrics": metrics, "per_image": PER_IMAGE, "flipped": []}
    return {
        "created": "2026-11-27T00:00:00+00:00",
        "images": {"evaluated": 3, "source": "images/"},
        "backends": [
            {"name": "torch", "status": "reference", "metrics": reference},
            {"name": "ort", **backend},
            {"name": "ort-fp16", **backend},
            {"name": "trt", "status": "unavailable", "reason": "no engine"},
        ],
    }


def _page(folder: Path, manifest: dict, drift: dict | None = None) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    if drift is not None:
        (folder / "drift-report.json").write_text(json.dumps(drift))
    path, _, _ = write_report(folder, images=False)
    return path.read_text(encoding="utf-8")


def _section(page: str, anchor: str) -> str:
    start = page.index(f"<h2 id='{anchor}'>")
    end = page.find("<h2 ", start + 1)
    return page[start : end if end > 0 else None]


def _headers(section: str) -> list[str]:
    table = section[section.index("<table>") : section.index("</table>")]
    return [html.unescape(h) for h in re.findall(r"<th>(.*?)</th>", table)]


def test_the_model_source_is_shown_as_fields_not_a_dict_repr(tmp_path):
    page = _page(tmp_path / "a", _manifest())
    model = _section(page, "model")
    assert "{'" not in html.unescape(model) and "{&#x27;" not in model  # no Python repr, escaped or not
    for key, value in SOURCE.items():
        if not isinstance(value, list):
            assert f"<th>{html.escape(key)}</th><td>{html.escape(str(value), quote=True)}</td>" in model, key
    assert "heads read from model.json<br>no labels" in model  # a list: one item a line


@pytest.mark.parametrize("reference", [{"cosine": 1.0, "max_abs_diff": 0.0}, {"top1_agreement": 1.0, "cosine": 1.0}])
def test_an_embedding_drift_report_shows_its_metrics_and_no_empty_top1_columns(tmp_path, reference):
    page = _page(tmp_path / "a", _manifest(), _drift(EMBEDDING_METRICS, reference))
    accuracy = _section(page, "accuracy")
    head = _headers(accuracy)
    assert head == [
        "backend",
        "verdict",
        "recall@10 (neighbour agreement)",
        "worst cosine",
        "cosine p01 (1st percentile)",
        "cosine p50 (median)",
        "max |diff|",
        "notes",
    ]
    assert "97.5%" in accuracy and "0.999910" in accuracy  # ort's recall@10 and worst cosine
    assert "id='flips'" not in page and "top-1" not in accuracy  # nothing measured a class: nothing to flip
    assert accuracy.count("<figure>") == 2  # both distributions still drawn


def test_an_embedding_manifest_without_a_drift_report_shows_no_top1_column(tmp_path):
    entry = {"passed": True, "backend": "ort", "metrics": EMBEDDING_METRICS, "per_image": PER_IMAGE}
    page = _page(tmp_path / "a", _manifest({"validate-ort-optimized": entry, "validate-fp16": entry}))
    head = _headers(_section(page, "accuracy"))
    assert "recall@10 (neighbour agreement)" in head and "worst cosine" in head
    assert not {"top-1 agreement", "top-5 overlap", "accuracy (labels)"} & set(head)
    assert "id='flips'" not in page


def test_backends_with_different_k_say_their_k_in_the_cell(tmp_path):
    drift = _drift(EMBEDDING_METRICS, {"cosine": 1.0})
    drift["backends"][2]["metrics"] = {**EMBEDDING_METRICS, "k": 5}
    accuracy = _section(_page(tmp_path / "a", _manifest(), drift), "accuracy")
    assert "recall@k (neighbour agreement)" in _headers(accuracy)
    assert "97.5% (k=10)" in accuracy and "97.5% (k=5)" in accuracy


def test_a_classifier_keeps_its_top1_columns_and_flips_section(tmp_path):
    drift = _drift(CLASSIFIER_METRICS, {**CLASSIFIER_METRICS, "max_abs_diff": 0.0})
    page = _page(tmp_path / "a", _manifest(), drift)
    head = _headers(_section(page, "accuracy"))
    assert head[:4] == ["backend", "verdict", "top-1 agreement", "top-5 overlap"] and "recall" not in str(head)
    assert "No backend changed the top-1 class of any image." in _section(page, "flips")


def test_the_page_names_what_auto_runs_on_this_cpu_with_its_figures(tmp_path):
    from vitdeploy.base.machine import cpu_key
    from vitdeploy.base.vocab import AUTO_CHOICE_NAME

    folder = tmp_path / "export"
    folder.mkdir()
    entry = {"chosen": "ort", "ms": {"ort": 4.0, "ort-fp16": 9.5}, "source": "measured", "failed": {}}
    (folder / AUTO_CHOICE_NAME).write_text(
        json.dumps({"format": "vitdeploy-auto-backend", "version": 1, "machines": {cpu_key(): entry}})
    )
    drift = _drift(CLASSIFIER_METRICS, {"top1_agreement": 1.0, "cosine": 1.0, "max_abs_diff": 0.0})
    deploy = html.unescape(_section(_page(folder, _manifest(), drift), "deploy"))
    assert "the default here (auto)" in deploy and "ort 4.00 ms, ort-fp16 9.50 ms (batch 1, measured here)" in deploy
