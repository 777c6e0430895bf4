"""What the export's autopilot judge saves without changing a verdict (export/precision_stages.py ``_Judge``,
export/context.py ``open_ort``): a failing candidate stops at the first batch that proves the gate missed,
and a graph opened once is run in that one session by whatever runs the same file next (the INT8 speed
check's graph by its judge, a graph that passed by its validation), with the outputs a new session gives."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from vitdeploy.base.config import PipelineConfig
from vitdeploy.export import precision_stages
from vitdeploy.export.compare import compare
from vitdeploy.export.context import ExportContext, keep_ort, open_ort
from vitdeploy.runtime.backends import ort as ort_backend

TOLERANCE = {"max_abs_diff": 0.5, "min_cosine": 0.9, "min_top1_agreement": 1.0}


class _Fake:
    """A backend whose outputs are given per input row; it records the rows it ran and whether it was closed."""

    made: list["_Fake"] = []

    def __init__(self, path, chw, max_batch, options, name="ort", session_config=()):
        self.path, self.name, self.session_config = Path(path), name, tuple(session_config)
        self.ran: list[int] = []
        self.closed = False
        _Fake.made.append(self)

    def run(self, batch):
        rows = batch[:, 0, 0, 0].astype(int)
        self.ran += rows.tolist()
        return _Fake.outputs[rows]

    def close(self):
        self.closed = True


@pytest.fixture
def fake(monkeypatch):
    _Fake.made = []
    monkeypatch.setattr(ort_backend, "OrtBackend", _Fake)
    return _Fake


def _context(tmp_path: Path, reference: np.ndarray, sizes: tuple[int, ...]) -> ExportContext:
    ctx = ExportContext(PipelineConfig(), tmp_path)
    n = len(reference)
    batch = np.zeros((n, 1, 2, 2), np.float32)
    batch[:, 0, 0, 0] = np.arange(n)  # each input says which row it is
    ctx.inputs = SimpleNamespace(batch=batch, names=tuple(f"noise:{i}" for i in range(n)))
    ctx.reference, ctx.sizes, ctx.chw = reference, sizes, (1, 2, 2)
    return ctx


def _judge(ctx: ExportContext) -> precision_stages._Judge:
    return precision_stages._Judge(ctx, "ort-int8", SimpleNamespace(model_dump=lambda: TOLERANCE), SimpleNamespace())


def _reference(n: int = 8) -> np.ndarray:
    ref = np.zeros((n, 4), np.float32)
    ref[np.arange(n), np.arange(n) % 4] = 1.0
    return ref


def test_a_failing_step_after_the_first_stops_at_the_first_batch_that_proves_it(fake, tmp_path):
    ref = _reference()
    flipped = ref.copy()
    flipped[1] = np.roll(flipped[1], 1)  # row 1's top-1 changes: min_top1_agreement 1.0 is missed by any row
    fake.outputs = flipped
    graph = tmp_path / "model.int8.onnx"
    graph.write_bytes(b"graph")
    ctx = _context(tmp_path, ref, (1, 4))
    judge = _judge(ctx)

    first = judge(graph)  # the first step: every input, its metrics every input's
    judge.witnesses = []  # (as if the step before had failed without witnesses to look at first)
    later = judge(graph)

    assert not compare(ref, flipped, TOLERANCE).passed  # the verdict every row gives
    assert not first.passed and "inputs_judged" not in first.metrics and fake.made[0].ran == list(range(8))
    assert not later.passed and later.metrics["inputs_judged"] == 4
    assert fake.made[1].ran == [0, 1, 2, 3]  # the first batch of 4 proved it: the other 4 rows were not run
    assert judge.witnesses == [1] and fake.made[1].closed and ctx.kept is None


def test_a_passing_candidate_runs_every_input_and_its_session_serves_its_validation(fake, tmp_path):
    ref = _reference()
    fake.outputs = ref + 0.01
    graph = tmp_path / "model.int8.onnx"
    graph.write_bytes(b"graph")
    ctx = _context(tmp_path, ref, (1, 4))

    verdict = _judge(ctx)(graph)

    judged = fake.made[0]
    assert verdict.passed and judged.ran == list(range(8)) and not judged.closed
    assert np.array_equal(ctx.judged[ctx.file_identity(graph)][0], ref + 0.01)
    assert open_ort(ctx, graph, "ort-int8", ()) is judged  # the validation's open: the same session
    assert ctx.kept is None and len(fake.made) == 1


def test_a_kept_session_serves_only_the_same_file_with_the_same_settings(fake, tmp_path):
    a, b = tmp_path / "a.onnx", tmp_path / "b.onnx"
    a.write_bytes(b"a")
    b.write_bytes(b"b")
    ctx = _context(tmp_path, _reference(), (1,))
    first = open_ort(ctx, a, "ort-int8", (("k", "v"),))
    keep_ort(ctx, a, first)

    other = open_ort(ctx, a, "ort", ())  # other settings: a new session, the kept one closed
    assert other is not first and first.closed and ctx.kept is None
    keep_ort(ctx, a, other)
    assert open_ort(ctx, b, "ort", ()) is not other and other.closed  # another file: the same
    third = fake.made[-1]
    keep_ort(ctx, b, third)
    assert open_ort(ctx, b, "ort-int8", ()) is third  # the same file and settings, under another name
    keep_ort(ctx, b, third)
    keep_ort(ctx, a, fake(a, (1, 2, 2), None, None))  # keeping another closes the one kept
    assert third.closed and not fake.made[-1].closed
    ctx.close_kept()
    assert fake.made[-1].closed and ctx.kept is None
    loose = open_ort(SimpleNamespace(chw=(1, 2, 2)), a, "ort", ())
    keep_ort(SimpleNamespace(chw=(1, 2, 2)), a, loose)  # a context that keeps nothing: closed at once
    assert loose.closed


def test_a_session_that_ran_another_batch_size_first_gives_a_new_sessions_outputs(tmp_path):
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((48, 64)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((64, 10)).astype(np.float32), "w2")
    shape = numpy_helper.from_array(np.array([0, 48], np.int64), "shape")
    nodes = [
        helper.make_node("Reshape", ["pixel_values", "shape"], ["flat"]),
        helper.make_node("MatMul", ["flat", "w1"], ["h"]),
        helper.make_node("Gelu", ["h"], ["g"], domain="com.microsoft"),
        helper.make_node("MatMul", ["g", "w2"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, ["batch", 3, 4, 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        [w1, w2, shape],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)]
    )
    path = tmp_path / "tiny.onnx"
    onnx.save(model, str(path))
    batch = rng.standard_normal((32, 3, 4, 4)).astype(np.float32)
    ctx = _context(tmp_path, _reference(), (1,))
    ctx.chw = (3, 4, 4)

    timed = open_ort(ctx, path, "ort")
    timed.run(batch[:8])  # the speed check's calls at batch 8
    keep_ort(ctx, path, timed)
    reused = open_ort(ctx, path, "ort")
    fresh = ort_backend.OrtBackend(path, (3, 4, 4), None, None)

    assert reused is timed
    assert np.array_equal(reused.run(batch), fresh.run(batch))
