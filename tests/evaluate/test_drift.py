"""Drift of every backend x precision from eager FP32 PyTorch, on the demo export and demo images.

One module, one parametrised test over every backend of the vocabulary (``vocab.BACKENDS``, never names
typed here): torch FP32 on the CPU is the reference, and runs on CUDA too; every other backend runs on its
own device (ort, ort-fp16, ort-int8 on the CPU; torch-fp16, trt, trt-int8 on CUDA) and is judged against
the thresholds of its precision in the default config (``validation.fp32`` / ``fp16`` / ``int8``). A backend
that cannot run here skips with a one-line reason; tests/evaluate/conftest.py prints how many ran. The
export is the session's demo_artifacts (plus a TensorRT engine where TensorRT and CUDA exist: drift_artifacts).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest

from vitdeploy.base.vocab import BACKEND_KINDS, BACKENDS, TORCH
from vitdeploy.evaluate.dataset import label_indices, load_validation_set
from vitdeploy.evaluate.drift import default_thresholds, run_drift
from vitdeploy.evaluate.drift_judge import judge_backend
from vitdeploy.evaluate.specs import BackendSpec, open_spec, reference_options, spec_unavailable_reason
from vitdeploy.runtime.backends import BackendOptions

pytestmark = pytest.mark.integration


def _cases() -> list[tuple[str, str, str, str]]:
    """(id, backend name, device, precision) of every backend of the vocabulary, on the device it runs on
    (torch FP32 on both: the CPU one is the reference). The id names the precision, and torch's the device."""
    cases = []
    for kind in BACKENDS:
        devices = ("cuda",) if kind.device == "cuda" else ("cpu", "cuda") if kind.name == TORCH else ("cpu",)
        for device in devices:
            case = kind.name if kind.name.endswith(kind.precision) else f"{kind.name}-{kind.precision}"
            cases.append((f"{case}-{device}" if kind.runs == TORCH else case, kind.name, device, kind.precision))
    return cases


CASES = _cases()


@dataclass
class Setup:
    artifacts: object
    batch: np.ndarray
    names: list
    true_index: list
    reference: np.ndarray


@pytest.fixture(scope="module")
def setup(drift_artifacts) -> Setup:
    """The demo images preprocessed once, and the reference logits (torch, CPU, FP32)."""
    from vitdeploy.runtime.artifacts import Artifacts
    from vitdeploy.runtime.preprocess import Preprocessor

    artifacts = Artifacts.open(drift_artifacts)
    vset = load_validation_set()  # the shipped demo images and labels.csv
    batch, good, errors = Preprocessor(artifacts.preprocess).batch_tolerant(list(vset.paths))
    assert not errors, f"shipped demo images must all be readable: {errors}"
    true_index, unknown = label_indices([vset.labels[i] for i in good], artifacts.labels)
    assert not unknown, f"demo labels.csv has labels the model does not know: {unknown}"
    ref = open_spec(BackendSpec("torch", "torch", reference_options(), "fp32"), artifacts)
    try:
        reference = ref.run(batch)
    finally:
        ref.close()
    return Setup(artifacts, batch, [str(vset.paths[i]) for i in good], true_index, reference)


def _spec(name: str, device: str, precision: str) -> BackendSpec:
    runs = BACKEND_KINDS[name].runs
    if runs == TORCH:  # the torch backend runs either precision; the others' is in their file
        return BackendSpec(name, runs, BackendOptions(device=device, precision=precision), precision)
    return BackendSpec(name, runs, BackendOptions(device=device), precision)


@pytest.mark.parametrize("case, name, device, precision", CASES, ids=[c[0] for c in CASES])
def test_backend_drift(setup: Setup, case: str, name: str, device: str, precision: str) -> None:
    spec = _spec(name, device, precision)
    reason = spec_unavailable_reason(spec, setup.artifacts)
    if reason:
        pytest.skip(f"{case}: {reason}")
    backend = open_spec(spec, setup.artifacts)
    try:
        logits = backend.run(setup.batch)
        if spec.is_reference:
            # The reference itself: deterministic, and independent of how the batch is split.
            np.testing.assert_array_equal(logits, setup.reference)
            one_by_one = np.concatenate([backend.run(setup.batch[i : i + 1]) for i in range(8)])
            np.testing.assert_allclose(one_by_one, setup.reference[:8], rtol=0, atol=1e-5)
    finally:
        backend.close()
    tolerance = default_thresholds()[precision]
    row = judge_backend(
        case,
        logits,
        setup.reference,
        tolerance,
        names=setup.names,
        true_index=setup.true_index,
        classes=setup.artifacts.labels,
        precision=precision,
    )
    flips = "; ".join(f"{f['path']}: {f['reference']} -> {f['candidate']}" for f in row.flipped)
    assert row.status == "passed", (
        f"{case} drifted beyond the default {precision} thresholds: "
        f"{'; '.join(row.failures)}; metrics {row.metrics}; flipped: {flips or 'none'}"
    )
    ref_accuracy = judge_backend(
        "ref",
        setup.reference,
        setup.reference,
        tolerance,
        names=setup.names,
        true_index=setup.true_index,
        classes=setup.artifacts.labels,
    ).accuracy
    assert ref_accuracy is not None and ref_accuracy >= 0.8, f"the demo model classifies only {ref_accuracy} right"
    assert row.accuracy is not None and abs(row.accuracy - ref_accuracy) <= 1 - tolerance["min_top1_agreement"] + 1e-9


def test_validate_on_the_demo_export_passes_and_writes_its_report(drift_artifacts, tmp_path):
    """The library `vitdeploy validate` calls: every backend listed (ran or why not), all pass."""
    out = tmp_path / "drift-report.json"
    report = run_drift(drift_artifacts, report_path=out)
    rows = {b.name: b for b in report.backends}
    assert list(rows) == [kind.name for kind in BACKENDS]  # every backend, in the vocabulary's order
    assert all(b.ran or b.reason for b in report.backends), "a backend that did not run must say why"
    assert report.passed, [(b.name, b.failures or b.reason) for b in report.failed]
    assert (
        rows["ort"].status == "passed" and rows["ort-fp16"].status == "passed" and rows["ort-int8"].status == "passed"
    )
    assert report.images["evaluated"] == report.images["labelled"] == report.images["count"]
    saved = json.loads(out.read_text())
    assert saved["passed"] is True and saved["reference"]["accuracy"] == report.reference["accuracy"]
