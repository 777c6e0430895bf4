"""The Ray Serve application of `vitdeploy serve`: one deployment around the Predictor.

Everything a server needs that is not vitdeploy's own comes from Ray Serve: the HTTP proxy,
replicas and their placement (``num_replicas``, ``ray_actor_options``), dynamic batching
(``@serve.batch``), the request queue and its 503 (``max_ongoing_requests``,
``max_queued_requests``), graceful draining (``graceful_shutdown_timeout_s``) and the Prometheus
metrics (``ray_serve_*``, among them ``ray_serve_actual_batch_size`` of the batch handler).
The routes are a FastAPI app mounted with ``@serve.ingress``.

Per request, in one replica: the body is read (size-capped), each image is decoded and
preprocessed in the replica's thread pool (:func:`vitdeploy.serve.protocol.decode_image`, the
runtime's preprocessing), then every image is one call of the ``@serve.batch`` method, which
stacks the images of concurrent requests into one model call on the Predictor's backend.

Importing this module imports Ray and FastAPI: only ``vitdeploy serve`` does (lazily).
"""

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from ray import serve

from ..runtime.backends.base import BackendOptions
from . import content_encoding, protocol
from .kserve_grpc import KServeGrpcMethods, register_proto_modules
from .kserve_model import InferenceStats, model_config

log = logging.getLogger(__name__)

APP_NAME = "vitdeploy"
_RAW_TYPES = ("image/", "application/octet-stream")


@dataclass(frozen=True)
class ReplicaSpec:
    """What each replica needs to open its Predictor and answer requests (sent to the replicas)."""

    artifacts: str
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


api = FastAPI(title="vitdeploy serve", docs_url=None, redoc_url=None, openapi_url=None)


def _error(exc: protocol.RequestError) -> JSONResponse:
    return JSONResponse(exc.to_json(), status_code=exc.status)


