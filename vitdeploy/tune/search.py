"""`vitdeploy tune`'s search: coordinate descent over a target's settings, within a time budget.

From the config's own settings (measured first: the figure to beat), each knob in turn (space.SERVE_KNOBS:
backend, layout, concurrent calls, batch size, batch wait, decode threads; space.TRITON_KNOBS: instances,
preprocessing instances, queue delay) is set to each of its values with the others at the best so far; the best
of them stays. A second pass starts over from the new
best while the first one changed something. A candidate measured once is never measured again, in-place
changes (batch settings, replica count; Triton's model reloads) cost seconds and the budget is checked before every
measurement:
when it runs out, or on Ctrl-C, the search stops and the best so far stands.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, Sequence

from ..client.protocols import PREDICT, V2_HTTP, Target, asked_outputs
from .measure import Figure, measure_candidate
from .space import SERVE_KNOBS, TRITON_KNOBS, ServeCandidate, TritonCandidate, neighbours, triton_neighbours

Progress = Callable[[str], None]
DONE, BUDGET, TRIALS, INTERRUPTED = "done", "budget", "trials", "interrupted"


class _OutOfBudget(Exception):
    pass


class _OutOfTrials(Exception):
    pass


@dataclass
class Trial:
    candidate: Any  # a ServeCandidate or a TritonCandidate
    figure: Figure
    how: str  # started | in place | replicas replaced
    knob: str  # the knob this trial varied ("defaults" for the first)
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "knob": self.knob,
            "how": self.how,
            "settings": self.candidate.describe(),
            **self.candidate.to_dict(),
            **self.figure.to_dict(),
        }


@dataclass
class TuneResult:
    target: str
    slo_p99_ms: Optional[float]
    budget_s: float
    cores: int
    trials: list[Trial] = field(default_factory=list)
    default: Optional[Trial] = None
    best: Optional[Trial] = None
    stopped: str = DONE
    seconds: float = 0.0

    @property
    def gain(self) -> Optional[float]:
        """The best throughput over the defaults' (under the same objective), or None."""
        if not self.best or not self.default or self.default.figure.throughput <= 0:
            return None
        return self.best.figure.throughput / self.default.figure.throughput

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": "vitdeploy-tune",
            "target": self.target,
            "slo_p99_ms": self.slo_p99_ms,
            "objective": objective_text(self.slo_p99_ms),
            "budget_s": self.budget_s,
            "seconds": round(self.seconds, 1),
            "stopped": self.stopped,
            "cores": self.cores,
            "default": self.default.to_dict() if self.default else None,
            "best": self.best.to_dict() if self.best else None,
            "gain_over_default": round(self.gain, 4) if self.gain else None,
            "trials": [t.to_dict() for t in self.trials],
        }


def objective_text(slo_p99_ms: Optional[float]) -> str:
    if slo_p99_ms is not None:
        return f"the highest throughput whose p99 <= {slo_p99_ms:g} ms"
    return "the highest throughput whose p99 is within 2x its p50 (no --slo-p99-ms given)"


