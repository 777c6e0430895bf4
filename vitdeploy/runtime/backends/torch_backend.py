"""Eager PyTorch backend on model.safetensors + model.json.

The one runtime module allowed to import ``vitdeploy.model``: eager execution needs the network
definition. ONNX Runtime and TensorRT never do. torch is imported when the backend is built.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from ...base._deps import require
from ...base.errors import BackendError
from ...base.vocab import CHECKPOINT_CONFIG, CHECKPOINT_WEIGHTS
from .base import BackendBase, BackendOptions

log = logging.getLogger(__name__)

WEIGHTS_NAME, CONFIG_NAME = CHECKPOINT_WEIGHTS, CHECKPOINT_CONFIG


def _resolve_paths(weights: str | os.PathLike[str] | tuple[Any, Any]) -> tuple[Path, Path]:
    """A directory holding model.safetensors + model.json, or an explicit (weights, config) pair."""
    if isinstance(weights, (tuple, list)):
        if len(weights) != 2:
            raise BackendError(f"torch backend: expected (model.safetensors, model.json) paths, got {weights!r}")
        return Path(weights[0]), Path(weights[1])
    path = Path(weights)
    if path.is_dir():
        return path / WEIGHTS_NAME, path / CONFIG_NAME
    return path, path.with_name(CONFIG_NAME)


def _read_config(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise BackendError(
            f"torch backend: {path} not found; it is written next to model.safetensors by `vitdeploy export`"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BackendError(f"torch backend: {path} is not valid JSON ({exc}); re-run `vitdeploy export`") from exc
    if not isinstance(data, dict) or data.get("format") != "vitdeploy" or not isinstance(data.get("vit"), dict):
        got = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise BackendError(
            f'torch backend: {path} is not a vitdeploy model config (expected "format": '
            f'"vitdeploy" and a "vit" object, got format {got!r}); re-run `vitdeploy export`'
        )
    return data


def _mismatch(exc: RuntimeError) -> str:
    """The first "size mismatch for ..." line of a load_state_dict error (its message spans lines)."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    return next((line for line in lines if line.startswith("size mismatch")), lines[0] if lines else "RuntimeError")


