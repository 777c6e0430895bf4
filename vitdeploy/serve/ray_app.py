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
from dataclasses import replace
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from ray import serve
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..base.errors import MethodNotAllowedError, NotFoundError, RequestError
from ..base.ray_private import with_version
from ..runtime.backends import first_line
from . import auth, kserve_http, protocol, stage_timing, tracing
from .http_errors import MAX_REASON, error_body, status_of
from .image_sizes import SizedPredictors, by_shape, requested_size
from .kserve_grpc import KServeGrpcMethods, register_proto_modules
from .kserve_model import InferenceStats, model_config
from .replica_spec import ReplicaSpec, deployment_options
from .request_images import ClientGone, body_of, images_of
from .rollout.routes import VERSIONS_HEADER, parse_versions
from .rollout.shadow import ShadowMixin

log = logging.getLogger(__name__)


api = FastAPI(title="vitdeploy serve", docs_url=None, redoc_url=None, openapi_url=None, **tracing.fastapi_options())


def _error(exc: BaseException) -> Response:
    """The one way a refusal leaves the replica: ``{"error": ...}`` with the status of its type."""
    status = status_of(exc)
    if status >= 500:
        log.error("request failed: %s", first_line(exc), exc_info=not isinstance(exc, RequestError))
    headers = {503: {"Retry-After": "1"}, 401: {k.decode(): v.decode() for k, v in [auth.CHALLENGE]}}.get(status)
    return Response(error_body(exc), status_code=status, media_type="application/json", headers=headers)


@api.exception_handler(StarletteHTTPException)
async def _framework_error(request: Request, exc: StarletteHTTPException) -> Response:
    kind = {404: NotFoundError, 405: MethodNotAllowedError}.get(exc.status_code)
    if kind is not None:
        return _error(kind(f"{request.method} {request.url.path}: {exc.detail}"))
    return Response(
        error_body(first_line(exc.detail, MAX_REASON)), status_code=exc.status_code, media_type="application/json"
    )


@api.exception_handler(RequestValidationError)
async def _validation_error(request: Request, exc: RequestValidationError) -> Response:
    return _error(RequestError(f"{request.url.path}: invalid request ({first_line(exc.errors())})"))


@api.exception_handler(Exception)
async def _unexpected(request: Request, exc: Exception) -> Response:
    return _error(exc)


def open_artifacts(source: Any) -> Any:
    """The replica's verified Artifacts from a path, a URI or an ObjectRef of an ArtifactBundle."""
    from ..runtime.artifact_transfer import fetch_uri, materialize
    from ..runtime.artifacts import Artifacts

    if isinstance(source, str) and "://" in source:
        return fetch_uri(source)
    if isinstance(source, str):
        return Artifacts.open(source)
    import ray

    return materialize(ray.get(source))