def search(
    target: Any,
    images: Sequence[bytes],
    start: Any,
    *,
    knobs: Sequence[str],
    neighbours: Callable[[Any, str], Iterable[Any]],
    start_clients: Callable[[Any], int],
    protocol: str,
    name: str,
    budget_s: float,
    cores: int,
    slo_p99_ms: Optional[float] = None,
    level_s: float = 2.0,
    passes: int = 2,
    max_trials: Optional[int] = None,
    progress: Progress = lambda _: None,
    measure_fn: Callable[..., Figure] = measure_candidate,
) -> TuneResult:
    """Coordinate descent from ``start`` over ``knobs`` on ``target`` (anything with ``apply(candidate) -> how``,
    ``url`` and ``name``); a candidate has ``describe()``, ``to_dict()`` and is hashable. Ctrl-C and the budget
    end it with the best so far, as does ``max_trials`` measured candidates.
    ``measure_fn``: measure.measure_candidate."""
    t0 = time.monotonic()
    deadline = t0 + budget_s
    result = TuneResult(name, slo_p99_ms, budget_s, cores)
    seen: dict[Any, Trial] = {}

    outputs = asked_outputs(getattr(target, "artifacts_dir", getattr(target, "artifacts", None)))

    def run(cand: Any, knob: str) -> Trial:
        if cand in seen:
            return seen[cand]
        if max_trials is not None and len(result.trials) >= max_trials:
            raise _OutOfTrials
        typical = sorted(t.seconds for t in result.trials)[len(result.trials) // 2] if result.trials else 0.0
        if time.monotonic() + typical > deadline:  # one more would end past the budget: stop within it
            raise _OutOfBudget
        began = time.monotonic()
        how = target.apply(cand)
        figure = measure_fn(
            Target(target.url, protocol, target.name, outputs=outputs),
            images,
            start_clients=start_clients(cand),
            level_s=level_s,
            slo_p99_ms=slo_p99_ms,
            warmup_s=min(1.0, level_s),
            stop=lambda: time.monotonic() >= deadline,
        )
        if not figure.complete and not figure.best:  # cut by the budget before it said anything
            raise _OutOfBudget
        trial = seen[cand] = Trial(cand, figure, how, knob, time.monotonic() - began)
        result.trials.append(trial)
        progress(_line(len(result.trials), trial, time.monotonic() - t0, budget_s))
        return trial

    try:
        best = result.default = result.best = run(start, "defaults")
        for _ in range(passes):
            before = best
            for knob in knobs:
                for cand in neighbours(best.candidate, knob):
                    trial = run(cand, knob)
                    if trial.figure.sort_key() > best.figure.sort_key():
                        best = result.best = trial
            if best is before:
                break
    except _OutOfBudget:
        result.stopped = BUDGET
    except _OutOfTrials:
        result.stopped = TRIALS
    except KeyboardInterrupt:
        result.stopped = INTERRUPTED
    result.seconds = time.monotonic() - t0
    return result


def search_serve(
    target: Any,
    images: Sequence[bytes],
    start: ServeCandidate,
    *,
    cores: int,
    max_batch: int,
    backends: tuple[str, ...],
    budget_s: float,
    **kwargs: Any,
) -> TuneResult:
    """:func:`search` over the serve settings (space.SERVE_KNOBS), measured over ``POST /predict``."""
    return search(
        target,
        images,
        start,
        knobs=SERVE_KNOBS,
        neighbours=lambda cand, knob: neighbours(cand, knob, cores, max_batch, backends),
        start_clients=start_clients,
        protocol=PREDICT,
        name="serve",
        budget_s=budget_s,
        cores=cores,
        **kwargs,
    )


def search_triton(
    target: Any, images: Sequence[bytes], start: TritonCandidate, *, budget_s: float, **kwargs: Any
) -> TuneResult:
    """:func:`search` over the Triton repository's settings (space.TRITON_KNOBS), measured over KServe v2 HTTP."""
    return search(
        target,
        images,
        start,
        knobs=TRITON_KNOBS,
        neighbours=triton_neighbours,
        start_clients=lambda cand: max(1, cand.instances * 4),
        protocol=V2_HTTP,
        name="triton",
        budget_s=budget_s,
        cores=start.cores,
        **kwargs,
    )


def start_clients(cand: ServeCandidate) -> int:
    """Enough clients to fill half of every batch the candidate can run at once."""
    return max(1, cand.replicas * cand.concurrent_batches * max(1, cand.max_batch_size // 2))


def _line(n: int, trial: Trial, elapsed: float, budget: float) -> str:
    f = trial.figure
    best = f.best
    figure = (
        f"{f.throughput:.1f} req/s, p99 {best.percentile(99):.0f} ms"
        if best
        else f"none acceptable ({f.peak:.1f} req/s peak)"
    )
    spent = f"{trial.how}, {trial.seconds:.0f} s; {elapsed:.0f}/{budget:.0f} s"
    return f"[{n}] {trial.candidate.describe()}: {figure} ({spent})"


__all__ = [
    "Trial",
    "TuneResult",
    "search",
    "search_serve",
    "search_triton",
    "objective_text",
    "DONE",
    "BUDGET",
    "TRIALS",
    "INTERRUPTED",
]