class TorchBackend(BackendBase):
    """VisionTransformer in eval mode under ``torch.inference_mode``; returns float32 numpy."""

    def __init__(
        self,
        weights_dir_or_paths: str | os.PathLike[str] | tuple[Any, Any],
        input_shape: tuple[int, int, int],
        max_batch: int | None = None,
        options: BackendOptions | None = None,
    ) -> None:
        super().__init__(input_shape, max_batch)
        self.name = "torch"
        self.options = options or BackendOptions()
        torch = require("torch", "the eager PyTorch backend ('torch')")
        safetensors_torch = require("safetensors.torch", "the eager PyTorch backend ('torch')")
        from ...model.vit import VisionTransformer, ViTConfig  # documented exception, see module docstring

        self._torch = torch
        weights_path, config_path = _resolve_paths(weights_dir_or_paths)
        config = _read_config(config_path)
        try:
            cfg = ViTConfig.from_dict(config["vit"])
        except (TypeError, ValueError) as exc:
            raise BackendError(f"torch backend: {config_path} 'vit' config is invalid: {exc}") from exc
        expected = (cfg.in_channels, cfg.image_size, cfg.image_size)
        if tuple(self.input_shape) != expected:
            raise BackendError(
                f"torch backend: {config_path} describes input {expected}, but the backend was asked "
                f"for {tuple(self.input_shape)}; the manifest and model.json disagree, re-run export"
            )

        self.device = self._pick_device(torch, self.options.device)
        precision = self.options.precision
        if precision not in ("fp32", "fp16"):
            raise BackendError(f"torch backend: precision must be 'fp32' or 'fp16', got {precision!r}")
        if precision == "fp16" and self.device.type != "cuda":
            raise BackendError(
                "torch backend: precision fp16 needs a CUDA device (CPU half-precision kernels are "
                f"slow and inexact); got device {self.options.device!r}: set runtime.device: cuda or "
                "precision: fp32"
            )
        self.dtype = torch.float16 if precision == "fp16" else torch.float32

        if not weights_path.is_file():
            raise BackendError(f"torch backend: weights {weights_path} not found; re-run `vitdeploy export`")
        try:
            state = safetensors_torch.load_file(str(weights_path))
        except Exception as exc:  # noqa: BLE001 - safetensors raises several types on bad files
            raise BackendError(f"torch backend: cannot read {weights_path}: {exc}") from exc
        model = VisionTransformer(cfg)
        try:
            missing, unexpected = model.load_state_dict(state, strict=False)
        except RuntimeError as exc:  # tensor shapes differ from the config's (e.g. another width or class count)
            raise BackendError(
                f"torch backend: weights {weights_path} do not fit the config in {config_path} "
                f"({_mismatch(exc)}); the two files come from different "
                f"models: re-export both with `vitdeploy export`"
            ) from exc
        if missing or unexpected:
            raise BackendError(
                f"torch backend: {weights_path} does not match the config in {config_path}: "
                f"missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}"
            )
        from ...base.output_spec import output_of
        from ...model.vit import output_network

        try:
            output = output_of(config.get("output"))
        except ValueError as exc:
            raise BackendError(f"torch backend: {config_path} 'output' is invalid: {exc}") from None
        # an embedding export runs the pooled features (model.json says which), as its graphs do
        self._model = output_network(model, output).to(device=self.device, dtype=self.dtype).eval()
        if self.options.threads and self.device.type == "cpu":
            # torch's intra-op thread count is process-wide.
            torch.set_num_threads(max(int(self.options.threads), 1))
        self.config = cfg
        self.model_info = config
        log.info("torch: %s on %s (%s)", weights_path.name, self.device, precision)

    @staticmethod
    def _pick_device(torch: Any, device: str):
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError) as exc:
            raise BackendError(f"torch backend: invalid device {device!r} (use 'cpu', 'cuda' or 'cuda:N')") from exc
        if dev.type == "cuda":
            if not torch.cuda.is_available():
                raise BackendError(
                    f"torch backend: device {device!r} asked for but torch {torch.__version__} sees "
                    "no CUDA GPU; install a CUDA build of torch or set runtime.device: cpu"
                )
            if dev.index is not None and dev.index >= torch.cuda.device_count():
                raise BackendError(
                    f"torch backend: device {device!r} does not exist ({torch.cuda.device_count()} CUDA device(s))"
                )
        elif dev.type != "cpu":
            raise BackendError(f"torch backend: unsupported device {device!r} (use 'cpu', 'cuda' or 'cuda:N')")
        return dev

    def _forward(self, batch: np.ndarray) -> tuple[np.ndarray, ...]:
        torch = self._torch
        model = self._model
        if model is None:
            raise BackendError("torch: backend is closed")
        with torch.inference_mode():
            x = torch.from_numpy(batch).to(device=self.device, dtype=self.dtype)
            y = model(x)
            return tuple(t.float().cpu().numpy() for t in (y if isinstance(y, tuple) else (y,)))

    def _run(self, batch: np.ndarray) -> np.ndarray:
        return self._forward(batch)[0]

    def _run_all(self, batch: np.ndarray) -> tuple[np.ndarray, ...]:
        return self._forward(batch)

    def close(self) -> None:
        self._model = None

    def describe(self) -> str:
        precision = "fp16" if self.dtype == self._torch.float16 else "fp32"
        return f"torch {self._torch.__version__} [{self.device}, {precision}]"


def open_from_artifacts(artifacts: Any, options: BackendOptions | None = None) -> TorchBackend:
    """The "torch" backend on the verified "weights" (model.safetensors) and "weights-config" (model.json)."""
    weights, config = artifacts.path("weights"), artifacts.path("weights-config")
    return TorchBackend((weights, config), artifacts.input_shape, artifacts.batch["max"], options)
