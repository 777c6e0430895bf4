"""The report as one self-contained HTML file: no script, no font, no style or image from anywhere but
the file itself (pictures inline as SVG or data: PNG), readable without JavaScript, printable.

Sections, in order: what to deploy (or, first, that nothing can be); accuracy per backend with the
distribution of its drift over the images; the images whose top-1 changed, each beside eager's and the
backend's top-3; speed on this machine; the serving settings tune chose and where a request's time goes in
the server per load level (serving.py); the artifacts and what the precision autopilots kept in float
or refused; the model, its preprocessing and the machine.
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import io
from pathlib import Path
from typing import Any, Iterable

from ...base.vocab import SIGNATURE_NAME
from .facts import AccuracyRow, Facts
from .recommend import Recommendation, serve_command
from .serving import serving_section

THUMB = 96  # pixels: the flipped images' thumbnails
#: artifact role -> the export's validation of it
VALIDATED_BY = {
    "onnx": "validate-onnx",
    "onnx-ort": "validate-ort-optimized",
    "onnx-fp16": "validate-fp16",
    "onnx-int8": "validate-int8",
    "onnx-int8-trt": "validate-int8-trt",
    "engine": "validate-engine",
    "engine-int8": "validate-engine-int8",
}
#: the accuracy table's metric columns (metric key, header, format), in order; each shown when a judged backend
#: reports it: a classifier's top-1/top-5, an embedding model's recall@k (``k`` beside it) and cosine percentiles
ACCURACY_COLUMNS = (
    ("top1_agreement", "top-1 agreement", ".1%"),
    ("top5_overlap", "top-5 overlap", ".1%"),
    ("recall_at_k", "recall@k (neighbour agreement)", ".1%"),
    ("cosine", "worst cosine", ".6f"),
    ("cosine_p01", "cosine p01 (1st percentile)", ".6f"),
    ("cosine_p50", "cosine p50 (median)", ".6f"),
    ("patch_cosine", "worst patch-token cosine", ".6f"),
    ("patch_cosine_p01", "patch-token cosine p01", ".6f"),
    ("max_abs_diff", "max |diff|", ".4g"),
)
STYLE = """
body{font-family:sans-serif;max-width:60rem;margin:1.5rem auto;padding:0 1rem;color:#111;line-height:1.4}
h1{font-size:1.5rem}h2{font-size:1.2rem;border-bottom:1px solid #999;margin-top:2rem}
table{border-collapse:collapse;margin:.5rem 0;font-size:.9rem}th,td{border:1px solid #bbb;padding:.2rem .5rem;
text-align:left;vertical-align:top}th{background:#eee}.bad{color:#a00;font-weight:bold}.ok{color:#060}
.lead{border:2px solid #a00;padding:.5rem 1rem}.pick{border:2px solid #060;padding:.5rem 1rem}
code{background:#f3f3f3;padding:0 .2rem}figure{margin:.5rem 0}.flip img{image-rendering:pixelated}
.muted{color:#555;font-size:.85rem}.fields{margin:0}.fields th{font-weight:normal}
@media print{h2{break-after:avoid}.flip{break-inside:avoid}}
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _table(head: Iterable[str], rows: Iterable[Iterable[Any]], raw: bool = False) -> str:
    cells = "".join("<tr>" + "".join(f"<td>{c if raw else _e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return "<table><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + f"</tr>{cells}</table>"


def _fmt(value: Any, spec: str = ".4g") -> str:
    if value is None:
        return "-"
    try:
        return format(float(value), spec)
    except (TypeError, ValueError):
        return str(value)


def thumbnail(path: str) -> str | None:
    """A data: URL of the image at ``path`` shrunk to THUMB pixels (PNG); None when it is no readable file."""
    from PIL import Image

    file = Path(path)
    if not file.is_file():
        return None
    try:
        with Image.open(file) as img:
            img = img.convert("RGB")
            img.thumbnail((THUMB, THUMB))
            if min(img.size) < THUMB // 2:  # tiny digits: enlarged so that they can be seen
                scale = THUMB // max(img.size)
                img = img.resize((img.width * max(scale, 1), img.height * max(scale, 1)), Image.NEAREST)
            buf = io.BytesIO()
            img.save(buf, format="PNG")
    except OSError:
        return None
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _deploy(rec: Recommendation, artifacts: str) -> str:
    parts = ["<h2 id='deploy'>What to deploy</h2>"]
    if rec.nothing:
        parts.append(f"<p class='lead'><strong>Nothing can be recommended:</strong> {_e(rec.nothing)}.</p>")
    if rec.picks:
        rows = [
            (
                {
                    "latency": "lowest latency here",
                    "throughput": "highest throughput here",
                    "gpu": "a GPU",
                    "accuracy": "the most accurate",
                    "auto": "the default here (auto)",
                }.get(p.target, p.target),
                f"<strong>{_e(p.backend)}</strong>",
                _e(p.why),
                _e(p.cost),
                f"<code>{_e(serve_command(p.backend, artifacts))}</code>",
            )
            for p in rec.picks
        ]
        parts.append(
            "<div class='pick'>"
            + _table(("target", "backend", "why", "accuracy it costs", "serve it"), rows, raw=True)
            + "</div>"
        )
    parts += [f"<p class='muted'>{_e(n)}</p>" for n in rec.notes]
    return "".join(parts)


def _columns(rows: list[AccuracyRow]) -> list[tuple[str, str, str]]:
    """The accuracy columns whose metric a judged backend reports (the reference row states what it was given,
    not what was measured): a classifier's top-1 agreement, an embedding model's recall@k, each when present."""
    judged = [r for r in rows if r.status != "reference" and r.metrics] or rows
    present = {key for r in judged for key in r.metrics}
    columns = [c for c in ACCURACY_COLUMNS if c[0] in present]
    ks = {_k(r) for r in judged if "recall_at_k" in r.metrics}
    if len(ks) == 1 and None not in ks:  # one k for every backend: it goes in the header
        k = _fmt(ks.pop(), "g")
        columns = [(key, head.replace("@k", f"@{k}"), spec) for key, head, spec in columns]
    return columns


def _k(row: AccuracyRow) -> Any:
    """k of a row's recall@k: its metrics' ``k``, else its thresholds' ``neighbours`` (validation.*.neighbours)."""
    return row.metrics.get("k", row.thresholds.get("neighbours"))


def _metric_cell(row: AccuracyRow, key: str, spec: str, header: str) -> str:
    value = _fmt(row.metrics.get(key), spec)
    if key == "recall_at_k" and "@k" in header and _k(row) is not None:
        value += f" (k={_fmt(_k(row), 'g')})"
    return value


def _accuracy(facts: Facts) -> str:
    from .plots import DRIFT_AXES, drift_distribution

    columns = _columns(facts.accuracy)
    labelled = any(r.accuracy is not None for r in facts.accuracy)
    sized = any(r.image_size is not None for r in facts.accuracy)  # an export for several sizes: a size column
    rows = []
    for r in facts.accuracy:
        verdict = {"passed": "<span class='ok'>passed</span>", "failed": "<span class='bad'>failed</span>"}.get(
            r.status, _e(r.status)
        )
        size = ((f"{r.image_size} px" if r.image_size is not None else "all"),) if sized else ()
        rows.append(
            (_e(r.backend), *size, verdict)
            + tuple(_metric_cell(r, key, spec, head) for key, head, spec in columns)
            + ((_fmt(r.accuracy, ".1%"),) if labelled else ())
            + (_e("; ".join(r.failures) or r.reason),)
        )
    head = (
        "backend",
        *(("size",) if sized else ()),
        "verdict",
        *(h for _, h, _ in columns),
        *(("accuracy (labels)",) if labelled else ()),
        "notes",
    )
    per = {r.label: r.per_image for r in facts.accuracy if r.per_image}
    plots = "".join(
        "<figure>" + drift_distribution(per, metric) + "</figure>"
        for metric in DRIFT_AXES
        if any(v is not None for values in per.values() for v in values.get(metric, []))
    )
    return (
        "<h2 id='accuracy'>Accuracy against eager PyTorch</h2>"
        f"<p class='muted'>From {_e(facts.accuracy_source)}.</p>" + _table(head, rows, raw=True) + plots
    )


def _flips(facts: Facts, images: bool) -> str:
    """Each image whose top-1 class changed; nothing at all where no validation measured a top-1 class (an
    embedding model's: no class, nothing to flip)."""
    judged = [r for r in facts.accuracy if r.status != "reference"]
    if not any(r.flips or "top1_agreement" in r.metrics for r in judged):
        return ""
    parts = ["<h2 id='flips'>Images whose prediction changed</h2>"]
    any_flip = False
    for r in facts.accuracy:
        if not r.flips:
            continue
        any_flip = True
        parts.append(f"<h3>{_e(r.label)}: {len(r.flips)} image(s)</h3>")
        for f in r.flips:
            src = thumbnail(f["input"]) if images else None
            pic = (
                f"<img src='{src}' alt='{_e(Path(f['input']).name)}' width='{THUMB}' height='{THUMB}'>"
                if src
                else "<span class='muted'>"
                + ("(not shown: --no-images)" if not images else "(no image file)")
                + "</span>"
            )
            tops = _table(
                ("eager PyTorch", "p", _e(r.label), "p"),
                [
                    (_e(a[0]), _fmt(a[1], ".3f"), _e(b[0]), _fmt(b[1], ".3f"))
                    for a, b in zip(f.get("reference", []), f.get("candidate", []))
                ],
                raw=True,
            )
            parts.append(
                f"<div class='flip'><p><code>{_e(f['input'])}</code></p>"
                f"<table><tr><td>{pic}</td><td>{tops}</td></tr></table></div>"
            )
    if not any_flip:
        parts.append("<p>No backend changed the top-1 class of any image.</p>")
    return "".join(parts)


def _speed(facts: Facts) -> str:
    from .plots import latency_by_batch

    parts = ["<h2 id='speed'>Speed on this machine</h2>"]
    bench = facts.bench
    if not bench or not bench.get("results"):
        parts.append(
            "<p>Not measured yet: <code>vitdeploy bench -a "
            f"{_e(facts.artifacts)}</code> saves its figures beside the manifest, or "
            f"<code>vitdeploy report -a {_e(facts.artifacts)} --bench auto</code> runs a short one.</p>"
        )
        return "".join(parts)
    env = bench.get("environment", {})
    window = env.get("contention") or {}
    rows = [
        (
            r["backend"],
            r["batch_size"],
            _fmt(r["p50_ms"], ".3f"),
            _fmt(r["p90_ms"], ".3f"),
            _fmt(r["images_per_s"], ".1f"),
            (_fmt(r.get("speedup_vs_torch_cpu"), ".2f") + "x") if r.get("speedup_vs_torch_cpu") else "-",
            "; ".join(r.get("speedup_unreliable") or []) or "-",
        )
        for r in bench["results"]
    ]
    parts.append(
        _table(("backend", "batch", "p50 ms", "p90 ms", "images/s", "vs eager", "flagged unreliable"), rows)
        + "<figure>"
        + latency_by_batch(bench["results"])
        + "</figure>"
        + f"<p class='muted'>{_e(bench.get('created', ''))}; threads {_e(env.get('threads_requested', '?'))}; "
        + (
            f"contention while timed: other processes took {_fmt(window.get('competing_cores'), '.2f')} of "
            f"{_e(window.get('cores', '?'))} cores"
            if window
            else "contention: unknown"
        )
        + "</p>"
    )
    return "".join(parts)


def _artifacts(facts: Facts) -> str:
    m = facts.manifest
    validation = m.get("validation") or {}
    rows = []
    for role, entry in (m.get("artifacts") or {}).items():
        verdict = validation.get(VALIDATED_BY.get(role, ""), {})
        rows.append(
            (
                role,
                entry.get("path"),
                f"{entry.get('bytes', 0) / 1e6:.2f} MB",
                str(entry.get("sha256", ""))[:12],
                ("passed" if verdict.get("passed") else "failed") if verdict else "-",
            )
        )
    export = m.get("export") or {}
    notes = []
    for key in ("fp16", "int8", "int8_tensorrt"):
        rec = export.get(key)
        if not isinstance(rec, dict):
            continue
        kept = rec.get("keep_float") or rec.get("kept_hot_nodes") or []
        line = f"{key}: {len(kept)} node(s) kept in float"
        if rec.get("autopilot"):
            line += f" (autopilot, {len(rec['autopilot'])} step(s), last: {rec['autopilot'][-1].get('step', '?')})"
        speed = rec.get("speed") or {}
        if speed:
            line += f"; speed {speed.get('speedup', '?')}x its source (needs {speed.get('min_speedup', '?')}x)"
        if rec.get("shipped") is False:
            line += "; not shipped"
        notes.append(line)
    for r in export.get("refused") or []:
        notes.append(f"refused: {r.get('stage')}: {r.get('reason', '')}")
    for s in m.get("stages") or []:
        if s.get("status") in ("skipped", "failed") and s.get("reason"):
            notes.append(f"{s['name']} {s['status']}: {s['reason']}")
    return (
        "<h2 id='artifacts'>Artifacts</h2>"
        + _table(("role", "file", "size", "sha256", "validated"), rows)
        + "".join(f"<p class='muted'>{_e(n)}</p>" for n in notes)
    )


def _signature(facts: Facts) -> str:
    """Who signed what (model.sig, `vitdeploy sign`), and whether this report checked it."""
    sig = facts.signature
    head = "<h2 id='signature'>Signature</h2>"
    if sig is None:
        return (
            head + f"<p class='muted'>Unsigned: no {SIGNATURE_NAME} (`vitdeploy sign EXPORT --key PRIVATE.pem`).</p>"
        )
    verdict = {True: "verified", False: "REFUSED", None: "not verified"}[sig.get("verified")]
    files = sig.get("files") or []
    rows = [
        ("signed by", sig.get("signer", "?")),
        ("signed at", f"{sig.get('signed_at', '?')} (the signature file's time)"),
        ("covers", f"{len(files)} file(s), {sig.get('algorithm', '?')}: " + ", ".join(files)),
        ("not covered", ", ".join(sig.get("ignored") or []) or "-"),
        (verdict, sig.get("why", "")),
    ]
    return head + _table((SIGNATURE_NAME, ""), rows)


def _fields(value: Any) -> str:
    """A value as a reader reads it (HTML): a mapping as one row per key, a list one item a line, never a repr."""
    if isinstance(value, dict):
        if not value:
            return "-"
        rows = "".join(f"<tr><th>{_e(k)}</th><td>{_fields(v)}</td></tr>" for k, v in value.items())
        return f"<table class='fields'>{rows}</table>"
    if isinstance(value, (list, tuple)):
        return "<br>".join(_fields(v) for v in value) if value else "none"
    return "-" if value is None else _e(value)


def _model(facts: Facts) -> str:
    m = facts.manifest
    model = m.get("model") or {}
    vit = model.get("vit") or {}
    pre = m.get("preprocess") or {}
    origins = m.get("preprocess_origins") or {}
    return (
        "<h2 id='model'>Model, preprocessing, machine</h2>"
        + _table(
            ("model", ""),
            [
                (_e(k), _fields(v))
                for k, v in (("name", m.get("name")), ("source", model.get("source")), ("created", m.get("created")))
            ],
            raw=True,
        )
        + _table(("ViT", "value"), sorted(vit.items()))
        + _table(("preprocessing", "value", "from"), [(k, v, origins.get(k, "")) for k, v in pre.items()])
        + _table(("library", "version"), sorted((m.get("versions") or {}).items()))
        + _table(("machine (this report)", ""), sorted(facts.machine.items()))
    )


def render(facts: Facts, rec: Recommendation, images: bool = True) -> str:
    name = facts.manifest.get("name", "model")
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    body = "".join(
        (
            f"<h1>{_e(name)}: which backend to deploy</h1>",
            f"<p class='muted'>vitdeploy report of {_e(facts.artifacts)}, {_e(now)}.</p>",
            _deploy(rec, str(facts.artifacts)),
            _accuracy(facts),
            _flips(facts, images),
            _speed(facts),
            serving_section(facts),
            _artifacts(facts),
            _signature(facts),
            _model(facts),
        )
    )
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        "<meta http-equiv='Content-Security-Policy' "
        "content=\"default-src 'none'; img-src data:; style-src 'unsafe-inline'\">"
        f"<title>{_e(name)}: vitdeploy report</title><style>{STYLE}</style></head><body>{body}</body></html>"
    )


__all__ = ["render", "thumbnail"]
