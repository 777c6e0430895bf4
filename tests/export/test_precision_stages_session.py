"""The INT8 graph is judged as ``ort-int8`` runs it: the int8 row's gate and its autopilot's judge open ONNX
Runtime with the placement's session settings (export/precision_stages.py), not a plain session."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vitdeploy.export import precision_stages
from vitdeploy.export.quantize import ORT_CPU
from vitdeploy.runtime.backends import ort as ort_backend


@pytest.fixture
def opened(monkeypatch):
    calls = []

    class Recording:
        def __init__(self, path, *args, **kwargs):
            calls.append(kwargs.get("session_config", ()))

        def close(self):
            pass

    monkeypatch.setattr(ort_backend, "OrtBackend", Recording)
    return calls


def test_the_int8_gate_opens_the_graph_with_ort_int8s_session_settings(opened, tmp_path):
    ctx = SimpleNamespace(chw=(3, 32, 32))
    made = (SimpleNamespace(path=tmp_path / "model.int8.onnx"),)

    precision_stages.INT8.gate.open(ctx, made)
    precision_stages.FP16.gate.open(ctx, made)

    assert ORT_CPU.session_config and opened == [ORT_CPU.session_config, ()]


def test_the_int8_judge_opens_each_candidate_with_them_too(opened, tmp_path):
    ctx = SimpleNamespace(chw=(3, 32, 32))
    judge = precision_stages._Judge(ctx, "ort-int8", SimpleNamespace(model_dump=dict), None, ORT_CPU.session_config)
    judge.witnesses = []  # nothing failed before: no look at a few inputs, nothing run

    assert judge.disproves(tmp_path / "model.int8.onnx") is None
    assert opened == []  # nothing to prove: no session opened
    judge.witnesses = [0]
    judge._proof = lambda backend: None
    judge.disproves(tmp_path / "model.int8.onnx")
    assert opened == [ORT_CPU.session_config]
