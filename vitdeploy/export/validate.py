"""Stage: run an exported artifact through a runtime backend and judge it against eager PyTorch.

The artifact is executed by the same backend classes ``vitdeploy predict`` uses, at batch 1, at
a batch > 1 that is not a power of two, and at the profile's max batch, so "validated" means
validated with the code users run.

What each run proves, and so what it costs: every input runs at the largest batch size and is judged
against the reference (every input's logits within the thresholds). The smaller sizes prove batch
invariance, which a sample shows as well as every input does (a graph wrong at batch 1 is wrong for
any image at batch 1): :data:`SAMPLE` inputs spread over the set (real images and noise), at least
two whole batches and a ragged tail of each size, run there. Each size is judged twice: the sample's
logits replace those rows of the largest batch's and the whole set is judged against the reference
with the same thresholds (the report's metrics are those of all inputs, as before), and the sample
must stay within ``max_abs_diff`` of its own rows at the largest batch (as close to itself as it may
be to the reference; batched kernels only sum in another order) -- so what the largest batch proved
for every input holds at every size.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..base.errors import InputError
from .compare import Comparison, compare, flip_details, per_image

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ValidationInputs:
    batch: np.ndarray  # (N, C, H, W) float32, preprocessed
    names: tuple[str, ...]  # image paths, or "noise:<i>"

    @property
    def image_count(self) -> int:
        """How many of the inputs are real images (the rest is seeded noise)."""
        return sum(not n.startswith("noise:") for n in self.names)


def validation_batch_sizes(max_batch: int) -> tuple[int, ...]:
    """1, a non-power-of-two > 1, and the profile max (deduplicated, each <= max_batch)."""
    odd = 3 if max_batch >= 3 else max_batch
    return tuple(sorted({1, odd, max_batch}))


def build_inputs(
    preprocessor: Any, images: Sequence[Path], *, noise_samples: int, seed: int, min_count: int
) -> ValidationInputs:
    """Real images (through the shared preprocessing) plus seeded noise images.

    Noise images are random RGB pixels pushed through the same preprocessing, so they stay in
    the input distribution's range. More noise is added until there are ``min_count`` rows.
    """
    batch, good, errors = preprocessor.batch_tolerant(list(images)) if images else (None, [], {})
    for index, message in errors.items():
        log.warning("validation image skipped: %s", message)
    rows = [batch] if batch is not None and len(good) else []
    names = [str(images[i]) for i in good]
    rng = np.random.default_rng(seed)
    n_noise = max(noise_samples, min_count - len(names))
    if n_noise:
        noise = [rng.integers(0, 256, size=(64, 64, 3), dtype=np.uint8) for _ in range(n_noise)]
        rows.append(preprocessor.batch(noise))
        names += [f"noise:{i}" for i in range(n_noise)]
    if not rows:
        raise InputError("no validation inputs: no readable images and noise_samples is 0")
    return ValidationInputs(np.concatenate(rows).astype(np.float32, copy=False), tuple(names))


#: inputs run at each batch size below the largest (at least two whole batches and a tail of each)
SAMPLE = 8


def run_in_batches(
    backend: Any, batch: np.ndarray, batch_size: int, progress: Callable[[int], None] | None = None
) -> np.ndarray:
    """``backend`` over ``batch`` in batches of ``batch_size``; ``progress(rows)`` after each."""
    outs = []
    for i in range(0, len(batch), batch_size):
        outs.append(backend.run(batch[i : i + batch_size]))
        if progress is not None:
            progress(len(outs[-1]))
    return np.concatenate(outs)


def run_outputs_in_batches(
    backend: Any,
    batch: np.ndarray,
    batch_size: int,
    progress: Callable[[int], None] | None = None,
    patches: bool = False,
) -> tuple[np.ndarray, np.ndarray | None]:
    """(logits or embeddings, patch tokens) of ``backend`` over ``batch``; the patch tokens (every output of the
    backend's ``run_all``) only with ``patches``, else None and :func:`run_in_batches`."""
    if not patches:
        return run_in_batches(backend, batch, batch_size, progress), None
    firsts, seconds = [], []
    for i in range(0, len(batch), batch_size):
        first, second = backend.run_all(batch[i : i + batch_size])[:2]
        firsts.append(first)
        seconds.append(second)
        if progress is not None:
            progress(len(first))
    return np.concatenate(firsts), np.concatenate(seconds)


def sample_rows(count: int, batch_size: int, sample: int = SAMPLE) -> np.ndarray:
    """Indices of the inputs run at ``batch_size``: ``sample`` (at least two batches and a tail) spread
    evenly over ``count`` inputs, first and last included; every input when there are no more."""
    want = max(sample, 2 * batch_size + 1)
    if want >= count:
        return np.arange(count)
    return np.unique(np.linspace(0, count - 1, want).round().astype(int))


@dataclass(frozen=True)
class ArtifactValidation:
    stage: str
    backend: str
    per_batch: dict[int, Comparison]
    rows: dict[int, int] | None = None  # inputs run at each batch size (the rest: their largest-batch logits)
    per_image: dict[str, list] | None = None  # each input's max |diff| and cosine at the largest batch
    flips: list[dict[str, Any]] | None = None  # inputs whose top-1 changed: both top-3s (export/compare.py)
    kind: str = "logits"  # what was compared (vocab.OUTPUT_KINDS)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.per_batch.values())

    @property
    def failures(self) -> list[str]:
        return [f"batch {b}: {f}" for b, c in self.per_batch.items() for f in c.failures]

    def worst_metrics(self) -> dict[str, float]:
        worst: dict[str, float] = {}
        for c in self.per_batch.values():
            for key, value in c.metrics.items():
                higher_is_worse = key in ("max_abs_diff", "mean_abs_diff")
                if key not in worst or (value > worst[key] if higher_is_worse else value < worst[key]):
                    worst[key] = value
        return worst

    def to_dict(self) -> dict[str, Any]:
        any_cmp = next(iter(self.per_batch.values()))
        return {
            "passed": self.passed,
            "backend": self.backend,
            "kind": self.kind,
            "metrics": self.worst_metrics(),
            "thresholds": any_cmp.thresholds,
            "failures": self.failures,
            "per_batch": {str(b): c.to_dict() for b, c in self.per_batch.items()},
            **({"rows_per_batch": {str(b): n for b, n in self.rows.items()}} if self.rows else {}),
            **({"per_image": self.per_image} if self.per_image is not None else {}),
            **({"flips": self.flips} if self.flips is not None else {}),
        }


def validate_artifact(
    stage: str,
    backend: Any,
    inputs: ValidationInputs,
    reference: np.ndarray,
    tolerance: Mapping[str, float],
    batch_sizes: Sequence[int],
    sample: int = SAMPLE,
    largest_logits: np.ndarray | None = None,
    labels: Sequence[str] | None = None,
    progress: Callable[[str], None] | None = None,
    kind: str = "logits",
    patch_reference: np.ndarray | None = None,
    largest_patches: np.ndarray | None = None,
    scores: str = "softmax",
) -> ArtifactValidation:
    """Run ``backend`` over every input at the largest of ``batch_sizes`` and over a sample at the others
    (the module docstring says why that proves as much); compare with ``reference`` logits.

    ``largest_logits``: the logits this very graph gave for every input at the largest batch size, when they
    were computed already (the autopilot's judge, with the same backend class): not computed again.
    ``labels``: the model's class names, to record the inputs whose top-1 changed with both top-3s.
    ``progress``: told ``"<done> of <total> inputs run"`` after each batch (a long validation says how far it is).
    ``kind``: what the outputs are (vocab.OUTPUT_KINDS): embeddings are judged by cosine and neighbours.
    ``patch_reference``: eager's patch tokens, when the export returns them: the artifact's are judged too, at
    every batch size (``largest_patches``: those the autopilot's judge already has, with ``largest_logits``).
    ``scores``: the classifier's score function (the flips' top-3 probabilities)."""
    sizes = sorted(set(batch_sizes))
    largest = sizes[-1]
    count = len(inputs.batch)
    with_patches = patch_reference is not None
    if with_patches and largest_patches is None:
        largest_logits = None  # judged without its patch tokens: run again
    total = (count if largest_logits is None else 0) + sum(len(sample_rows(count, s, sample)) for s in sizes[:-1])
    done = [0]

    def ran(rows: int) -> None:
        done[0] += rows
        if progress is not None:
            progress(f"{done[0]} of {total} inputs run")

    def run(rows: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray | None]:
        return run_outputs_in_batches(backend, rows, size, ran, with_patches)

    full, full_p = run(inputs.batch, largest) if largest_logits is None else (largest_logits, largest_patches)
    pair = (lambda p: (patch_reference, p)) if with_patches else (lambda p: None)
    per_batch = {largest: compare(reference, full, tolerance, kind, pair(full_p))}
    rows = {largest: len(full)}
    for size in sizes[:-1]:
        idx = sample_rows(len(full), size, sample)
        logits, patches = run(inputs.batch[idx], size)
        per_batch[size] = _judge_sample(reference, full, full_p, idx, logits, patches, tolerance, kind, pair, largest)
        rows[size] = len(idx)
        log.info("%s at batch %d (%d inputs): %s", stage, size, len(idx), "pass" if per_batch[size].passed else "FAIL")
    ordered = {size: per_batch[size] for size in sorted(per_batch)}
    flips = flip_details(reference, full, inputs.names, labels, scores=scores) if labels is not None else None
    counts = {s: rows[s] for s in sorted(rows)}
    per = per_image(reference, full, kind, int(tolerance.get("neighbours", 10)), pair(full_p))
    return ArtifactValidation(stage, getattr(backend, "name", "?"), ordered, counts, per, flips, kind)


def _judge_sample(
    reference: np.ndarray,
    full: np.ndarray,
    full_p: np.ndarray | None,
    idx: np.ndarray,
    logits: np.ndarray,
    patches: np.ndarray | None,
    tolerance: Mapping[str, float],
    kind: str,
    pair: Callable[[Any], Any],
    largest: int,
) -> Comparison:
    """A smaller batch size's sample spliced into the largest batch's outputs and judged, and its batch
    invariance: the sample's outputs within ``max_abs_diff`` of its own rows at the largest batch."""
    spliced = full.copy()
    spliced[idx] = logits
    spliced_p = None
    if patches is not None and full_p is not None:
        spliced_p = full_p.copy()
        spliced_p[idx] = patches
    verdict = compare(reference, spliced, tolerance, kind, pair(spliced_p))
    bound = float(tolerance.get("max_abs_diff", float("inf")))
    moved = float(np.abs(logits - full[idx]).max()) if len(idx) else 0.0
    if not moved <= bound:  # NaN fails too
        verdict = replace(
            verdict,
            failures=(
                *verdict.failures,
                f"batch invariance: logits moved {moved:.3g} from batch {largest} (expected <= max_abs_diff "
                f"{bound:g})",
            ),
        )
    return verdict
