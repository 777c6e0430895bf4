"""The model configuration and statistics extensions of Triton's HTTP protocol, for `vitdeploy serve`.

``GET /v2/models/<name>/config`` answers the model's configuration in Triton's JSON form (the
``ModelConfig`` message as JSON: the ensemble's inputs and outputs, datatypes as ``TYPE_*``, dims
without the batch dimension, ``max_batch_size``), so ``tritonclient``'s ``get_model_config`` reads
the same tensors from `vitdeploy serve` as from the generated repository's ensemble.

``GET /v2/models/<name>/stats`` (and ``/v2/models/stats``) answers :class:`InferenceStats` in
Triton's statistics shape: ``inference_count`` (images), ``execution_count`` (requests),
``last_inference`` (ms since the epoch) and ``inference_stats`` with ``success``, ``fail``,
``queue``, ``compute_input`` (decoding and preprocessing), ``compute_infer`` (the model call of the
batch the request went in) and ``compute_output`` (encoding the answer), each ``{count, ns}``.
The counters are those of the replica that answers the GET: with several replicas, each counts
its own requests (Ray Serve routes the GET to one of them).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Mapping

from .protocol import CONFIG_TYPES, INPUT, MODEL_VERSION, config_parameters, output_tensors

STAT_KEYS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss")


def _tensor(name: str, dtype: str, dims: list[int]) -> dict[str, Any]:
    return {"name": name, "data_type": dtype, "dims": dims, "is_shape_tensor": False}


def _input(name: str, dtype: str, dims: list[int]) -> dict[str, Any]:
    return {**_tensor(name, dtype, dims), "format": "FORMAT_NONE", "allow_ragged_batch": False, "optional": False}


def model_config(
    model: str,
    num_classes: int,
    k: int,
    max_batch_size: int,
    platform: str = "ray_serve",
    embedding: bool = False,
    patch_shape: Any = None,
    parameters: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The model's configuration as Triton's ``/config`` JSON (the ensemble's tensors; ``embedding``: its output
    EMBEDDINGS, ``num_classes`` values a row, and PATCH_TOKENS [P, D] with ``patch_shape``; ``parameters``:
    protocol.export_parameters, which export and which backend, as the generated repository's ensemble states them)."""
    return {
        "name": model,
        "platform": platform,
        "backend": "",
        "version_policy": {"latest": {"num_versions": 1}},
        "max_batch_size": int(max_batch_size),
        "input": [_input(INPUT, "TYPE_STRING", [1])],
        "output": [
            {**_tensor(name, CONFIG_TYPES[dtype], list(dims)), "label_filename": ""}
            for name, dtype, dims in output_tensors(num_classes, k, embedding, patch_shape)
        ],
        "parameters": config_parameters(parameters or {}),
    }


class InferenceStats:
    """Thread-safe request counters of one replica, in Triton's statistics shape."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stats = {key: [0, 0] for key in STAT_KEYS}
        self.inference_count = 0
        self.execution_count = 0
        self.last_inference_ms = 0

    def success(self, images: int, total_ns: int, queue_ns: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
        with self._lock:
            for key, ns in (
                ("success", total_ns),
                ("queue", queue_ns),
                ("compute_input", input_ns),
                ("compute_infer", infer_ns),
                ("compute_output", output_ns),
            ):
                self._stats[key][0] += 1
                self._stats[key][1] += max(0, int(ns))
            self.inference_count += int(images)
            self.execution_count += 1
            self.last_inference_ms = int(time.time() * 1000)

    def failure(self, total_ns: int) -> None:
        with self._lock:
            self._stats["fail"][0] += 1
            self._stats["fail"][1] += max(0, int(total_ns))
            self.last_inference_ms = int(time.time() * 1000)

    def to_json(self, model: str, version: str = MODEL_VERSION) -> dict[str, Any]:
        with self._lock:
            stats = {key: {"count": c, "ns": ns} for key, (c, ns) in self._stats.items()}
            entry = {
                "name": model,
                "version": version,
                "last_inference": self.last_inference_ms,
                "inference_count": self.inference_count,
                "execution_count": self.execution_count,
                "inference_stats": stats,
                "batch_stats": [],
            }
        return {"model_stats": [entry]}


__all__ = ["InferenceStats", "STAT_KEYS", "model_config"]