@serve.deployment(name="ViTClassifier")
@serve.ingress(api)
class ViTClassifier(KServeGrpcMethods):
    """One replica: a Predictor, a decoding thread pool and the batched model call; the KServe v2
    gRPC methods (``ModelInfer``...) come from :class:`KServeGrpcMethods` (Ray Serve's gRPC proxy)."""

    def __init__(self, spec: ReplicaSpec) -> None:
        from ..runtime.predictor import Predictor

        self.spec = spec
        self.predictor = Predictor.from_artifacts(spec.artifacts, backend=spec.backend, options=spec.options,
                                                  max_pixels=spec.max_pixels)
        self.name = protocol.model_name(self.predictor.artifacts.name)
        # One warm-up call: the first request does not pay for the backend's lazy set-up, and C is known.
        warm = self.predictor.predict_logits(np.zeros((1, *self.predictor.input_shape), np.float32))
        self.num_classes = int(warm.shape[1])
        self.top_k = max(1, min(spec.top_k, self.num_classes))
        self.preprocessor = self.predictor.preprocessor
        self.stats = InferenceStats()  # GET /v2/models/<name>/stats (this replica's requests)
        register_proto_modules()  # gRPC requests arrive pickled from Ray's gRPC proxy (serve.grpc_port)
        self._decode_pool = ThreadPoolExecutor(spec.decode_threads, thread_name_prefix="vitdeploy-decode")
        self._infer_pool = ThreadPoolExecutor(spec.concurrent_batches, thread_name_prefix="vitdeploy-infer")
        # Ray's batch handler, built here because its settings come from pipeline.yaml (serve:).
        self.run_batch = serve.batch(max_batch_size=spec.max_batch_size, batch_wait_timeout_s=spec.batch_wait_timeout_s,
                                     max_concurrent_batches=spec.concurrent_batches)(self._infer_batch)
        log.info("replica ready: %s", self.predictor.describe())

    def __del__(self) -> None:  # Ray Serve calls it when the replica stops (after draining)
        for pool in (getattr(self, "_decode_pool", None), getattr(self, "_infer_pool", None)):
            if pool is not None:
                pool.shutdown(wait=False)
        if getattr(self, "predictor", None) is not None:
            self.predictor.close()

    # ------------------------------------------------------------------ batching

    async def _infer_batch(self, images: list[np.ndarray]) -> list[Tuple[np.ndarray, int]]:
        """Images of concurrent requests (one (3, H, W) array per call) -> one (logits row, ns of the
        batch's model call) each (``self.run_batch``, Ray's ``@serve.batch`` around this method, gathers them)."""
        batch = np.stack(images)
        loop = asyncio.get_running_loop()
        start = time.perf_counter_ns()
        logits = await loop.run_in_executor(self._infer_pool, self.predictor.predict_logits, batch)
        took = time.perf_counter_ns() - start
        return [(row, took) for row in logits]

    async def _decode(self, blob: bytes, name: str) -> np.ndarray:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._decode_pool, protocol.decode_image, blob, self.preprocessor, name)

    async def _classify(self, blobs: list[tuple[str, bytes]],
                        times: Optional[Dict[str, int]] = None) -> Tuple[List[Optional[np.ndarray]], Dict[int, Any]]:
        """Decode in threads, then batch: (logits row or None per image, {index: RequestError}); the ns
        spent decoding, waiting for a batch and in the model call go to ``times`` when given."""
        t0 = time.perf_counter_ns()
        decoded = await asyncio.gather(*(self._decode(b, n) for n, b in blobs), return_exceptions=True)
        t1 = time.perf_counter_ns()
        errors: dict[int, Any] = {}
        for i, item in enumerate(decoded):
            if isinstance(item, protocol.RequestError):
                errors[i] = item
            elif isinstance(item, BaseException):
                raise item
        good = [i for i in range(len(blobs)) if i not in errors]
        rows = await asyncio.gather(*(self.run_batch(decoded[i]) for i in good))
        logits: List[Optional[np.ndarray]] = [None] * len(blobs)
        for i, (row, _) in zip(good, rows):
            logits[i] = row
        if times is not None:
            infer = max((ns for _, ns in rows), default=0)
            times.update(compute_input=t1 - t0, compute_infer=infer,
                         queue=max(0, time.perf_counter_ns() - t1 - infer))
        return logits, errors

    # ------------------------------------------------------------------ requests

    def _check_length(self, request: Request) -> int:
        """413 when the declared Content-Length is over serve.max_request_mb; returns the limit."""
        limit = self.spec.max_request_bytes
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            raise protocol.RequestError(f"request body of {int(declared)} bytes is over the limit of {limit} bytes "
                                        f"(serve.max_request_mb)", 413, "body_too_large")
        return limit

    async def _body(self, request: Request) -> bytes:
        limit = self._check_length(request)
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise protocol.RequestError(f"request body is over the limit of {limit} bytes (serve.max_request_mb)",
                                            413, "body_too_large")
            chunks.append(chunk)
        return b"".join(chunks)

    async def _images(self, request: Request) -> list[tuple[str, bytes]]:
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype == "multipart/form-data":
            return await self._multipart(request)
        if ctype and not ctype.startswith(_RAW_TYPES):
            raise protocol.RequestError(
                f"content type {ctype!r} is not accepted; send the image itself (Content-Type: image/jpeg, image/png, "
                f"application/octet-stream) or multipart/form-data with one file per image", 415, "content_type")
        body = await self._body(request)
        if not body:
            raise protocol.RequestError("empty request body; send an encoded image (JPEG, PNG, ...)", 400, "empty")
        return [("body", body)]

    async def _multipart(self, request: Request) -> list[tuple[str, bytes]]:
        from starlette.datastructures import UploadFile
        from starlette.exceptions import HTTPException

        self._check_length(request)
        limit = self.spec.max_images_per_request
        try:
            form = await request.form(max_files=limit + 1, max_fields=limit + 1)
        except HTTPException as exc:
            too_many = "too many" in str(exc.detail).lower()
            raise protocol.RequestError(
                f"too many files in one request, the limit is {limit}; split the request" if too_many
                else f"malformed multipart body: {exc.detail}", 413 if too_many else 400,
                "too_many" if too_many else "bad_request") from None
        try:
            files = [(v.filename or k, v) for k, v in form.multi_items() if isinstance(v, UploadFile)]
            protocol.check_image_count(len(files), limit)
            return [(name, await f.read()) for name, f in files]
        finally:
            await form.close()

    @api.post("/predict")
    async def predict(self, request: Request) -> Response:
        """A raw image body, or multipart with one file per image -> a JSON list, one `predict --json`
        object per image (an unreadable image in a multipart request gets its {"path", "error"})."""
        try:
            blobs = await self._images(request)
            protocol.check_image_count(len(blobs), self.spec.max_images_per_request)
            logits, errors = await self._classify(blobs)
        except protocol.RequestError as exc:
            return _error(exc)
        if len(errors) == len(blobs):
            return _error(errors[0])
        good = [i for i, row in enumerate(logits) if row is not None]
        preds = self.predictor.predictions_from_logits(np.stack([logits[i] for i in good]), self.top_k)
        by_index = dict(zip(good, preds))
        records = [{"path": name, **by_index[i].to_dict()} if i in by_index else protocol.error_record(name, errors[i])
                   for i, (name, _) in enumerate(blobs)]
        return JSONResponse(records)

    # ------------------------------------------------------------------ KServe v2 / Triton protocol

    @api.get("/v2")
    async def server_metadata(self) -> JSONResponse:
        from .. import __version__

        return JSONResponse({"name": "vitdeploy", "version": __version__,
                             "extensions": ["binary_tensor_data", "model_configuration", "statistics"]})

    @api.get("/v2/health/live")
    async def live(self) -> Response:
        return Response(status_code=200)

    @api.get("/v2/health/ready")
    async def ready(self) -> Response:
        return Response(status_code=200)

    def _known(self, model: str, version: Optional[str] = None) -> None:
        if model != self.name:
            raise protocol.RequestError(f"unknown model {model!r}; this server serves {self.name!r}", 404, "not_found")
        if version not in (None, "", protocol.MODEL_VERSION):
            raise protocol.RequestError(f"model {model!r} has no version {version!r} (versions: "
                                        f"{protocol.MODEL_VERSION})", 404, "not_found")

    @api.get("/v2/models/stats")  # before /v2/models/{model}, which would take "stats" for a model name
    async def all_stats(self) -> Response:
        return JSONResponse(self.stats.to_json(self.name))

    @api.get("/v2/models/{model}")
    @api.get("/v2/models/{model}/versions/{version}")
    async def model_metadata(self, model: str, version: Optional[str] = None) -> Response:
        try:
            self._known(model, version)
        except protocol.RequestError as exc:
            return _error(exc)
        return JSONResponse(protocol.model_metadata(self.name, self.num_classes, self.top_k, platform="ray_serve"))

    @api.get("/v2/models/{model}/config")
    @api.get("/v2/models/{model}/versions/{version}/config")
    async def model_config(self, model: str, version: Optional[str] = None) -> Response:
        try:
            self._known(model, version)
        except protocol.RequestError as exc:
            return _error(exc)
        return JSONResponse(model_config(self.name, self.num_classes, self.top_k, self.spec.max_images_per_request))

    @api.get("/v2/models/{model}/stats")
    @api.get("/v2/models/{model}/versions/{version}/stats")
    async def model_stats(self, model: str, version: Optional[str] = None) -> Response:
        try:
            self._known(model, version)
        except protocol.RequestError as exc:
            return _error(exc)
        return JSONResponse(self.stats.to_json(self.name))

    @api.get("/v2/models/{model}/ready")
    @api.get("/v2/models/{model}/versions/{version}/ready")
    async def model_ready(self, model: str, version: Optional[str] = None) -> Response:
        try:
            self._known(model, version)
        except protocol.RequestError as exc:
            return _error(exc)
        return Response(status_code=200)

    @api.post("/v2/models/{model}/infer")
    @api.post("/v2/models/{model}/versions/{version}/infer")
    async def infer(self, model: str, request: Request, version: Optional[str] = None) -> Response:
        """v2 inference: input IMAGES (BYTES, [N] or [N, 1]; gzip/deflate bodies inflated within the byte
        limit) -> LOGITS, TOPK_LABELS, TOPK_SCORES; any bad image fails the request (400, one line)."""
        start, times = time.perf_counter_ns(), {}
        try:
            self._known(model, version)
            self._check_length(request)
            body = await content_encoding.read_body(request.stream(), request.headers.get("content-encoding"),
                                                    self.spec.max_request_bytes)
            req = protocol.parse_infer_request(body, request.headers.get(protocol.HEADER_LENGTH),
                                               self.spec.max_images_per_request)
            names = [f"{protocol.INPUT}[{i}]" for i in range(len(req.images))]
            logits, errors = await self._classify(list(zip(names, req.images)), times)
            if errors:
                raise errors[min(errors)]
        except protocol.RequestError as exc:
            self.stats.failure(time.perf_counter_ns() - start)
            return _error(exc)
        t_out = time.perf_counter_ns()
        out, headers = protocol.encode_infer_response(self.name, req, np.stack(logits), self.predictor.labels,
                                                      self.top_k)
        end = time.perf_counter_ns()
        self.stats.success(len(req.images), end - start, times.get("queue", 0), times.get("compute_input", 0),
                           times.get("compute_infer", 0), end - t_out)
        media = headers.pop("Content-Type")
        return Response(out, media_type=media, headers=headers)


def build_app(spec: ReplicaSpec, *, replicas: int, num_cpus: float, num_gpus: float, max_ongoing_requests: int,
              max_queued_requests: int, graceful_shutdown_timeout_s: float) -> Any:
    """The bound Serve application, with the deployment options from the ``serve:`` section."""
    return ViTClassifier.options(
        num_replicas=replicas,
        max_ongoing_requests=max_ongoing_requests,
        max_queued_requests=max_queued_requests,
        graceful_shutdown_timeout_s=graceful_shutdown_timeout_s,
        graceful_shutdown_wait_loop_s=0.5,
        ray_actor_options={"num_cpus": num_cpus, "num_gpus": num_gpus},
    ).bind(spec)
