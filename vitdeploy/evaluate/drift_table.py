"""The drift report as people read it (`vitdeploy validate`'s table): the set, the reference, one row per
backend (and size), then the failures, the flipped images and the verdict."""

from __future__ import annotations

from .drift_report import BackendDrift, DriftReport


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    if value == 0:
        return "0"
    return f"{value:.3g}" if abs(value) >= 1e-3 else f"{value:.2e}"


def _cos(value: float | None) -> str:
    return "-" if value is None else f"{value:.8f}"


def _neighbours(report: DriftReport) -> int:
    """k of the neighbour agreement (the fp32 thresholds' ``neighbours``)."""
    return int(report.thresholds.get("fp32", {}).get("neighbours", 10))


def _size_cell(report: DriftReport, b: BackendDrift | None = None) -> str:
    """The size column of a report on an export for several sizes ("" for a fixed-size export's): the row's
    side, "all" for a row of every size (a backend that cannot run here), the header without a row."""
    if not report.image_sizes:
        return ""
    if b is None:
        return f"{'size':>5} "
    return f"{'all' if b.image_size is None else b.image_size:>5} "


def _reference_accuracy(report: DriftReport) -> str:
    per_size = report.reference.get("per_size")
    if not per_size:
        return _pct(report.reference["accuracy"])
    return ", ".join(f"{_pct(v.get('accuracy'))} at {k} px" for k, v in per_size.items())


def format_drift_table(report: DriftReport) -> list[str]:
    """The human-readable report: the set, the reference, one row per backend (and size), then details."""
    img = report.images
    labels = {"none": "no labels", "sub-folders": "labels from sub-folder names"}.get(
        img["label_source"], f"labels from {img['label_source'].removeprefix('csv:')}"
    )
    lines = [
        f"validation set: {img['evaluated']} image(s) from {img['source']} ({labels}, {img['labelled']} labelled, "
        f"{len(img['unreadable'])} unreadable)",
        f"reference: eager PyTorch fp32 on cpu ({report.reference['describe']}), accuracy "
        f"{_reference_accuracy(report)}",
        "",
    ]
    embedding = any("recall_at_k" in b.metrics for b in report.backends)
    if embedding:
        lines[1] = f"reference: eager PyTorch fp32 on cpu ({report.reference['describe']}); an embedding model"
    patches = any("patch_cosine" in b.metrics for b in report.backends)
    head = f"{'backend':<11} {_size_cell(report)}{'prec':<5} {'max|diff|':>9} {'mean|diff|':>10} {'cosine':>10} " + (
        f"{'cos p1':>10} {'recall@' + str(_neighbours(report)):>9}"
        + (f" {'patch cos':>10}" if patches else "")
        + "  result"
        if embedding
        else f"{'top1':>7} {'top5':>7} {'flipped':>7} {'accuracy':>8}  result"
    )
    lines += [head, "-" * len(head)]
    for b in report.backends:
        if not b.ran:
            lines.append(
                f"{b.name:<11} {_size_cell(report, b)}{b.precision:<5} "
                f"{b.status.upper() if b.status == 'error' else b.status}: {b.reason}"
            )
            continue
        m = b.metrics
        result = "reference" if b.status == "reference" else ("PASS" if b.status == "passed" else "FAIL")
        if b.threshold_set and b.status != "reference":
            result += f" ({b.threshold_set} thresholds)"
        judged = (
            f"{_cos(m.get('cosine_p01')):>10} {_pct(m.get('recall_at_k')):>9}"
            + (f" {_cos(m.get('patch_cosine')):>10}" if patches else "")
            if embedding
            else f"{_pct(m.get('top1_agreement')):>7} {_pct(m.get('top5_overlap')):>7} {len(b.flipped):>7} "
            f"{_pct(b.accuracy):>8}"
        )
        lines.append(
            f"{b.name:<11} {_size_cell(report, b)}{b.precision:<5} {_num(m.get('max_abs_diff')):>9} "
            f"{_num(m.get('mean_abs_diff')):>10} {_cos(m.get('cosine')):>10} {judged}  {result}"
        )
    details = []
    for b in report.backends:
        for failure in b.failures:
            details.append(f"  {b.where} FAIL {failure}")
        for flip in b.flipped:
            truth = f", true {flip['label']}" if flip["label"] is not None else ""
            details.append(
                f"  {b.where} top-1 flipped: {flip['path']} ({flip['reference']} -> {flip['candidate']}{truth})"
            )
    for bad in img["unreadable"]:
        details.append(f"  unreadable: {bad['error']}")
    if img.get("unknown_labels"):
        details.append(f"  labels that are no class of the model (left out of accuracy): {img['unknown_labels'][:10]}")
    if details:
        lines += [""] + details
    lines.append("")
    ran = list(dict.fromkeys(b.name for b in report.backends if b.ran))
    verdict = "PASSED" if report.passed else f"FAILED ({', '.join(b.where for b in report.failed)})"
    sizes = f" at {', '.join(map(str, report.image_sizes))} px" if report.image_sizes else ""
    lines.append(
        f"{verdict}: {len(ran)} backend(s) ran{sizes}, {len(report.unavailable)} unavailable here"
        + (f"; report: {report.report_path}" if report.report_path else "")
    )
    return lines


__all__ = ["format_drift_table"]
