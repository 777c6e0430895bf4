"""The report page's tables: the model's source as fields (never a dict repr)."""

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
