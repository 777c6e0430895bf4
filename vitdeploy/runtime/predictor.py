"""The Predictor: artifacts + one backend + the manifest's preprocessing, for every backend alike.

    with Predictor.open("out/") as p:          # "auto": trt > ort-fp16 (CUDA) > the fastest CPU backend > torch
        print(p.backend_name, p.why)
        for pred in p.predict(["cat.jpg", "dog.png"], top_k=3):
            print(pred.label, pred.score)

Thread-safe: a Predictor holds no per-call state, ONNX Runtime sessions and torch inference may
be called from several threads, and the TensorRT backend checks out one of a bounded pool of
execution contexts per run.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ..base.errors import ArtifactError, ArtifactIntegrityError, BackendError, InputError
from ..base.vocab import MANIFEST_NAME, ORT_FP16, TORCH
from .artifacts import Artifacts
from .backends import (
    Backend,
    BackendOptions,
    ensure_known,
    first_line,  # noqa: F401 - the one helper; tests check no module defines its own
    open_backend,
    open_or_reason,
)
from .backends.base import provider_name
from .postprocess import probabilities
from .postprocess import top_k as _top_k

log = logging.getLogger(__name__)

#: auto's order without a measurement (what `tune` tries first): the accelerators, ort, then eager PyTorch
AUTO_ORDER = ("trt", ORT_FP16, "ort", "torch")
#: tried first, in this order: the first that opens is chosen (no CPU backend comes near them)
ACCELERATED = AUTO_ORDER[:2]
_CUDA_PROVIDERS = ("CUDAExecutionProvider", "TensorrtExecutionProvider")


@dataclass(frozen=True)
class Prediction:
    """The best class of one input, plus its top-k (label, index, score) list, best first."""

    label: str
    index: int
    score: float
    top_k: list[tuple[str, int, float]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "index": self.index,
            "score": self.score,
            "top_k": [{"label": lab, "index": idx, "score": sc} for lab, idx, sc in self.top_k],
        }


def cuda_provider_available() -> bool:
    try:
        from .backends.ort import available_providers
    except ImportError:  # pragma: no cover
        return False
    return any(p in available_providers() for p in _CUDA_PROVIDERS)


def _refuse_without_cuda() -> str | None:
    return None if cuda_provider_available() else "needs CUDA"


def _auto_options(name: str, options: BackendOptions) -> BackendOptions:
    """ort-fp16 in auto mode runs on a CUDA provider only: fp16 on the CPU is not what auto promises."""
    if name != ORT_FP16:
        return options
    opts = options
    if not any(provider_name(p) in _CUDA_PROVIDERS for p in options.providers):
        opts = dataclasses.replace(options, providers=("CUDAExecutionProvider", *options.providers))
    return dataclasses.replace(opts, allow_cpu_fallback=False)


def select_backend(artifacts: Artifacts, options: BackendOptions, timer: Any = None) -> tuple[Backend, str, str]:
    """Open the backend "auto" runs: trt, then ort-fp16 (CUDA only); else the fastest CPU backend here that
    passed its gate (runtime/auto_choice.py: measured once per machine, kept beside the export); else torch.

    Returns (backend, name, why). A candidate that is unavailable, or fails to open (BackendError,
    MissingDependencyError, or an ArtifactError from the backend itself such as an engine built
    for another GPU) is skipped with its reason recorded. A file that fails its sha256/size check
    is never skipped silently: that ArtifactError is raised (:func:`~.backends.open_or_reason`).
    ``timer``: how the CPU measurement times one call (tests: a deterministic one).
    """
    from .auto_choice import choose_on_cpu

    notes: list[str] = []
    for name in ACCELERATED:
        attempt = open_or_reason(
            name, artifacts, _auto_options(name, options), refuse=_refuse_without_cuda if name == ORT_FP16 else None
        )
        if attempt.backend is not None:
            return attempt.backend, name, "auto: " + "; ".join([*notes, f"chose {name}"])
        notes.append(f"{name} {attempt.reason}" if attempt.status == "refused" else _skipped(attempt))
    chosen = choose_on_cpu(artifacts, options, notes, **({"timer": timer} if timer else {}))
    if chosen is not None:
        backend, name, why = chosen
        return backend, name, "auto: " + "; ".join([*notes, f"chose {name}, {why}"])
    attempt = open_or_reason(TORCH, artifacts, options)
    if attempt.backend is not None:
        return attempt.backend, TORCH, "auto: " + "; ".join([*notes, f"chose {TORCH}"])
    notes.append(_skipped(attempt))
    raise BackendError(
        f"no backend can run the artifacts in {artifacts.directory}: "
        + "; ".join(notes)
        + "; install onnxruntime (pip install onnxruntime) or re-run `vitdeploy export`"
    )


def _skipped(attempt: Any) -> str:
    """One note for a backend auto passed over: unavailable (why) or failed to open (why)."""
    if attempt.status == "unavailable":
        return f"{attempt.name} unavailable ({attempt.reason})"
    log.debug("auto: %s failed: %s", attempt.name, attempt.reason)
    return f"{attempt.name} failed ({attempt.reason})"


@dataclass(frozen=True)
class Embedding:
    """The feature vector of one input (an embedding model's answer: no label, no score); with its patch
    tokens, float32 (P, D), where they were asked for of an export that returns them."""

    vector: list[float]
    patch_tokens: np.ndarray | None = None

    def to_dict(self) -> dict[str, Any]:
        if self.patch_tokens is None:
            return {"embedding": self.vector}
        return {"embedding": self.vector, "patch_tokens": self.patch_tokens.tolist()}


def _is_single(inputs: Any) -> bool:
    if isinstance(inputs, (str, bytes, os.PathLike)):
        return True
    if isinstance(inputs, np.ndarray):
        return inputs.ndim in (2, 3)
    return not isinstance(inputs, (list, tuple)) and not hasattr(inputs, "__next__")


class Predictor:
    """Classify images (or preprocessed batches) with the artifacts' labels and preprocessing."""

    def __init__(
        self,
        artifacts: Artifacts,
        backend: Backend,
        *,
        backend_name: str | None = None,
        why: str = "",
        preprocessor: Any = None,
        max_pixels: int | None = None,
    ) -> None:
        self.artifacts = artifacts
        self.backend = backend
        self.backend_name = backend_name or getattr(backend, "name", "?")
        self.why = why or f"requested {self.backend_name}"
        self._preprocessor = preprocessor
        self._max_pixels = max_pixels
        self.labels = artifacts.labels
        self.input_shape = artifacts.input_shape
        self._spec = artifacts.preprocess  # the base size's; at_size() gives another listed size's
        self.is_embedding = artifacts.schema.is_embedding  # vectors out, no labels (base/output_spec.py)
        self.scores = artifacts.schema.output.scores  # how logits become scores: softmax, or sigmoid (SigLIP)
        self.output_width = artifacts.schema.num_classes  # values per row: classes, or the embedding's dimension
        self.patch_shape = artifacts.schema.patch_shape  # (patches, width) of the patch tokens; None: not exported

    @classmethod
    def from_artifacts(
        cls,
        path: str | os.PathLike[str] | Artifacts,
        backend: str = "auto",
        options: BackendOptions | None = None,
        max_pixels: int | None = None,
        public_key: str | os.PathLike[str] | None = None,
    ) -> "Predictor":
        """Open the export directory ``path`` on ``backend`` ("auto" or one of vocab.RUNTIME_BACKENDS).

        ``max_pixels``: images whose header claims more pixels are refused before decoding
        (default: the preprocessing's limit, Pillow's 89.5 Mpx). ``public_key``: only if the export is
        signed by that key and unchanged since (runtime.verify; SignatureError otherwise)."""
        ensure_known(backend)
        # the signature, schema, every file's sha256 and the metadata checks, once
        artifacts = Artifacts.open(path, public_key=public_key)
        options = options or BackendOptions()
        if backend == "auto":
            runner, name, why = select_backend(artifacts, options)
        else:
            runner, name, why = open_backend(backend, artifacts, options), backend, f"requested {backend}"
        describe = runner.describe()
        log.info("%s: backend %s (%s) - %s", artifacts.name, name, describe, why)
        return cls(artifacts, runner, backend_name=name, why=why, max_pixels=max_pixels)

    @classmethod
    def open(
        cls,
        artifacts: str | os.PathLike[str] | None = None,
        *,
        config: Any = None,
        backend: str | None = None,
        image_size: int | None = None,
    ) -> "Predictor":
        """The export folder ``artifacts`` (None: the config's ``export.output_dir``) opened as ``config``'s
        ``runtime`` section asks (backend, providers, threads, image limit): what ``vitdeploy predict`` opens.

        ``config``: a pipeline.yaml path, a mapping of its sections, a PipelineConfig, or None (./pipeline.yaml
        where the current folder has one, else the defaults). ``backend``: "auto" or one of
        vocab.RUNTIME_BACKENDS (None: ``runtime.backend``, auto by default). ``image_size``: an export for
        several sizes at another listed size (:meth:`at_size`)."""
        from ..base.config import config_from

        cfg = config_from(config)
        runtime = cfg.runtime
        opened = cls.from_artifacts(
            artifacts if artifacts is not None else cfg.output_dir,
            backend=backend or runtime.backend,
            options=BackendOptions.from_runtime(runtime),
            max_pixels=runtime.max_image_pixels,
            public_key=cfg.verify_key,
        )
        try:
            return opened.at_size(image_size)
        except BaseException:
            opened.close()
            raise

    def at_size(self, size: int | None) -> "Predictor":
        """This predictor at another size an export for several sizes answers at (manifest image_sizes): the
        same backend, that size's preprocessing. None or the base size: itself. InputError naming the sizes
        that work for any other (a fixed-size export works at its one size)."""
        spec = self.artifacts.preprocess_at(size)
        if size is None or (spec.height, spec.width) == tuple(self.input_shape[1:]):
            return self
        other = copy.copy(self)
        other._spec, other._preprocessor = spec, None
        other.input_shape = (self.input_shape[0], spec.height, spec.width)
        if self.patch_shape is not None:  # the patch grid follows the side: (side / patch)^2 tokens
            patches, width = self.patch_shape
            base = self.input_shape[1] * self.input_shape[2]
            other.patch_shape = (patches * spec.height * spec.width // base, width)
        return other

    # ---------------------------------------------------------------- preprocessing

    @property
    def preprocessor(self) -> Any:
        if self._preprocessor is None:
            from .preprocess import Preprocessor  # Pillow is needed only once images are involved

            limit = {} if self._max_pixels is None else {"max_pixels": self._max_pixels}
            self._preprocessor = Preprocessor(self._spec, **limit)
        return self._preprocessor

    def preprocess(self, images: Sequence[Any]) -> np.ndarray:
        """Images (paths, encoded bytes, PIL images, uint8 arrays) -> float32 (N, C, H, W).

        The first unreadable image raises InputError naming it (batch_predict is the tolerant path).
        """
        batch = np.asarray(self.preprocessor.batch(list(images)), dtype=np.float32)
        if batch.ndim != 4 or batch.shape[1:] != tuple(self.input_shape):
            raise ArtifactError(
                f"{self.artifacts.directory / MANIFEST_NAME}: preprocessing produced shape "
                f"{batch.shape}, the model expects (N, {', '.join(map(str, self.input_shape))}); "
                f"the manifest's preprocess and io sections disagree; re-run `vitdeploy export`"
            )
        return batch

    def _to_batch(self, inputs: Any) -> tuple[np.ndarray, bool]:
        if isinstance(inputs, np.ndarray) and inputs.ndim == 4:
            return inputs, False  # already preprocessed: checked by the backend
        if _is_single(inputs):
            return self.preprocess([inputs]), True
        items = list(inputs)
        return self.preprocess(items), False

    # ---------------------------------------------------------------- inference

    def predict_logits(self, batch: np.ndarray) -> np.ndarray:
        """float32 (N, C, H, W) -> float32 (N, num_classes), or (N, D) embeddings for an embedding model.
        InputError names expected vs actual."""
        logits = self._backend().run(batch)  # BackendBase.run checks dtype/shape, splits by max_batch
        if logits.ndim != 2 or logits.shape[1] != self.output_width:
            what = "values per embedding" if self.is_embedding else "labels"
            raise ArtifactIntegrityError(
                f"{self.backend_name} returned outputs of shape {logits.shape} but "
                f"{self.artifacts.manifest_path} has {self.output_width} {what}; re-run "
                f"`vitdeploy export`"
            )
        return logits

    @property
    def has_patch_tokens(self) -> bool:
        """Whether the export returns the patch tokens beside each embedding (model.patch_tokens)."""
        return self.patch_shape is not None

    def check_patch_tokens(self) -> None:
        """InputError unless the export returns patch tokens (what asking for them of another export gets)."""
        if not self.has_patch_tokens:
            what = "an embedding model" if self.is_embedding else "a classifier"
            raise InputError(
                f"{self.artifacts.name} is {what} exported without patch tokens; export it with model.output: "
                "embedding and model.patch_tokens: true to have them"
            )

    def predict_outputs(self, batch: np.ndarray, patch_tokens: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
        """float32 (N, C, H, W) -> (what :meth:`predict_logits` gives, the (N, P, D) patch tokens or None); the
        patch tokens only with ``patch_tokens`` (InputError when the export has none)."""
        if not patch_tokens:
            return self.predict_logits(batch), None
        self.check_patch_tokens()
        vectors, tokens = self._backend().run_all(batch)[:2]
        want = (len(vectors), *(self.patch_shape or ()))
        if vectors.shape != (len(batch), self.output_width) or tokens.shape != want:
            raise ArtifactIntegrityError(
                f"{self.backend_name} returned outputs of shapes {vectors.shape} and {tokens.shape} but "
                f"{self.artifacts.manifest_path} says ({len(batch)}, {self.output_width}) and {want}; re-run "
                "`vitdeploy export`"
            )
        return vectors, tokens

    def embed(self, inputs: Any, patch_tokens: bool = False) -> Any:
        """Images (or a preprocessed batch) -> float32 (N, D) embeddings; InputError for a classifier. With
        ``patch_tokens``: (the embeddings, their float32 (N, P, D) patch tokens), InputError when the export has
        none."""
        if not self.is_embedding:
            raise InputError(
                f"{self.artifacts.name} is a classifier (labels, top-k); its embeddings are not an output: export "
                "it with model.output: embedding"
            )
        if patch_tokens:
            self.check_patch_tokens()
        if isinstance(inputs, (list, tuple)) and not inputs:
            empty = np.zeros((0, self.output_width), np.float32)
            return (empty, np.zeros((0, *(self.patch_shape or ())), np.float32)) if patch_tokens else empty
        vectors, tokens = self.predict_outputs(self._to_batch(inputs)[0], patch_tokens)
        return (vectors, tokens) if patch_tokens else vectors

    def _backend(self) -> Backend:
        if self.backend is None:
            raise BackendError(f"predictor for {self.artifacts.directory} is closed")
        return self.backend

    def predictions_from_logits(
        self, logits: np.ndarray, top_k: int = 5, patch_tokens: np.ndarray | None = None
    ) -> list[Any]:
        """One Prediction per row of logits; one :class:`Embedding` per row for an embedding model (with its
        row of ``patch_tokens`` when given)."""
        if top_k < 1:
            raise InputError(f"top_k must be >= 1, got {top_k}")
        if self.is_embedding:
            rows = np.asarray(logits, dtype=np.float32)
            tokens = [None] * len(rows) if patch_tokens is None else list(patch_tokens)
            return [Embedding(row.tolist(), t) for row, t in zip(rows, tokens)]
        probs = probabilities(logits, self.scores)
        out = []
        for row in probs:
            best = [(self.label_of(i), i, s) for i, s in _top_k(row, top_k)]
            out.append(Prediction(label=best[0][0], index=best[0][1], score=best[0][2], top_k=best))
        return out

    def predict(self, inputs: Any, top_k: int = 5, patch_tokens: bool = False) -> list[Any]:
        """One input or a list of inputs -> one Prediction (an Embedding for an embedding model) per input
        (a list, always); ``patch_tokens``: each Embedding carries its patch tokens (InputError when the export
        has none).

        Inputs: image paths, PIL images, HWC uint8 arrays, or a preprocessed float32 NCHW batch.
        """
        if patch_tokens:
            self.check_patch_tokens()
        if isinstance(inputs, (list, tuple)) and not inputs:
            return []
        batch, _ = self._to_batch(inputs)
        vectors, tokens = self.predict_outputs(batch, patch_tokens)
        return self.predictions_from_logits(vectors, top_k, tokens)

    def label_of(self, index: int) -> str:
        return self.labels[index] if 0 <= index < len(self.labels) else str(index)

    # ---------------------------------------------------------------- lifecycle

    def describe(self) -> str:
        return f"{self.artifacts.name} on {self.backend_name}: {self._backend().describe()}"

    def close(self) -> None:
        backend, self.backend = self.backend, None
        if backend is not None:
            backend.close()

    def __enter__(self) -> "Predictor":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Predictor({str(self.artifacts.directory)!r}, backend={self.backend_name!r})"


__all__ = ["AUTO_ORDER", "Embedding", "Prediction", "Predictor", "select_backend"]
