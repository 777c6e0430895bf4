"""Validation thresholds the tests need: one no graph but eager PyTorch itself can meet."""

#: every drift metric at its limit: max/mean |diff| 0, cosine and agreements 1 (a gate that cannot pass)
IMPOSSIBLE = {
    "max_abs_diff": 0.0,
    "mean_abs_diff": 0.0,
    "min_cosine": 1.0,
    "min_top1_agreement": 1.0,
    "min_top5_overlap": 1.0,
}
