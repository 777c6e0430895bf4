"""What a `vitdeploy serve` deployment is made of, before Ray sees it: :class:`ReplicaSpec` (what each replica needs
to open its Predictor and answer requests, sent to the replicas) and :func:`deployment_options` (Ray Serve's
deployment options from the ``serve:`` section). Plain data: no Ray, no FastAPI (ray_app.py builds the
application from them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

from ..runtime.backends.base import BackendOptions
from .protocol import MODEL_VERSION


@dataclass(frozen=True)
class ReplicaSpec:
    """What each replica needs to open its Predictor and answer requests (sent to the replicas)."""

    #: where the replica gets the export: a local path (one node or a shared disk), a URI
    #: (file://, s3://, gs://: downloaded once per node) or an ObjectRef of an ArtifactBundle
    #: (packed on the driver, unpacked once per node); every file's sha256 is verified on open.
    artifacts: Any
    backend: str
    options: BackendOptions
    max_pixels: int
    top_k: int
    max_batch_size: int
    batch_wait_timeout_s: float
    decode_threads: int
    concurrent_batches: int
    max_images_per_request: int
    max_request_bytes: int
    num_cpus: float = 1.0
    name: str = ""
    #: the serve token's SHA-256 (serve/auth.py); None: no token; never in a repr
    token_digest: Optional[str] = field(default=None, repr=False)
    stage_timing: bool = True  # Server-Timing on every answer and the stage histograms (serve.stage_timing)
    version: str = MODEL_VERSION  # the model's version this deployment is (`vitdeploy rollout`: 2, 3...)

    def threads(self) -> Tuple[int, int]:
        """(ONNX Runtime intra-op threads, decode threads) of one replica: its share of the cores
        (``num_cpus_per_replica``), unless ``runtime.threads`` says otherwise.

        The ``concurrent_batches`` model calls share the cores: each call's thread works and the
        session's pool adds intra-op - 1 threads to each, so intra-op = cores // concurrent_batches
        keeps the threads at the cores. Cores x concurrent_batches threads oversubscribed them
        (ViT-S/16 on 2 cores, 2 calls of 2 threads: ~15% more replica CPU per image than 2 of 1)."""
        cores = max(1, math.ceil(self.num_cpus)) if self.num_cpus > 0 else 1
        intra_op = self.options.threads or max(1, cores // max(1, self.concurrent_batches))
        return intra_op, max(1, min(self.decode_threads, cores))


def deployment_options(sv: Any, replicas: int) -> Dict[str, Any]:
    """Ray Serve deployment options from the ``serve:`` section (``replicas``: the fixed count
    when ``serve.autoscaling`` is not set)."""
    opts: Dict[str, Any] = dict(
        max_ongoing_requests=sv.max_ongoing_requests,
        max_queued_requests=sv.max_queued_requests,
        graceful_shutdown_timeout_s=sv.graceful_shutdown_timeout_s,
        graceful_shutdown_wait_loop_s=0.5,
        health_check_period_s=10.0,
        ray_actor_options={
            "num_cpus": sv.num_cpus_per_replica,
            "num_gpus": sv.num_gpus_per_replica,
            **({"resources": dict(sv.resources_per_replica)} if sv.resources_per_replica else {}),
        },
    )
    if sv.autoscaling is not None:
        a = sv.autoscaling
        opts["autoscaling_config"] = {
            "min_replicas": a.min_replicas,
            "max_replicas": a.max_replicas,
            "initial_replicas": max(a.min_replicas, 1),
            "target_ongoing_requests": a.target_ongoing_requests,
        }
    else:
        opts["num_replicas"] = replicas
    return opts


__all__ = ["ReplicaSpec", "deployment_options"]
