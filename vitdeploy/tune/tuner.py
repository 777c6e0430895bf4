"""`vitdeploy tune`: which backends may be served, the search on this machine, and what it writes.

Only backends that passed validation are considered: the rows of `vitdeploy validate`'s drift report, else the
export's own validations (evaluate/report/facts.py, the same rows the report shows), that can run here (a CUDA
backend needs a GPU). ``--backend`` (or ``runtime.backend``) other than auto narrows them to one, and a backend
that failed is refused by name.
"""

from __future__ import annotations

import signal
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from ..base.errors import ConfigError
from ..base.vocab import AUTO, ORT, ORT_FP16, RUNTIME_BACKENDS
from ..client.loadtest import load_images
from ..evaluate.reliability import usable_cores
from .search import TuneResult, search_serve, search_triton
from .space import default_candidate, default_triton_candidate

Progress = Callable[[str], None]
TARGETS = ("serve", "triton")


@dataclass(frozen=True)
class TunePlan:
    artifacts: Path
    target: str = "serve"
    slo_p99_ms: Optional[float] = None
    budget_s: float = 600.0
    backend: str = AUTO
    images: Optional[Path] = None
    out: Path = Path("tuned.yaml")
    level_s: float = 2.0
    max_trials: Optional[int] = None


def servable_backends(artifacts: Path, requested: str, options: Any) -> tuple[str, ...]:
    """The backends tune may serve: passed validation, run here; ``requested`` (not auto) narrows to one."""
    from ..evaluate.report.facts import gather
    from ..runtime.artifacts import Artifacts
    from ..runtime.backends import backend_unavailable_reason

    facts = gather(artifacts)
    opened = Artifacts.open(artifacts)
    rows = {r.backend: r for r in facts.per_backend() if r.deployable}  # failed at any size: failed
    passed = [n for n in RUNTIME_BACKENDS if n in rows and rows[n].status in ("reference", "passed")]
    if requested != AUTO:
        row = rows.get(requested)
        if row is not None and row.status not in ("reference", "passed"):
            raise ConfigError(
                f"backend {requested} did not pass validation ({facts.accuracy_source}: {row.status}); tune serves "
                f"only what passed: {', '.join(passed) or 'none'}"
            )
        passed = [requested]
    runnable = [n for n in passed if backend_unavailable_reason(n, opened, options) is None]
    if not runnable:
        raise ConfigError(
            f"{artifacts}: no backend that passed validation can run here (passed: {', '.join(passed) or 'none'}); "
            "run `vitdeploy validate`, or export again"
        )
    from ..runtime.predictor import AUTO_ORDER, cuda_provider_available

    # what `vitdeploy serve` would run by default first (auto: ort-fp16 only with CUDA), then the others
    first = [n for n in AUTO_ORDER if n in runnable and (n != ORT_FP16 or cuda_provider_available())]
    return tuple(first[:1] + [n for n in runnable if n not in first[:1]])


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM ends the search as Ctrl-C does: the server stops, the best so far is written."""

    def raise_interrupt(*_: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_tune(cfg: Any, plan: TunePlan, options: Any, progress: Progress = lambda _: None) -> TuneResult:
    """Search the serving settings of ``plan.artifacts`` on this machine; the server is stopped whatever happens."""
    if plan.target not in TARGETS:
        raise ConfigError(f"--target {plan.target!r}: expected one of {', '.join(TARGETS)}")
    if plan.budget_s <= 0:
        raise ConfigError(f"--budget must be positive, got {plan.budget_s:g} s")
    images = load_images(plan.images)
    cores = usable_cores()
    common = dict(
        budget_s=plan.budget_s,
        slo_p99_ms=plan.slo_p99_ms,
        level_s=plan.level_s,
        max_trials=plan.max_trials,
        progress=progress,
    )
    if plan.target == "triton":
        return _tune_triton(cfg, plan, options, images, cores, common)
    from ..runtime.artifacts import Artifacts
    from .serve_target import ServeTarget

    backends = servable_backends(plan.artifacts, plan.backend, options)
    max_batch = int(Artifacts.open(plan.artifacts).manifest.get("batch", {}).get("max", 32) or 32)
    start = default_candidate(cfg.serve, cores, backends[0])
    progress(
        f"tuning serve on {cores} cores: backends {', '.join(backends)} (passed validation), budget "
        f"{plan.budget_s / 60:.1f} min, {len(images)} image(s)"
    )
    with _sigterm_as_interrupt(), ServeTarget(cfg, plan.artifacts, options) as target:
        return search_serve(target, images, start, cores=cores, max_batch=max_batch, backends=backends, **common)


def _tune_triton(cfg: Any, plan: TunePlan, options: Any, images: list, cores: int, common: dict) -> TuneResult:
    """The bundled tritonserver, the repository's inference on vitdeploy's ONNX Runtime (the ``ort`` backend,
    which must have passed validation)."""
    from .triton_target import TritonTarget

    if plan.backend not in (AUTO, ORT):
        raise ConfigError(
            f"--target triton runs the ort backend on the bundled tritonserver; -b {plan.backend} cannot"
        )
    servable_backends(plan.artifacts, ORT, options)  # refused by name unless ort passed validation
    start = default_triton_candidate(cfg.triton, cores)
    progress = common["progress"]
    progress(f"tuning the Triton repository on {cores} cores (ort_python), budget {plan.budget_s / 60:.1f} min")
    with _sigterm_as_interrupt(), TritonTarget(cfg, plan.artifacts) as target:
        return search_triton(target, images, start, **common)


__all__ = ["TunePlan", "run_tune", "servable_backends", "TARGETS"]
