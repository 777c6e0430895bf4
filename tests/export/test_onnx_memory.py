"""The ONNX export lets the module's weights go with the module (export/onnx.py): nothing the exporter
leaves behind may keep them alive, or the eager model's weights count against every later stage of the
export (measured: all of ViT-B/16's 345 MB, kept by onnxscript's rewriter rules' last match). That holds in an
export's frozen heap too (memory.heap_frozen): from a process's second export on, and in a host that froze its own
heap, the rules are frozen objects, which gc.get_objects does not see."""

from __future__ import annotations

import gc
import weakref

import pytest

from vitdeploy.base import memory

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


def _export_and_count_survivors(checkpoint, path) -> tuple[int, int]:
    from vitdeploy.export.onnx import export_onnx
    from vitdeploy.model.checkpoints import load_checkpoint

    loaded = load_checkpoint(checkpoint)
    model, size = loaded.model, loaded.config.image_size
    watched = [weakref.ref(p) for p in model.parameters()]
    del loaded
    export_onnx(model, path, image_size=size)
    del model
    memory.give_back()
    return sum(ref() is not None for ref in watched), len(watched)


@pytest.mark.parametrize("frozen_by", ["an earlier export", "the host"])
def test_no_parameter_outlives_the_module_when_the_exporters_rules_are_frozen(tiny_checkpoint, tmp_path, frozen_by):
    gc.unfreeze()
    try:
        with memory.heap_frozen():  # the first export imports the exporter: its rules are made inside the block
            _export_and_count_survivors(tiny_checkpoint, tmp_path / "first.onnx")
        if frozen_by == "the host":
            gc.freeze()  # a pre-fork server's own freeze, the exporter's rules in it
        for n in range(2):  # the rules were alive when the block froze the heap: frozen objects now
            with memory.heap_frozen():
                alive, total = _export_and_count_survivors(tiny_checkpoint, tmp_path / f"again{n}.onnx")
            assert alive == 0, f"export {n + 2}: {alive} of {total} parameters still referenced after the module went"
    finally:
        gc.unfreeze()


def test_every_pattern_matcher_alive_is_found_from_onnxscripts_modules(tiny_checkpoint, tmp_path):
    """The route _forget_last_matches takes to the matchers (the rewriter's modules, not the collector) reaches
    every matcher the exporter left alive: a new home for onnxscript's rules fails here, not as a silent leak."""
    from onnxscript.rewriter._matcher import PatternMatcher

    from vitdeploy.export.onnx import _rewrite_matchers

    gc.unfreeze()
    _export_and_count_survivors(tiny_checkpoint, tmp_path / "model.onnx")
    rewriter = [o for o in gc.get_objects() if str(getattr(type(o), "__module__", "")).startswith("onnxscript.")]
    alive = {id(obj) for obj in rewriter if isinstance(obj, PatternMatcher)}
    assert alive and alive <= {id(m) for m in _rewrite_matchers()}
