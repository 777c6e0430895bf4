"""`vitdeploy report`: one self-contained HTML page that shows every backend's accuracy and speed here and
says what to deploy.

    path, rec, facts = write_report("artifacts/")                 # artifacts/report.html
    path, rec, facts = write_report("artifacts/", bench="auto")   # a short benchmark first if none is saved

facts.py gathers (manifest, drift report, bench report, tune's and loadtest's results), recommend.py decides,
plots.py draws (matplotlib: the ``[report]`` extra), page.py writes the HTML (serving.py and serving_stages.py
its serving section).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ...base.errors import ConfigError
from ...base.vocab import REPORT_NAME


def write_report(
    artifacts: str | os.PathLike[str],
    out: str | os.PathLike[str] | None = None,
    *,
    bench: str = "skip",
    images: bool = True,
    bench_runner: Any = None,
    public_key: str | os.PathLike[str] | None = None,
) -> tuple[Path, Any, Any]:
    """Write the report of the export in ``artifacts`` to ``out`` (default ``artifacts/report.html``).

    ``bench``: "skip" (use a saved bench report if there is one), "auto" (run a short benchmark here when
    none is saved, and save it), or the path of a bench report JSON. Returns (the page's path, the
    Recommendation, the Facts it was made from). ``public_key``: the signature's section says whether that key
    signed the export (else: who signed, not checked)."""
    from ...base._files import write_bytes_atomic
    from ...base.vocab import BENCH_REPORT_NAME
    from .facts import gather
    from .page import render
    from .recommend import recommend

    folder = Path(artifacts)
    given = None
    if bench not in ("skip", "auto"):
        path = Path(bench)
        try:
            given = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"--bench {path}: not a readable bench report ({exc})") from None
    elif bench == "auto" and not (folder / BENCH_REPORT_NAME).is_file():
        given = (bench_runner or short_bench)(folder)
    facts = gather(folder, given, Path(public_key) if public_key is not None else None)
    rec = recommend(facts.candidates(), facts.auto_pick())
    target = Path(out) if out else folder / REPORT_NAME
    write_bytes_atomic(target, render(facts, rec, images=images).encode("utf-8"))
    return target, rec, facts


def short_bench(folder: Path) -> dict[str, Any]:
    """A short benchmark of every backend here (batch 1 and 8), saved beside the manifest."""
    from ...base.vocab import BENCH_REPORT_NAME
    from ..bench import run_bench

    report = run_bench(folder, batch_sizes="1,8", iterations=10, warmup=2)
    data = report.to_dict()
    save_bench(folder / BENCH_REPORT_NAME, data)
    return data


def save_bench(path: Path, data: dict[str, Any]) -> None:
    from ...base._files import write_json_atomic

    write_json_atomic(path, data)


__all__ = ["REPORT_NAME", "save_bench", "short_bench", "write_report"]