@serve.deployment(name="ViTClassifier")
@serve.ingress(api)
class ViTClassifier(KServeGrpcMethods, ShadowMixin):
    """One replica: a Predictor, a decoding thread pool and the batched model call; the KServe v2
    gRPC methods (``ModelInfer``...) come from :class:`KServeGrpcMethods` (Ray Serve's gRPC proxy), the copies
    of a rollout's shadow traffic from :class:`ShadowMixin` (serve/rollout/shadow.py)."""

    def __init__(self, spec: ReplicaSpec) -> None:
        from ..runtime.predictor import Predictor

        self.spec = spec
        intra_op, decode_threads = spec.threads()
        self.predictor = Predictor.from_artifacts(
            open_artifacts(spec.artifacts),
            backend=spec.backend,
            options=replace(spec.options, threads=intra_op),
            max_pixels=spec.max_pixels,
        )
        self.name = spec.name or protocol.model_name(self.predictor.artifacts.name)
        self.version = spec.version
        self._init_shadow()
        self._fault: Optional[str] = None
        # One warm-up call: the first request does not pay for the backend's lazy set-up, and C is known.
        warm = self.predictor.predict_logits(np.zeros((1, *self.predictor.input_shape), np.float32))
        self.num_classes = int(warm.shape[1])
        self.top_k = max(1, min(spec.top_k, self.num_classes))
        # which export this replica runs, on which backend: in the v2 metadata and /config (validate --url)
        artifacts = self.predictor.artifacts
        self.export = protocol.export_parameters(
            artifacts.manifest_sha256, self.predictor.backend_name, artifacts.image_sizes
        )
        self.sized = SizedPredictors(self.predictor)  # one Predictor per size asked (export.image_sizes)
        self.preprocessor = self.predictor.preprocessor
        self.stats = InferenceStats()  # GET /v2/models/<name>/stats (this replica's requests)
        self.timing = stage_timing.open_metrics(
            spec.stage_timing, self.name, getattr(spec, "version", protocol.MODEL_VERSION), self.predictor.backend_name
        )
        # the stages as spans when Ray Serve traces this replica (serve/tracing.py: OTEL_EXPORTER_OTLP_ENDPOINT)
        self.spans = tracing.stage_spans(self.name, self.version, self.predictor.backend_name) if self.timing else None
        register_proto_modules()  # gRPC requests arrive pickled from Ray's gRPC proxy (serve.grpc_port)
        self._decode_pool = ThreadPoolExecutor(decode_threads, thread_name_prefix="vitdeploy-decode")
        self._infer_pool = ThreadPoolExecutor(spec.concurrent_batches, thread_name_prefix="vitdeploy-infer")
        # Ray's batch handler, built here because its settings come from pipeline.yaml (serve:).
        self.run_batch = serve.batch(
            max_batch_size=spec.max_batch_size,
            batch_wait_timeout_s=spec.batch_wait_timeout_s,
            max_concurrent_batches=spec.concurrent_batches,
        )(self._infer_batch)
        log.info(
            "replica ready: %s (%d intra-op, %d decode threads)", self.predictor.describe(), intra_op, decode_threads
        )

    def reconfigure(self, config: Dict[str, Any]) -> None:
        """Ray Serve's in-place update (the deployment's ``user_config``): the batch settings change on the
        running replica, without a restart (`vitdeploy tune` measures them so)."""
        if "max_batch_size" in config:
            self.run_batch.set_max_batch_size(int(config["max_batch_size"]))
        if "batch_wait_timeout_s" in config:
            self.run_batch.set_batch_wait_timeout_s(float(config["batch_wait_timeout_s"]))
        log.info("replica reconfigured: %s", config)

    def check_health(self) -> None:
        """Ray Serve's health check (every 10 s): a replica whose model call failed is replaced."""
        if self._fault is not None:
            raise RuntimeError(f"the model call failed: {self._fault}")

    def __del__(self) -> None:  # Ray Serve calls it when the replica stops (after draining)
        for pool in (getattr(self, "_decode_pool", None), getattr(self, "_infer_pool", None)):
            if pool is not None:
                pool.shutdown(wait=False)
        if getattr(self, "predictor", None) is not None:
            self.predictor.close()

    # ------------------------------------------------------------------ batching

    async def _infer_batch(self, items: list[Tuple[np.ndarray, bool]]) -> list[Tuple[np.ndarray, Any, Any]]:
        """Images of concurrent requests (one (3, H, W) array per call, with whether its request asked for the
        patch tokens) -> one (logits row, patch tokens or None, the call's ``stage_timing.ModelCall``) each
        (``self.run_batch``, Ray's ``@serve.batch`` around this method, gathers them). One model call per image
        size in the batch (requests may ask for different sizes: image_sizes.py), never two sizes in one; the
        patch tokens are computed for a call when one of its requests asked for them."""
        loop = asyncio.get_running_loop()
        out: list[Any] = [None] * len(items)
        for group in by_shape([image.shape for image, _ in items]):
            predictor = self.sized.for_side(items[group[0]][0].shape[-1])
            batch = np.stack([items[i][0] for i in group])
            want = any(items[i][1] for i in group)
            start = time.perf_counter_ns()
            try:
                logits, tokens = await loop.run_in_executor(self._infer_pool, predictor.predict_outputs, batch, want)
            except Exception as exc:
                self._fault = first_line(exc)  # the backend, not a request: check_health has Ray replace the replica
                raise
            call = stage_timing.ModelCall(time.perf_counter_ns() - start, len(group))
            if self.timing is not None:
                self.timing.model_call(call.batch)
            for j, i in enumerate(group):
                out[i] = (logits[j], tokens[j] if items[i][1] else None, call)
        return out

    async def _decode(self, blob: bytes, name: str, preprocessor: Any) -> np.ndarray:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._decode_pool, protocol.decode_image, blob, preprocessor, name)

    async def _classify(
        self,
        blobs: list[tuple[str, bytes]],
        times: Optional[Dict[str, int]] = None,
        patch_tokens: bool = False,
        size: Optional[int] = None,
    ) -> Tuple[List[Optional[np.ndarray]], Dict[int, Any], List[Any]]:
        """Decode in threads (at ``size``, one of an export's image_sizes; None: the base size), then batch:
        (logits row or None per image, {index: RequestError}, patch tokens or None per image: computed with
        ``patch_tokens``); the ns spent decoding, waiting for a batch and in the model call go to ``times``."""
        preprocessor = self.sized.at(size).preprocessor  # RequestError (400) naming the sizes that work
        t0 = time.perf_counter_ns()
        decoded = await asyncio.gather(*(self._decode(b, n, preprocessor) for n, b in blobs), return_exceptions=True)
        t1 = time.perf_counter_ns()
        errors: dict[int, Any] = {}
        for i, item in enumerate(decoded):
            if isinstance(item, RequestError):
                errors[i] = item
            elif isinstance(item, BaseException):
                raise item
        good = [i for i in range(len(blobs)) if i not in errors]
        rows = await asyncio.gather(*(self.run_batch((decoded[i], patch_tokens)) for i in good))
        logits: List[Optional[np.ndarray]] = [None] * len(blobs)
        tokens: List[Any] = [None] * len(blobs)
        for i, (row, patches, _) in zip(good, rows):
            logits[i], tokens[i] = row, patches
        if times is not None:
            infer = max((call.ns for _, _, call in rows), default=0)
            times.update(compute_input=t1 - t0, compute_infer=infer, queue=max(0, time.perf_counter_ns() - t1 - infer))
            times["batch"] = max((call.batch for _, _, call in rows), default=0)
        return logits, errors, tokens

    # ------------------------------------------------------------------ requests

    @api.post("/predict")
    @api.post("/versions/{version}/predict")
    async def predict(self, request: Request, version: Optional[str] = None) -> Response:
        """A raw image body, or multipart with one file per image -> a JSON list, one `predict --json`
        object per image (an unreadable image in a multipart request gets its {"path", "error"})."""
        clock, times = stage_timing.start(self.spec.stage_timing), {}
        try:
            self._authorize(request)
            self._known(version)
            size = requested_size(request.query_params.get(protocol.IMAGE_SIZE_PARAM), protocol.IMAGE_SIZE_PARAM)
            blobs = await images_of(request, self.spec.max_request_bytes, self.spec.max_images_per_request)
            protocol.check_image_count(len(blobs), self.spec.max_images_per_request)
            stage_timing.lap(clock, "read")
            start = time.perf_counter_ns()
            logits, errors, _ = await self._classify(blobs, times, size=size)
            stage_timing.batched(clock, times)
        except ClientGone:
            return Response(status_code=499)
        except RequestError as exc:
            return _error(exc)
        if size is None:  # a copy asks the candidate at its base size: a sized request is not compared
            self.copy_to_candidate(request.headers, [b for _, b in blobs], logits, time.perf_counter_ns() - start)
        if len(errors) == len(blobs):
            return _error(errors[0])
        good = [i for i, row in enumerate(logits) if row is not None]
        preds = self.predictor.predictions_from_logits(np.stack([logits[i] for i in good]), self.top_k)
        by_index = dict(zip(good, preds))
        records = [
            {"path": name, **by_index[i].to_dict()} if i in by_index else protocol.error_record(name, errors[i])
            for i, (name, _) in enumerate(blobs)
        ]
        return self._timed(JSONResponse(records), clock)

    def _timed(self, response: Response, clock: Optional[stage_timing.StageClock]) -> Response:
        """``response`` with the request's ``Server-Timing`` (its last lap taken, its histograms observed, its
        stage spans made)."""
        value = stage_timing.finish(clock, self.timing, self.spans)
        if value is not None:
            response.headers[stage_timing.HEADER] = value
        return response

    # ------------------------------------------------------------------ KServe v2 / Triton protocol
    # The application's route prefix is /v2/models/<name>: the routes below are relative to it. The
    # server-level routes (/v2, /v2/health/live, /v2/health/ready) are answered by the proxy's guard
    # (proxy_guard.py), so that a busy model never delays them.

    def _authorize(self, request: Request) -> None:
        """UnauthorizedError (401) without the serve token (serve/auth.py), on every route but ``/ready``."""
        auth.authorize(request.headers.get("authorization"), self.spec.token_digest)

    def _known(self, version: Optional[str] = None, model: Optional[str] = None) -> None:
        """NotFoundError for another version (or, on gRPC, where the model is named, another model)."""
        if model is not None and model != self.name:
            raise NotFoundError(f"unknown model {model!r}; this application serves {self.name!r}")
        if version not in (None, "", self.version):
            raise NotFoundError(f"model {self.name!r} has no version {version!r} here (this is v{self.version})")

    @api.get("/")
    @api.get("/versions/{version}")
    async def model_metadata(self, request: Request, version: Optional[str] = None) -> Response:
        try:
            self._authorize(request)
            self._known(version)
        except RequestError as exc:
            return _error(exc)
        meta = protocol.model_metadata(
            self.name,
            self.num_classes,
            self.top_k,
            "ray_serve",
            self.predictor.is_embedding,
            self.sized.patch_shape,
            self.export,
        )
        meta["versions"] = parse_versions(request.headers.get(VERSIONS_HEADER), self.version)  # the guard's list
        return JSONResponse(meta)

    @api.get("/config")
    @api.get("/versions/{version}/config")
    async def model_config(self, request: Request, version: Optional[str] = None) -> Response:
        try:
            self._authorize(request)
            self._known(version)
        except RequestError as exc:
            return _error(exc)
        limit, embedding = self.spec.max_images_per_request, self.predictor.is_embedding
        patches = self.sized.patch_shape
        config = model_config(
            self.name,
            self.num_classes,
            self.top_k,
            limit,
            embedding=embedding,
            patch_shape=patches,
            parameters=self.export,
        )
        return JSONResponse(config)

    @api.get("/stats")
    @api.get("/versions/{version}/stats")
    async def model_stats(self, request: Request, version: Optional[str] = None) -> Response:
        try:
            self._authorize(request)
            self._known(version)
        except RequestError as exc:
            return _error(exc)
        return JSONResponse(self.stats.to_json(self.name, self.version))

    @api.get("/ready")
    @api.get("/versions/{version}/ready")
    async def model_ready(self, version: Optional[str] = None) -> Response:
        try:
            self._known(version)
        except RequestError as exc:
            return _error(exc)
        return Response(status_code=200)

    @api.post("/infer")
    @api.post("/versions/{version}/infer")
    async def infer(self, request: Request, version: Optional[str] = None) -> Response:
        """v2 inference: input IMAGES (BYTES, [N] or [N, 1]; gzip/deflate bodies inflated within the byte
        limit) -> LOGITS, TOPK_LABELS, TOPK_SCORES (an embedding model: EMBEDDINGS, and PATCH_TOKENS when named
        in ``outputs``); any bad image fails the
        request (400, one line)."""
        start, times = time.perf_counter_ns(), {}
        clock = stage_timing.start(self.spec.stage_timing)
        try:
            self._authorize(request)
            self._known(version)
            body = await body_of(request, self.spec.max_request_bytes)
            req = kserve_http.parse_infer_request(
                body,
                request.headers.get(kserve_http.HEADER_LENGTH),
                self.spec.max_images_per_request,
                protocol.served_outputs(self.predictor.is_embedding, self.predictor.has_patch_tokens),
            )
            names = [f"{protocol.INPUT}[{i}]" for i in range(len(req.images))]
            want = protocol.PATCH_TOKENS in req.outputs
            stage_timing.lap(clock, "read")
            t_classify = time.perf_counter_ns()
            logits, errors, tokens = await self._classify(list(zip(names, req.images)), times, want, req.image_size)
            stage_timing.batched(clock, times)
            if errors:
                raise errors[min(errors)]
            if req.image_size is None:
                self.copy_to_candidate(request.headers, req.images, logits, time.perf_counter_ns() - t_classify)
        except ClientGone:
            return Response(status_code=499)
        except RequestError as exc:
            self.stats.failure(time.perf_counter_ns() - start)
            return _error(exc)
        t_out = time.perf_counter_ns()
        out, headers = kserve_http.encode_infer_response(
            self.name,
            req,
            np.stack(logits),
            self.predictor.labels,
            self.top_k,
            self.predictor.is_embedding,
            np.stack(tokens) if want else None,
            self.version,
            scores=self.predictor.scores,
        )
        end = time.perf_counter_ns()
        self.stats.success(
            len(req.images),
            end - start,
            times.get("queue", 0),
            times.get("compute_input", 0),
            times.get("compute_infer", 0),
            end - t_out,
        )
        media = headers.pop("Content-Type")
        return self._timed(Response(out, media_type=media, headers=headers), clock)


def build_app(
    spec: ReplicaSpec,
    sv: Any,
    replicas: int,
    user_config: Optional[Dict[str, Any]] = None,
    version: Optional[str] = None,
) -> Any:
    """The bound Serve application of one model, with the deployment options of the ``serve:`` section.

    ``user_config`` ({"max_batch_size", "batch_wait_timeout_s"}) is applied by ``reconfigure``. ``version``: the
    same string on a later ``serve.run`` says the replicas' code and arguments are unchanged, so Ray Serve applies
    a new ``user_config`` or replica count to the running replicas instead of replacing them (without it Ray
    draws a random version for every run). Ray accepts it only as an internal option (base/ray_private.py): where
    that is refused the replicas are replaced, as before."""
    deployment = ViTClassifier.options(
        **deployment_options(sv, replicas), **({"user_config": user_config} if user_config else {})
    )
    if version:
        try:
            deployment = with_version(deployment, version)
        except (TypeError, ValueError) as exc:
            log.warning("Ray Serve refused a deployment version (%s): every change replaces the replicas", exc)
    return deployment.bind(spec)
