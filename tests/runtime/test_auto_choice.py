"""Backend "auto" on the CPU (runtime/auto_choice.py): the fastest backend that passed its gate, from a measurement
kept beside the export per CPU, or from `vitdeploy bench`'s results. Every timing here is made up (a deterministic
timer or figures written by the test): no test depends on this machine's speed."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import pytest

from vitdeploy.base.vocab import (
    AUTO_CHOICE_NAME,
    BENCH_REPORT_NAME,
    OPENVINO,
    OPENVINO_BF16,
    OPENVINO_INT8,
    ORT,
    ORT_INT8,
)
from vitdeploy.runtime import auto_choice
from vitdeploy.runtime.artifacts import Artifacts
from vitdeploy.runtime.backends import BackendOptions
from vitdeploy.runtime.predictor import Predictor, select_backend

pytest.importorskip("openvino")  # the tiny export's candidates: ort and openvino (both run model.onnx)


class FakeTimer:
    """A call of backend ``name`` takes ``seconds[name]``; counts the calls (none: nothing was measured)."""

    def __init__(self, **ms: float) -> None:
        self.seconds = {name.replace("_", "-"): value / 1000 for name, value in ms.items()}
        self.calls = 0

    def __call__(self, name: str, call) -> float:
        self.calls += 1
        return self.seconds[name]


def never(name: str, call) -> float:
    raise AssertionError(f"measured {name}: the figures kept should have been used")


@pytest.fixture()
def export(tiny_artifacts, tmp_path) -> Path:
    """A copy of the tiny export (model.onnx: ort and openvino can run it; openvino-bf16 has no verdict)."""
    return Path(shutil.copytree(tiny_artifacts(seed=0), tmp_path / "export"))


@pytest.fixture(autouse=True)
def user_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the measurement's lock: not in ~/.cache


def _choose(export: Path, timer) -> tuple[str, str]:
    backend, name, why = select_backend(Artifacts.open(export), BackendOptions(threads=1), timer)
    backend.close()
    return name, why


def test_auto_measures_once_keeps_the_figures_and_explains(export):
    timer = FakeTimer(ort=10.0, openvino=5.0)
    name, why = _choose(export, timer)
    assert name == OPENVINO and timer.calls > 0
    assert "openvino-bf16 unavailable (" in why  # no validate-bf16 verdict, or no BF16 math here
    assert "chose openvino, the fastest here: openvino 5.00 ms, ort 10.0 ms (batch 1, measured here)" in why
    kept = json.loads((export / AUTO_CHOICE_NAME).read_text())["machines"]
    (entry,) = kept.values()
    assert entry["chosen"] == OPENVINO and entry["ms"] == {ORT: 10.0, OPENVINO: 5.0} and entry["threads"] == 1
    # the next load takes the kept figures: nothing is timed again
    assert _choose(export, never)[0] == OPENVINO


def test_another_cpu_measures_again_and_keeps_both(export, monkeypatch):
    here = auto_choice.cpu_key()
    _choose(export, FakeTimer(ort=10.0, openvino=5.0))
    monkeypatch.setattr(auto_choice, "cpu_key", lambda: "another-cpu")  # another model, or other flags
    timer = FakeTimer(ort=4.0, openvino=9.0)  # on that CPU ONNX Runtime wins
    assert _choose(export, timer)[0] == ORT and timer.calls > 0
    machines = json.loads((export / AUTO_CHOICE_NAME).read_text())["machines"]
    assert {key: entry["chosen"] for key, entry in machines.items()} == {here: OPENVINO, "another-cpu": ORT}


def test_other_threads_or_another_export_measure_again(export):
    _choose(export, FakeTimer(ort=10.0, openvino=5.0))
    artifacts = Artifacts.open(export)
    timer = FakeTimer(ort=10.0, openvino=5.0)
    backend, _, _ = select_backend(artifacts, BackendOptions(threads=2), timer)
    backend.close()
    assert timer.calls > 0  # the thread count is part of what a figure holds for


def test_predictor_auto_uses_the_kept_choice(export):
    _choose(export, FakeTimer(ort=3.0, openvino=9.0))
    with Predictor.from_artifacts(export, options=BackendOptions(threads=1)) as p:
        assert p.backend_name == ORT and "ort 3.00 ms, openvino 9.00 ms" in p.why


def test_a_fresh_bench_on_this_cpu_is_used_instead_of_measuring(export):
    bench = {
        "created": "2999-01-01T00:00:00+00:00",  # newer than any kept figure
        "environment": {"cpu_key": auto_choice.cpu_key()},
        "settings": {"threads": 1},
        "results": [
            {"backend": ORT, "batch_size": 1, "p50_ms": 7.0},
            {"backend": OPENVINO, "batch_size": 1, "p50_ms": 12.0},
            {"backend": OPENVINO, "batch_size": 8, "p50_ms": 1.0},  # batch 1 only
        ],
    }
    (export / BENCH_REPORT_NAME).write_text(json.dumps(bench))
    name, why = _choose(export, never)
    assert name == ORT and "ort 7.00 ms, openvino 12.0 ms (batch 1, from vitdeploy bench here)" in why
    bench["environment"]["cpu_key"] = "another-cpu"  # a bench taken elsewhere says nothing about this CPU
    (export / BENCH_REPORT_NAME).write_text(json.dumps(bench))
    (export / AUTO_CHOICE_NAME).unlink()
    timer = FakeTimer(ort=10.0, openvino=5.0)
    assert _choose(export, timer)[0] == OPENVINO and timer.calls > 0


def test_bf16_is_a_candidate_only_with_its_passed_verdict(export):
    manifest = json.loads((export / "manifest.json").read_text())
    artifacts = Artifacts.open(export)
    assert auto_choice.gate_refusal(OPENVINO_BF16, artifacts).startswith("the export has no validate-bf16 verdict")
    assert auto_choice.gate_refusal(OPENVINO, artifacts) is None  # its artifact being listed is its gate
    manifest["validation"]["validate-bf16"] = {"passed": False}
    (export / "manifest.json").write_text(json.dumps(manifest))
    assert auto_choice.gate_refusal(OPENVINO_BF16, Artifacts.open(export)) == "missed its gate (validate-bf16)"
    manifest["validation"]["validate-bf16"] = {"passed": True}
    (export / "manifest.json").write_text(json.dumps(manifest))
    assert auto_choice.gate_refusal(OPENVINO_BF16, Artifacts.open(export)) is None


def test_the_candidates_are_the_cpu_backends_but_eager_and_fp16():
    assert auto_choice.cpu_candidates() == (ORT, ORT_INT8, OPENVINO, OPENVINO_INT8, OPENVINO_BF16)


def test_within_the_tie_the_more_precise_wins_never_more_than_the_tie_slower():
    assert auto_choice.fastest({ORT: 10.0, ORT_INT8: 9.8}) == ORT  # 2% is not worth INT8
    assert auto_choice.fastest({ORT: 10.0, ORT_INT8: 9.0}) == ORT_INT8  # 10% is
    assert auto_choice.fastest({ORT_INT8: 9.0, OPENVINO_INT8: 8.9, OPENVINO_BF16: 9.1}) == OPENVINO_BF16
    # the tie is measured from the fastest, never chained: int8 10.0, bf16 10.25, fp32 10.5 -> bf16 (fp32 is 5% off)
    assert auto_choice.fastest({ORT_INT8: 10.0, OPENVINO_BF16: 10.25, ORT: 10.5}) == OPENVINO_BF16


@pytest.mark.parametrize("order", list(itertools.permutations([ORT, ORT_INT8, OPENVINO, OPENVINO_BF16])))
def test_the_tournament_never_picks_one_more_than_5_percent_slower_than_the_fastest(order):
    """The issue's goal, for every order the candidates come in, two open at a time."""
    ms = {ORT: 10.35, ORT_INT8: 10.0, OPENVINO: 10.45, OPENVINO_BF16: 10.2}
    held: list[str] = []

    class Fake:
        def __init__(self, name: str) -> None:
            self.name = name
            held.append(name)
            assert len(held) <= 2, f"more than two backends open: {held}"

        def run(self, batch):
            return batch

        def close(self) -> None:
            held.remove(self.name)

    got = auto_choice.tournament(list(order), Fake, batch=None, timer=lambda name, call: ms[name] / 1000)
    assert got.chosen == auto_choice.fastest(ms) == OPENVINO_BF16 and held == [OPENVINO_BF16]
    assert ms[got.chosen] <= 1.05 * min(ms.values())
    assert got.ms == pytest.approx(ms)  # one scale, whatever the order


def test_a_candidate_that_fails_to_open_is_noted_and_skipped(export, monkeypatch):
    from vitdeploy.runtime.backends.openvino import OpenVinoBackend

    def broken(*args, **kwargs):
        from vitdeploy.base.errors import BackendError

        raise BackendError("openvino: cannot compile (simulated)")

    monkeypatch.setattr(OpenVinoBackend, "__init__", broken)
    name, why = _choose(export, FakeTimer(ort=10.0, openvino=5.0))
    assert name == ORT and "openvino failed (openvino: cannot compile (simulated))" in why
