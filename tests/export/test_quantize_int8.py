"""model.int8.onnx: what a user relies on from the INT8 stage and the ort-int8 backend.

- the default (static QDQ) answer for an image is the same alone and inside a batch of 8;
- dynamic mode (opt-in) is not: its answers move with the batch (why it is not the default);
- too few calibration images: a clear error naming the key (required), or the export goes on
  without the INT8 graph (auto); a gate that cannot pass: the stage fails with its metrics and
  every other artifact stays valid (auto), or the stage is refused (required): the export is written
  without it, the manifest and export-report.json say why, and it exits non-zero naming the key.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers.bad_input import run_cli
from helpers.thresholds import IMPOSSIBLE

from vitdeploy.base.config import parse_config
from vitdeploy.base.errors import ConfigError, RefusedStagesError, StageUnavailableError, ValidationError
from vitdeploy.demo import IMAGES_DIR
from vitdeploy.export.int8_calibration import calibration_batch
from vitdeploy.export.pipeline import run_export
from vitdeploy.export.quantize import quantize_int8
from vitdeploy.runtime.artifacts import Artifacts
from vitdeploy.runtime.backends import BackendOptions, open_backend
from vitdeploy.runtime.preprocess import Preprocessor

pytestmark = pytest.mark.integration

CPU1 = BackendOptions(device="cpu", providers=("CPUExecutionProvider",), threads=1)


def _demo_batch(artifacts: Artifacts, n: int = 8) -> np.ndarray:
    paths = sorted(p for p in IMAGES_DIR.iterdir() if p.suffix in (".png", ".jpg"))[:n]
    return Preprocessor(artifacts.preprocess).batch(paths)


def _alone_vs_batched(backend, batch: np.ndarray) -> float:
    alone = np.concatenate([backend.run(batch[i : i + 1]) for i in range(len(batch))])
    together = backend.run(batch)
    return float(np.abs(alone - together).max())


def test_default_int8_answer_is_the_same_alone_and_in_a_batch_of_8(demo_artifacts):
    artifacts = Artifacts.open(demo_artifacts)
    manifest = json.loads((demo_artifacts / "manifest.json").read_text())
    assert manifest["export"]["int8"]["mode"] == "static" and artifacts.has("onnx-int8")
    assert manifest["validation"]["validate-int8"]["passed"] is True
    # every MatMul/Gemm INT8 and no top-1 answer changed; its attention (65 tokens, heads of 16) stays in the
    # fused float node, where writing it out does not pay (export/int8_attention.py MIN_TOKENS)
    record, gate = manifest["export"]["int8"], manifest["validation"]["validate-int8"]
    assert record["keep_float"] == [] and "attention" not in record and gate["metrics"]["top1_agreement"] == 1.0
    batch = _demo_batch(artifacts)
    backend = open_backend("ort-int8", artifacts, CPU1)
    try:
        assert backend.name == "ort-int8" and Path(backend.onnx_path).name == "model.int8.onnx"
        assert _alone_vs_batched(backend, batch) <= 1e-6
        fp32 = open_backend("ort", artifacts, CPU1)
        try:  # it really is a different (quantized) graph, not the FP32 one under another name
            assert np.abs(fp32.run(batch) - backend.run(batch)).max() > 1e-4
        finally:
            fp32.close()
    finally:
        backend.close()


def test_dynamic_mode_answers_depend_on_the_batch(demo_artifacts, tmp_path):
    artifacts = Artifacts.open(demo_artifacts)
    dst = tmp_path / "model.int8.onnx"
    res = quantize_int8(demo_artifacts / "model.ort.onnx", dst, input_name=artifacts.input_name, mode="dynamic")
    assert res.mode == "dynamic" and res.method is None and res.quantized_nodes
    from vitdeploy.runtime.backends.ort import OrtBackend

    backend = OrtBackend(dst, artifacts.input_shape, None, CPU1, name="ort-int8")
    try:
        assert _alone_vs_batched(backend, _demo_batch(artifacts)) > 1e-4
    finally:
        backend.close()


def test_the_autopilot_steps_share_one_calibration_and_write_the_same_graphs(demo_artifacts, tmp_path, monkeypatch):
    """The ranges are calibrated once, by vitdeploy's probe (export/probe.py), never by ONNX Runtime's
    calibrator, and serve every step: each step's graph is the same bytes as one quantize_static
    calibrates on its own with its calibrator, for both placements."""
    import inspect
    import sys

    import onnxruntime.quantization  # noqa: F401 - loads the module below (the package's name for it is a function)

    from vitdeploy.export import quantize
    from vitdeploy.export.quantize import ORT_CPU, TENSORRT, prepare, quantizable_nodes, quantize_prepared

    ort_quantize = sys.modules["onnxruntime.quantization.quantize"]
    if "calibration_cache_path" not in inspect.signature(ort_quantize.quantize_static).parameters:
        pytest.skip("this ONNX Runtime has no calibration cache (< 1.32): every step calibrates")
    artifacts = Artifacts.open(demo_artifacts)
    theirs, ours = [], []
    real, real_ours = ort_quantize.create_calibrator, quantize.calibrate_minmax
    monkeypatch.setattr(ort_quantize, "create_calibrator", lambda *a, **k: theirs.append(1) or real(*a, **k))
    monkeypatch.setattr(quantize, "calibrate_minmax", lambda *a, **k: ours.append(1) or real_ours(*a, **k))
    calib = _demo_batch(artifacts, 16)
    for placement, src in ((ORT_CPU, "model.ort.onnx"), (TENSORRT, "model.onnx")):
        theirs.clear(), ours.clear()
        pre = prepare(demo_artifacts / src, tmp_path / f"{placement.name}.pre.onnx", placement=placement)
        nodes = quantizable_nodes(pre, placement.op_types)
        steps = [(), tuple(nodes[:2]), tuple(nodes[-3:])]
        shared = tmp_path / f"{placement.name}.ranges.json"
        for i, keep in enumerate(steps):
            args = dict(input_name=artifacts.input_name, calibration=calib, keep_float=keep, placement=placement)
            quantize_prepared(pre, tmp_path / f"shared{i}.onnx", ranges=shared, **args)
            quantize_prepared(pre, tmp_path / f"alone{i}.onnx", **args)  # no cache: ONNX Runtime calibrates
            assert (tmp_path / f"shared{i}.onnx").read_bytes() == (tmp_path / f"alone{i}.onnx").read_bytes()
        assert (len(ours), len(theirs)) == (1, len(steps)), placement.name  # shared: calibrated once, by us


def test_the_graph_is_the_same_bytes_as_onnx_runtimes_own_pre_processing_and_calibration(demo_artifacts, tmp_path):
    """What the stage saves memory on changes no byte of the INT8 graph: shapes inferred without the
    weights (against quant_pre_process without its optimiser, the same inferences) and calibration one
    image at a time (against quantize_static reading every image at once), for both placements. For
    ONNX Runtime on the CPU both start from the graph with its attention written out (export/int8_attention.py),
    its keys and values signed symmetric INT8."""
    import onnx
    from onnxruntime import quantization as quant
    from onnxruntime.quantization.shape_inference import quant_pre_process

    from vitdeploy.export.int8_attention import signed_operands, written_out_copy
    from vitdeploy.export.quantize import ORT_CPU, TENSORRT, prepare, quantize_prepared

    artifacts = Artifacts.open(demo_artifacts)
    calib = _demo_batch(artifacts, 16)

    class AllAtOnce(quant.CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter([{artifacts.input_name: calib}])

        def get_next(self):
            return next(self.it, None)

    for placement, src in ((ORT_CPU, "model.ort.onnx"), (TENSORRT, "model.onnx")):
        ours = prepare(  # the demo's attention is written out only when asked (it would not pay)
            demo_artifacts / src,
            tmp_path / f"{placement.name}.pre.onnx",
            placement=placement,
            optimized=True,
            attention=True if placement.attention else None,
        )
        theirs = tmp_path / f"{placement.name}.ort-pre.onnx"
        source = demo_artifacts / src
        if placement.attention:
            source = written_out_copy(source, tmp_path / f"{placement.name}.written-out.onnx", False)
        quant_pre_process(str(source), str(theirs), skip_optimization=True)
        assert onnx.load(str(ours)) == onnx.load(str(theirs))  # the same model (written in another field order)
        signed = signed_operands(onnx.load(str(theirs)), {n.name for n in onnx.load(str(theirs)).graph.node})
        assert len(signed) == (8 if placement.attention else 0)  # the demo's 4 blocks: keys and values
        mine = quantize_prepared(
            ours,
            tmp_path / f"{placement.name}.q.onnx",
            input_name=artifacts.input_name,
            calibration=calib,
            placement=placement,
        ).path
        reference = tmp_path / f"{placement.name}.ort-q.onnx"
        activations = quant.QuantType.QInt8 if placement.activations == "int8" else quant.QuantType.QUInt8
        quant.quantize_static(
            str(theirs),
            str(reference),
            AllAtOnce(),
            quant_format=quant.QuantFormat.QDQ,
            op_types_to_quantize=list(placement.op_types),
            per_channel=True,
            activation_type=activations,
            weight_type=quant.QuantType.QInt8,
            extra_options={
                "WeightSymmetric": True,
                "ActivationSymmetric": placement.symmetric_activations,
                "QuantizeBias": placement.quantize_bias,
                "OpTypesToExcludeOutputQuantization": list(placement.op_types),
                **(
                    {
                        "TensorQuantOverrides": {
                            t: [{"quant_type": quant.QuantType.QInt8, "symmetric": True}] for t in signed
                        }
                    }
                    if signed
                    else {}
                ),
            },
        )
        assert mine.read_bytes() == reference.read_bytes(), placement.name

    # model.ort.onnx is ONNX Runtime's optimised graph already: its basic optimiser again (what
    # quant_pre_process does by default) renames and merges a few initializers, and changes no answer
    from vitdeploy.runtime.backends.ort import OrtBackend

    optimised = tmp_path / "optimised.pre.onnx"
    quant_pre_process(str(tmp_path / "onnxruntime-cpu.written-out.onnx"), str(optimised))
    again = quantize_prepared(
        optimised, tmp_path / "optimised.q.onnx", input_name=artifacts.input_name, calibration=calib
    ).path
    logits = []
    for path in (tmp_path / "onnxruntime-cpu.q.onnx", again):
        backend = OrtBackend(path, artifacts.input_shape, None, CPU1, name="ort-int8")
        try:
            logits.append(backend.run(calib))
        finally:
            backend.close()
    assert np.array_equal(logits[0], logits[1])


def test_a_graph_with_external_data_is_prepared_and_quantized_the_same(demo_artifacts, tmp_path):
    """A model over 2 GB keeps its weights in a data file: the weightless pre-processing puts that file
    beside the prepared graph (no reference outside its folder) and the INT8 graph is the same."""
    import onnx

    from vitdeploy.export.quantize import TENSORRT, prepare, quantize_prepared

    artifacts = Artifacts.open(demo_artifacts)
    calib = _demo_batch(artifacts, 8)
    big = tmp_path / "big"
    big.mkdir()
    onnx.save_model(
        onnx.load(str(demo_artifacts / "model.onnx")),
        str(big / "model.onnx"),
        save_as_external_data=True,
        location="model.onnx.data",
        size_threshold=0,
    )
    results = []
    for name, src, external in (("plain", demo_artifacts / "model.onnx", False), ("ext", big / "model.onnx", True)):
        work = tmp_path / name
        work.mkdir()
        pre = prepare(src, work / "pre.onnx", external_data=external, placement=TENSORRT)
        if external:
            assert (work / "model.onnx.data").read_bytes() == (big / "model.onnx.data").read_bytes()
        res = quantize_prepared(
            pre,
            work / "q.onnx",
            input_name=artifacts.input_name,
            calibration=calib,
            external_data=external,
            placement=TENSORRT,
        )
        from vitdeploy.runtime.backends.ort import OrtBackend

        backend = OrtBackend(res.path, artifacts.input_shape, None, CPU1, name="int8-trt")
        try:
            results.append(backend.run(calib))
        finally:
            backend.close()
    assert np.array_equal(results[0], results[1])


def test_too_few_calibration_images_is_an_error_naming_the_key():
    batch = np.zeros((5, 3, 8, 8), np.float32)
    names = ("a.png", "b.png", "c.png", "noise:0", "noise:1")
    with pytest.raises(ConfigError, match="export.int8.min_calibration_images"):
        calibration_batch(batch, names, max_images=64, min_images=4)  # noise rows never count
    assert calibration_batch(batch, names, max_images=2, min_images=2).shape == (2, 3, 8, 8)


def test_an_onnx_runtime_whose_shape_inference_misreads_the_graph_is_named_before_any_work(demo_artifacts, tmp_path):
    """onnxruntime 1.30's symbolic shape inference ignores Shape(start, end) and fails on a ViT's class-token
    Concat with "list index out of range" (seen on the GPU machine's image): the stage says which version it
    needs instead, as a stage unavailable here (exit 4 when required; auto goes on without it)."""
    import onnxruntime

    real = onnxruntime.__version__
    for old in ("1.30.0", "1.29.1+cu126"):
        onnxruntime.__version__ = old
        try:
            with pytest.raises(
                StageUnavailableError, match=rf"needs onnxruntime >= 1\.31 \(this is {re.escape(old)}.*pip"
            ):
                quantize_int8(demo_artifacts / "model.ort.onnx", tmp_path / "x.onnx", input_name="pixel_values")
        finally:
            onnxruntime.__version__ = real
    assert not list(tmp_path.iterdir())  # nothing written


def _few_images(tmp_path: Path, n: int = 3) -> Path:
    folder = tmp_path / "few"
    folder.mkdir()
    for p in sorted(IMAGES_DIR.glob("*.png"))[:n]:
        shutil.copy(p, folder / p.name)
    return folder


def test_too_few_calibration_images_required_fails_auto_goes_on(tiny_checkpoint, tmp_path):
    base = {
        "model": {"checkpoint": str(tiny_checkpoint)},
        "validation": {"images": str(_few_images(tmp_path))},
        "export": {"fp16": {"enabled": False}},
    }
    required = parse_config({**base, "export": {**base["export"], "int8": {"enabled": True}}}, None)
    with pytest.raises(RefusedStagesError, match="export.int8.min_calibration_images") as refused:
        run_export(required, tmp_path / "req", engine="skip", heartbeat_s=None)
    assert refused.value.exit_code == ConfigError.exit_code  # 2, as for the same fault elsewhere
    _assert_refused(tmp_path / "req", "int8", "export.int8.min_calibration_images")
    result = run_export(parse_config(base, None), tmp_path / "auto", engine="skip", heartbeat_s=None)
    stage = next(s for s in result.stages if s.name == "int8")
    assert stage.status == "failed" and "export.int8.min_calibration_images" in stage.reason
    assert "onnx-int8" not in result.artifacts and not (tmp_path / "auto" / "model.int8.onnx").exists()
    Artifacts.open(tmp_path / "auto")  # the rest of the export is valid


def _assert_refused(out: Path, stage: str, key: str) -> None:
    """An export that refused its INT8 graph: every other artifact validated and listed, the refusal
    in the manifest and export-report.json, naming ``key``; no model.int8.onnx under any name."""
    manifest = json.loads((out / "manifest.json").read_text())
    refusal = manifest["export"]["refused"]
    assert [(r["stage"], r["artifacts"]) for r in refusal] == [(stage, ["model.int8.onnx"])], refusal
    assert key in refusal[0]["error"]
    assert json.loads((out / "export-report.json").read_text())["refused"] == refusal
    assert {"onnx", "onnx-ort", "weights"} <= set(manifest["artifacts"]) and "onnx-int8" not in manifest["artifacts"]
    assert not (out / "model.int8.onnx").exists()
    artifacts = Artifacts.open(out)  # every file verifies
    open_backend("ort", artifacts, CPU1).close()


@pytest.mark.parametrize("autopilot", [True, False])
def test_int8_gate_that_cannot_pass(tiny_checkpoint, tmp_path, autopilot):
    base = {
        "model": {"checkpoint": str(tiny_checkpoint)},
        "validation": {"int8": IMPOSSIBLE},
        "export": {"fp16": {"enabled": False}, "int8": {"autopilot": autopilot, "min_speedup": 0}},
    }
    out = tmp_path / "auto"
    result = run_export(parse_config(base, None), out, engine="skip", heartbeat_s=None)
    stages = {s.name: s for s in result.stages}
    manifest = json.loads((out / "manifest.json").read_text())
    record = manifest["export"]["int8"]
    assert record["passed"] is False
    if autopilot:  # the fully quantized graph, then the largest step (every MatMul/Gemm in float): refused at once
        assert stages["int8"].status == "failed" and "validation.int8 not met" in stages["int8"].reason
        steps = record["autopilot"]
        assert steps[0]["step"] == "all MatMul/Gemm quantized" and steps[0]["keep_float"] == []
        assert len(steps) == 2 and not any(s["passed"] for s in steps)
        assert all(s["failures"] and "cosine" in s["metrics"] for s in steps)
        assert len(steps[-1]["keep_float"]) == len(set(steps[-1]["keep_float"])) == 2 * 6 + 1  # 2 blocks, the head
    else:  # one graph, judged by the validate-int8 stage
        assert stages["int8"].status == "passed" and stages["validate-int8"].status == "failed"
        gate = manifest["validation"]["validate-int8"]
        assert gate["passed"] is False and gate["failures"] and gate["metrics"]["max_abs_diff"] > 0
    assert "onnx-int8" not in manifest["artifacts"] and not any(out.glob("model.int8.onnx*"))
    artifacts = Artifacts.open(out)  # every other artifact stays valid
    for name in ("ort", "torch"):
        open_backend(name, artifacts, CPU1).close()
    required = parse_config(
        {**base, "export": {**base["export"], "int8": {"enabled": True, "autopilot": autopilot, "min_speedup": 0}}},
        None,
    )
    with pytest.raises(RefusedStagesError, match="validation.int8") as refused:
        run_export(required, out, engine="skip", heartbeat_s=None)
    assert refused.value.exit_code == ValidationError.exit_code == 3
    _assert_refused(out, "int8", "validation.int8")


def _step0_cosine(manifest: dict) -> float:
    """The cosine of the all-INT8 graph (the autopilot's step 0) as measured on this machine."""
    return manifest["export"]["int8"]["autopilot"][0]["metrics"]["cosine"]


def test_autopilot_returns_nodes_to_float_until_the_gate_passes(demo_artifacts, tmp_path):
    """The gate is set between what every MatMul/Gemm in INT8 measured on this machine (the demo
    export's step 0) and float, so step 0 fails on any CPU (ONNX Runtime's INT8 kernels are more exact
    with AVX512-VNNI than with AVX2): the autopilot returns the Gemm head, then blocks, to float until
    it passes (the largest step, every MatMul/Gemm in float with min_speedup 0, is first looked at on the
    inputs step 0 failed on: they pass there, so it proves nothing and is judged last, only if needed)."""
    step0 = _step0_cosine(json.loads((demo_artifacts / "manifest.json").read_text()))
    assert step0 < 1.0 - 1e-6, "INT8 that equals float leaves the autopilot nothing to do"
    min_cosine = round(step0 + (1.0 - step0) / 2, 6)
    gate = {
        "max_abs_diff": 1.0,
        "mean_abs_diff": 0.1,
        "min_cosine": min_cosine,
        "min_top1_agreement": 0.98,
        "min_top5_overlap": 0.9,
    }
    out = tmp_path / "demo"
    run_export(
        parse_config(
            {"export": {"fp16": {"enabled": False}, "int8": {"min_speedup": 0}}, "validation": {"int8": gate}}, None
        ),
        out,
        engine="skip",
        heartbeat_s=None,
    )
    manifest = json.loads((out / "manifest.json").read_text())
    record, steps = manifest["export"]["int8"], manifest["export"]["int8"]["autopilot"]
    assert _step0_cosine(manifest) == step0  # the same graph and calibration measure the same here
    assert not steps[0]["passed"] and steps[0]["metrics"]["cosine"] < min_cosine
    assert steps[1]["step"] == "op type Gemm float" and steps[-1]["passed"]
    assert steps[-1]["metrics"]["cosine"] >= min_cosine
    assert not any(s["passed"] for s in steps[:-1])
    # a failing step may be judged on the inputs the step before failed on (a proof for all of them);
    # the first step, with nothing before it, and the step that passes are judged on every input
    assert "inputs_judged" not in steps[0]["metrics"] and "inputs_judged" not in steps[-1]["metrics"]
    for step in steps:
        if "inputs_judged" in step["metrics"]:
            assert not step["passed"] and all("inputs run: the others cannot make up" in f for f in step["failures"])
    kept = [set(s["keep_float"]) for s in steps]
    assert all(a < b for a, b in zip(kept, kept[1:])), "each step returns more nodes to float"
    assert record["passed"] is True and record["keep_float"] == steps[-1]["keep_float"]
    assert manifest["validation"]["validate-int8"]["passed"] is True and "onnx-int8" in manifest["artifacts"]
    import onnx

    graph = onnx.load(str(out / "model.int8.onnx"))
    float_kept = set(record["keep_float"])
    quantized_matmuls = {
        n.name
        for n in graph.graph.node
        if n.op_type in ("MatMul", "Gemm") and any(i.endswith("_DequantizeLinear_Output") for i in n.input)
    }
    assert len(quantized_matmuls) == record["quantized_nodes"] and not (quantized_matmuls & float_kept)


def test_predict_runs_ort_int8_when_asked(demo_artifacts):
    """(auto weighs it like every backend that passed its gate, by speed: tests/runtime/test_auto_choice.py)"""
    from click.testing import CliRunner

    from vitdeploy.cli import main

    image = sorted(IMAGES_DIR.glob("digit3_*.png"))[0]
    res = CliRunner().invoke(
        main, ["predict", "-a", str(demo_artifacts), "-b", "ort-int8", "--json", str(image)], catch_exceptions=False
    )
    assert res.exit_code == 0, res.output
    row = json.loads(next(line for line in res.output.splitlines() if line.startswith("{")))
    assert row["label"] == "3" and row["path"] == str(image)


def test_an_int8_graph_that_does_not_pay_stops_before_any_accuracy_work(tiny_checkpoint, tmp_path):
    """Speed first: the fully quantized graph is timed against model.ort.onnx before any validation or
    autopilot step; below export.int8.min_speedup (here one no machine reaches) the stage stops at once,
    says so in one line naming this CPU's INT8 instruction set, and the rest ships; required (enabled:
    true), the export is written without it and exits 4, its last line naming the key."""
    from vitdeploy.base.machine import int8_isa

    base = {
        "model": {"checkpoint": str(tiny_checkpoint)},
        "export": {"fp16": {"enabled": False}, "int8": {"min_speedup": 1e9}},
    }
    out = tmp_path / "auto"
    result = run_export(parse_config(base, None), out, engine="skip", heartbeat_s=None)
    stages = {s.name: s for s in result.stages}
    int8 = stages["int8"]
    assert int8.status == "skipped" and "\n" not in int8.reason, int8
    assert int8.reason.startswith("model.int8.onnx not written: INT8 does not pay on this CPU: ")
    assert "fully quantized" in int8.reason and "needs >= 1e+09x" in int8.reason and int8_isa() in int8.reason
    assert "validate-int8" not in stages and "speed-int8" not in stages  # no accuracy work was spent on it
    manifest = json.loads((out / "manifest.json").read_text())
    record = manifest["export"]["int8"]
    assert record["shipped"] is False and "autopilot" not in record
    assert record["speed"]["min_speedup"] == 1e9 and record["speed"]["speedup"] > 0
    assert "onnx-int8" not in manifest["artifacts"] and not any(out.glob("model.int8.onnx*"))
    Artifacts.open(out)  # the rest of the export is valid
    required = {**base, "export": {**base["export"], "int8": {"enabled": True, "min_speedup": 1e9}}}
    config = tmp_path / "required.yaml"
    config.write_text(json.dumps(required))  # YAML reads JSON
    res = run_cli("export", "-c", str(config), "-o", str(tmp_path / "req"), "--engine", "skip")
    assert res.returncode == StageUnavailableError.exit_code == 4, res.stderr  # "a required stage is unavailable"
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("error: INT8 does not pay on this CPU") and "export.int8.min_speedup: 0" in last, last
    assert "refused: model.int8.onnx (int8)" in res.stdout and "manifest" in res.stdout, res.stdout
    assert "validate-int8" not in res.stderr
    _assert_refused(tmp_path / "req", "int8", "export.int8.min_speedup")


def test_a_graph_that_pays_is_timed_once_when_the_autopilot_keeps_it_whole(tiny_checkpoint, tmp_path):
    """min_speedup tiny: the fully quantized graph pays and passes the (loose) gate at the autopilot's
    first step, so the speed stage reuses the measurement taken before validation."""
    loose = {
        "max_abs_diff": 1e9,
        "mean_abs_diff": 1e9,
        "min_cosine": -1,
        "min_top1_agreement": 0,
        "min_top5_overlap": 0,
    }
    cfg = {
        "model": {"checkpoint": str(tiny_checkpoint)},
        "validation": {"int8": loose},
        "export": {"fp16": {"enabled": False}, "int8": {"min_speedup": 1e-9}},
    }
    result = run_export(parse_config(cfg, None), tmp_path, engine="skip", heartbeat_s=None)
    stages = {s.name: s for s in result.stages}
    assert stages["speed-int8"].status == "passed" and "timed before validation" in stages["speed-int8"].reason
    record = json.loads((tmp_path / "manifest.json").read_text())["export"]["int8"]
    assert record["speed"] == record["speed_first"] and len(record["autopilot"]) == 1 and record["keep_float"] == []


def test_min_speedup_0_ships_without_timing(demo_artifacts):
    manifest = json.loads((demo_artifacts / "manifest.json").read_text())  # exported with min_speedup: 0
    assert "onnx-int8" in manifest["artifacts"] and "speed" not in manifest["export"]["int8"]
    stage = next(s for s in manifest["stages"] if s["name"] == "speed-int8")
    assert stage["status"] == "skipped" and "min_speedup is 0" in stage["reason"]
