"""The ONNX export lets the module's weights go with the module (export/onnx.py): nothing the exporter
leaves behind may keep them alive, or the eager model's weights count against every later stage of the
export (measured: all of ViT-B/16's 345 MB, kept by onnxscript's rewriter rules' last match)."""

from __future__ import annotations

import gc
import weakref

import pytest

pytestmark = pytest.mark.integration


def test_no_parameter_outlives_the_module_after_its_export(tiny_checkpoint, tmp_path):
    from vitdeploy.export.onnx import export_onnx
    from vitdeploy.model.checkpoints import load_checkpoint

    loaded = load_checkpoint(tiny_checkpoint)
    model, size = loaded.model, loaded.config.image_size
    watched = [weakref.ref(p) for p in model.parameters()]
    assert watched
    del loaded
    export_onnx(model, tmp_path / "model.onnx", image_size=size)
    assert (tmp_path / "model.onnx").is_file()
    del model
    gc.collect()
    alive = sum(ref() is not None for ref in watched)
    assert alive == 0, f"{alive} of {len(watched)} parameters still referenced after the module was dropped"
