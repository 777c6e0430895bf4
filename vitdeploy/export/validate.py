"""Stage: run an exported artifact through a runtime backend and judge it against eager PyTorch.

The artifact is executed by the same backend classes ``vitdeploy predict`` uses, at batch 1, at
a batch > 1 that is not a power of two, and at the profile's max batch, so "validated" means
validated with the code users run.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ..base.errors import InputError
from .compare import Comparison, compare

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


def run_in_batches(backend: Any, batch: np.ndarray, batch_size: int) -> np.ndarray:
    return np.concatenate([backend.run(batch[i : i + batch_size]) for i in range(0, len(batch), batch_size)])


@dataclass(frozen=True)
class ArtifactValidation:
    stage: str
    backend: str
    per_batch: dict[int, Comparison]

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
            "metrics": self.worst_metrics(),
            "thresholds": any_cmp.thresholds,
            "failures": self.failures,
            "per_batch": {str(b): c.to_dict() for b, c in self.per_batch.items()},
        }


def validate_artifact(
    stage: str,
    backend: Any,
    inputs: ValidationInputs,
    reference: np.ndarray,
    tolerance: Mapping[str, float],
    batch_sizes: Sequence[int],
) -> ArtifactValidation:
    """Run ``backend`` over ``inputs`` at each batch size and compare with ``reference`` logits."""
    per_batch = {}
    for size in batch_sizes:
        logits = run_in_batches(backend, inputs.batch, size)
        per_batch[size] = compare(reference, logits, tolerance)
        log.info("%s at batch %d: %s", stage, size, "pass" if per_batch[size].passed else "FAIL")
    return ArtifactValidation(stage, getattr(backend, "name", "?"), per_batch)
