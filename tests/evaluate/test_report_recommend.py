"""What `vitdeploy report` recommends (vitdeploy/evaluate/report/recommend.py), from candidates built by hand."""

from __future__ import annotations

from vitdeploy.evaluate.report.recommend import Candidate, recommend

TORCH = Candidate("torch", True, reference=True, latency_ms=5.0, images_per_s=200.0)


def _picks(rec) -> dict[str, str]:
    return {p.target: p.backend for p in rec.picks}


def test_a_backend_that_fails_its_thresholds_is_never_recommended_however_fast():
    rec = recommend(
        [
            TORCH,
            Candidate("ort", True, 1.0, 0.99999, 1e-5, latency_ms=2.0, images_per_s=900.0),
            Candidate("ort-int8", False, 0.90, 0.98, 2.0, latency_ms=0.5, images_per_s=4000.0),
        ]
    )
    assert _picks(rec) == {"latency": "ort", "throughput": "ort"} and not rec.nothing
    assert any("ort-int8" in n and "failed" in n for n in rec.notes)


def test_a_tie_goes_to_the_more_accurate_backend():
    fp16 = Candidate("ort-fp16", True, 0.99, 0.9999, 0.01, latency_ms=2.00, images_per_s=1000.0)
    fp32 = Candidate("ort", True, 1.00, 1.0, 1e-6, latency_ms=2.04, images_per_s=985.0)  # within 3%
    assert _picks(recommend([TORCH, fp16, fp32])) == {"latency": "ort", "throughput": "ort"}
    slower = Candidate("ort", True, 1.00, 1.0, 1e-6, latency_ms=2.5, images_per_s=800.0)  # not a tie
    assert _picks(recommend([TORCH, fp16, slower])) == {"latency": "ort-fp16", "throughput": "ort-fp16"}


def test_the_latency_and_the_throughput_pick_may_differ():
    small = Candidate("ort", True, latency_ms=1.0, images_per_s=900.0)
    big = Candidate("ort-int8", True, 0.99, latency_ms=1.5, images_per_s=2000.0)
    assert _picks(recommend([TORCH, small, big])) == {"latency": "ort", "throughput": "ort-int8"}


def test_nothing_passed_is_said_first_and_nothing_is_picked():
    rec = recommend([TORCH, Candidate("ort", False, 0.5), Candidate("ort-fp16", False, 0.6)])
    assert rec.picks == [] and "no backend passed" in rec.nothing and "ort, ort-fp16" in rec.nothing


def test_a_validated_engine_is_the_gpu_pick_and_without_speed_the_most_accurate_is_named():
    rec = recommend(
        [
            TORCH,
            Candidate("ort", True, 1.0, 1.0, 1e-6),
            Candidate("ort-fp16", True, 0.99, 0.999, 0.01),
            Candidate("trt", True, 0.99, 0.999, 0.02, gpu=True),
        ]
    )
    assert _picks(rec) == {"accuracy": "ort", "gpu": "trt"}
    assert any("vitdeploy bench" in n for n in rec.notes)
    assert "gpu" not in _picks(recommend([TORCH, Candidate("ort", True, latency_ms=1.0)]))


def test_what_auto_runs_here_is_recommended_with_its_figures_when_it_passed():
    ort = Candidate("ort", True, latency_ms=2.0)
    ov = Candidate("openvino-int8", True, 0.99, latency_ms=1.2)
    figures = "openvino-int8 1.2 ms, ort 2.0 ms (batch 1, measured here)"
    rec = recommend([TORCH, ort, ov], ("openvino-int8", figures))
    (pick,) = [p for p in rec.picks if p.target == "auto"]
    assert pick.backend == "openvino-int8" and figures in pick.why and "top-1 agreement 99.0%" in pick.cost
    failed = Candidate("openvino-int8", False, 0.5, latency_ms=1.2)  # judged since: never recommended
    assert "auto" not in _picks(recommend([TORCH, ort, failed], ("openvino-int8", figures)))
