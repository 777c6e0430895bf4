"""KServe v2 over gRPC for `vitdeploy serve`: Triton's ``inference.GRPCInferenceService`` hosted by
Ray Serve's gRPC proxy, so ``tritonclient.grpc`` works against `vitdeploy serve` as against Triton.

Ray Serve's proxy registers the servicer function named in ``grpc_servicer_functions`` (the stubs
that ship with ``tritonclient[grpc]``: :data:`SERVICER_FUNCTION`) and calls the deployment's method
of the same name as the RPC (``ModelInfer``, ``ModelMetadata``...) with the request message; a
status is returned through Ray's ``grpc_context``. :class:`KServeGrpcMethods` is mixed into the
deployment class: an inference request is turned into the HTTP protocol's JSON + binary form and
parsed by :func:`vitdeploy.serve.kserve_http.parse_infer_request`, so both transports check a request
the same way and give the same one-line reasons. Statuses: 401 -> UNAUTHENTICATED (the serve token,
in the ``authorization`` metadata: serve/auth.py), 404 -> NOT_FOUND, 503 -> UNAVAILABLE, any other
refusal -> INVALID_ARGUMENT (Triton's code for a bad request).

Only unary RPCs are served (``ModelStreamInfer``, the shared-memory and repository RPCs are not).
Imports ``tritonclient.grpc`` when a method runs: the server needs ``tritonclient[grpc]`` only when
``serve.grpc_port`` is set.
"""

from __future__ import annotations

import json
import logging
import random
import time
from typing import Any

import numpy as np

from ..base.errors import BodyTooLargeError
from ..base.ray_private import wrap_grpc_handlers
from . import auth, kserve_http, protocol, stage_timing
from .http_errors import status_of
from .kserve_model import model_config
from .rollout.routes import HEADER_PREFIX

#: What Ray Serve's gRPC proxy imports and calls to register the service (:func:`add_servicer`).
SERVICER_FUNCTION = "vitdeploy.serve.kserve_grpc.add_servicer"
log = logging.getLogger(__name__)


def _pb() -> Any:
    from tritonclient.grpc import service_pb2

    return service_pb2


def register_proto_modules() -> bool:
    """Make tritonclient's messages picklable: their classes name the modules they were generated as
    (``grpc_service_pb2``, ``model_config_pb2``), which are not importable, and Ray pickles each
    request and response between its gRPC proxy and the replica. Registers those names for the
    modules tritonclient ships; False when tritonclient[grpc] is not installed."""
    import sys

    try:
        from tritonclient.grpc import model_config_pb2, service_pb2
    except ImportError:
        return False
    for module, probe in ((service_pb2, "ServerLiveRequest"), (model_config_pb2, "ModelConfig")):
        sys.modules.setdefault(getattr(module, probe).__module__, module)
    return True


def add_servicer(servicer: Any, server: Any) -> None:
    """The servicer function Ray Serve's gRPC proxy calls: tritonclient's, after :func:`register_proto_modules`,
    its unary calls sent once more when their replica died (:func:`_retry_lost`)."""
    from tritonclient.grpc import service_pb2_grpc

    register_proto_modules()
    if not wrap_grpc_handlers(server, _retry_lost):  # another Ray: a request whose replica dies gets Ray's INTERNAL
        log.warning("Ray's gRPC proxy has no service_handler_factory: lost requests are not retried")
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)


def lost_replica(code: Any, details: str | None) -> bool:
    """Whether Ray's gRPC proxy failed a call because the replica serving it died: INTERNAL with the text of
    Ray's actor error (the proxy keeps only the text: ``RayActorError``/``ActorDiedError`` messages)."""
    import grpc

    text = (details or "").lower()
    return code == grpc.StatusCode.INTERNAL and "actor" in text and ("died" in text or "before finishing" in text)


def _retry_lost(factory: Any) -> Any:
    """Ray's gRPC handler factory, its unary handlers wrapped: a call whose replica died is sent once more
    (an inference has no side effect; another replica, or the one Ray starts in its place, answers);
    lost twice, UNAVAILABLE with one line (retryable), never Ray's INTERNAL and its internals. Ray Serve
    has no gRPC interceptor option: this wraps its proxy's ``service_handler_factory`` (not a public
    API: base/ray_private.py), as the HTTP guard wraps its proxy."""
    import grpc

    from .proxy_guard import LOST_REQUEST_RETRIES, REPLICA_STOPPED

    def make(service_method: str, streaming_type: Any) -> Any:
        handler = factory(service_method=service_method, streaming_type=streaming_type)
        if getattr(streaming_type, "name", "") != "UNARY_UNARY":
            return handler

        async def unary_unary(request_proto: Any, context: Any) -> Any:
            context = await routed_context(request_proto, context, service_method.endswith("/ModelInfer"))
            for attempt in range(1 + LOST_REQUEST_RETRIES):
                response = await handler(request_proto, context)
                if not lost_replica(context.code(), context.details()):
                    return response
                log.warning(
                    "a gRPC %s lost its replica before it was answered (attempt %d)", service_method, attempt + 1
                )
                context.set_code(grpc.StatusCode.OK)
                context.set_details("")
            context.set_code(grpc.StatusCode.UNAVAILABLE)
            context.set_details(REPLICA_STOPPED)
            return b""

        return unary_unary

    return make


class _Routed:
    """A gRPC call's context whose invocation metadata is the client's but ours (:data:`~.rollout.routes.
    HEADER_PREFIX`: only the routing below sets those), and ``extra``: the Serve application to route it to, the
    shadow copy a live replica sends (what the HTTP guard's headers say)."""

    def __init__(self, context: Any, extra: list[tuple[str, str]]) -> None:
        self._context, self._extra = context, extra

    def invocation_metadata(self) -> tuple:
        given = tuple(self._context.invocation_metadata() or ())
        return (*(kv for kv in given if not str(kv[0]).lower().startswith(HEADER_PREFIX)), *self._extra)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


async def routed_context(request: Any, context: Any, infer: bool = False) -> Any:
    """Once a rollout put versions of a model side by side (serve/rollout/), Ray's gRPC proxy needs the
    ``application`` metadata to choose among them: a call that does not give it is sent to the version it names
    (``model_version``), else to the live one (or, while a promotion splits requests, to the promoted one by its
    share), as the HTTP guard routes a path; an unversioned inference (``infer``) while a shadow runs is tagged for
    a copy to the candidate, as the guard tags an HTTP one. Metadata a client sends under our prefix is dropped."""
    from .rollout.registry import ROUTING
    from .rollout.routes import SHADOW_HEADER, Shadow, split_target

    table = await ROUTING.table()
    if not table:  # no rollout ever ran here: no version to route to, none a copy could go to
        return context
    given = tuple(context.invocation_metadata() or ())
    ours = any(str(key).lower().startswith(HEADER_PREFIX) for key, _ in given)
    model = getattr(request, "model_name", "") or getattr(request, "name", "")
    if not model and len(table) == 1:  # a server-level call (ServerLive...) of a server of one model
        model = next(iter(table))
    entry = table.get(model)
    if entry is None or any(key == "application" for key, _ in given):
        return _Routed(context, []) if ours else context
    version = str(getattr(request, "model_version", "") or getattr(request, "version", "") or "")
    extra = []
    if not version:
        app = split_target(entry, random.random(), "app") or entry["live_app"]
        shadow = entry.get("shadow")
        if infer and shadow:
            extra.append((SHADOW_HEADER, Shadow(shadow["app"], 0, float(shadow["timeout_s"])).header()))
    else:
        app = entry["apps"].get(version) or entry["live_app"]  # an unknown version: the live one says so
    return _Routed(context, [("application", app), *extra]) if app else context


def _status(grpc_context: Any, error: protocol.RequestError) -> None:
    import grpc

    code = {
        401: grpc.StatusCode.UNAUTHENTICATED,
        404: grpc.StatusCode.NOT_FOUND,
        503: grpc.StatusCode.UNAVAILABLE,
    }.get(status_of(error), grpc.StatusCode.INVALID_ARGUMENT)
    if grpc_context is not None:
        grpc_context.set_code(code)
        grpc_context.set_details(str(error))


def http_form(request: Any) -> tuple[bytes, int]:
    """A ``ModelInferRequest`` -> (the v2 HTTP body with binary data, its JSON header's length)."""
    inputs = []
    raw = b""
    for i, tensor in enumerate(request.inputs):
        item: dict[str, Any] = {
            "name": tensor.name,
            "datatype": tensor.datatype,
            "shape": [int(d) for d in tensor.shape],
        }
        if i < len(request.raw_input_contents):
            data = bytes(request.raw_input_contents[i])
        else:
            data = kserve_http.serialize_bytes(list(tensor.contents.bytes_contents))
        if i == 0:
            raw = data
        item["parameters"] = {"binary_data_size": len(data)}
        inputs.append(item)
    outputs = []
    for out in request.outputs:
        params: dict[str, Any] = {}
        if "classification" in out.parameters:
            params["classification"] = int(out.parameters["classification"].int64_param)
        outputs.append({"name": out.name, "parameters": params})
    doc: dict[str, Any] = {"inputs": inputs}
    if outputs:
        doc["outputs"] = outputs
    if request.id:
        doc["id"] = request.id
    if protocol.IMAGE_SIZE_PARAM in request.parameters:  # the size asked of an export for several sizes
        param = request.parameters[protocol.IMAGE_SIZE_PARAM]
        kind = param.WhichOneof("parameter_choice")
        doc["parameters"] = {protocol.IMAGE_SIZE_PARAM: getattr(param, kind) if kind else None}
    head = json.dumps(doc).encode("utf-8")
    return head + (raw if len(inputs) == 1 else b""), len(head)


def infer_response(
    model: str,
    req: kserve_http.InferRequest,
    logits: np.ndarray,
    labels: list[str],
    k: int,
    embedding: bool = False,
    patch_tokens: np.ndarray | None = None,
    version: str = protocol.MODEL_VERSION,
    scores: str = "softmax",
) -> Any:
    """The ``ModelInferResponse`` of ``logits`` (an embedding model's vectors with ``embedding``, its
    ``patch_tokens`` where computed; TOPK_SCORES by ``scores``): the outputs ``req`` asked for, each in
    ``raw_output_contents``."""
    pb = _pb()
    arrays = protocol.output_arrays(logits, labels, k, req.classification, embedding, patch_tokens, scores)
    response = pb.ModelInferResponse(model_name=model, model_version=version, id=req.id or "")
    for name in req.outputs:
        datatype, arr = arrays[name]
        tensor = response.outputs.add()
        tensor.name, tensor.datatype = name, datatype
        tensor.shape.extend(arr.shape)
        raw = kserve_http.serialize_bytes(arr.ravel().tolist()) if datatype == "BYTES" else arr.tobytes()
        response.raw_output_contents.append(raw)
    return response


class KServeGrpcMethods:
    """The RPCs of ``inference.GRPCInferenceService``, as methods of the Ray Serve deployment (which
    provides ``name``, ``num_classes`` (an embedding's dimension), ``top_k``, ``spec``, ``stats``, ``predictor``,
    ``_known``, ``_classify`` and ``copy_to_candidate``)."""

    name: str
    version: str
    num_classes: int
    top_k: int
    spec: Any
    stats: Any
    predictor: Any
    sized: Any  # image_sizes.SizedPredictors: one Predictor per size asked
    export: dict  # protocol.export_parameters: which export, which backend
    timing: Any  # stage_timing.StageMetrics, None when serve.stage_timing is off
    spans: Any  # tracing.StageSpans, None when Ray Serve does not trace this replica
    copy_to_candidate: Any  # rollout/shadow.py's ShadowMixin: a rollout's shadow copy

    async def ServerLive(self, request: Any) -> Any:  # noqa: N802 - the RPC's name
        return _pb().ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any) -> Any:  # noqa: N802
        return _pb().ServerReadyResponse(ready=True)

    async def ServerMetadata(self, request: Any, grpc_context: Any = None) -> Any:  # noqa: N802
        from ..base.version import __version__

        if not self._allowed(grpc_context):
            return _pb().ServerMetadataResponse()
        return _pb().ServerMetadataResponse(
            name="vitdeploy",
            version=__version__,
            extensions=["binary_tensor_data", "model_configuration", "statistics"],
        )

    def _allowed(self, grpc_context: Any) -> bool:
        """False (UNAUTHENTICATED set) without the serve token in the ``authorization`` metadata."""
        metadata = grpc_context.invocation_metadata() if grpc_context is not None else None
        try:
            auth.authorize(auth.from_metadata(metadata), self.spec.token_digest)
        except protocol.RequestError as exc:
            _status(grpc_context, exc)
            return False
        return True

    def _checked(self, request: Any, grpc_context: Any, open_route: bool = False) -> bool:
        """The model and version named exist here, and (but on ``open_route``) the caller has the token."""
        if not open_route and not self._allowed(grpc_context):
            return False
        try:
            self._known(request.version or None, model=request.name)
        except protocol.RequestError as exc:
            _status(grpc_context, exc)
            return False
        return True

    async def ModelReady(self, request: Any, grpc_context: Any = None) -> Any:  # noqa: N802
        return _pb().ModelReadyResponse(ready=self._checked(request, grpc_context, open_route=True))

    async def ModelMetadata(self, request: Any, grpc_context: Any = None) -> Any:  # noqa: N802
        pb = _pb()
        if not self._checked(request, grpc_context):
            return pb.ModelMetadataResponse()
        embedding = self.predictor.is_embedding
        patches = self.sized.patch_shape
        meta = protocol.model_metadata(self.name, self.num_classes, self.top_k, "ray_serve", embedding, patches)
        meta["versions"] = [self.version]
        tensor = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=meta["name"],
            versions=meta["versions"],
            platform=meta["platform"],
            inputs=[tensor(name=t["name"], datatype=t["datatype"], shape=t["shape"]) for t in meta["inputs"]],
            outputs=[tensor(name=t["name"], datatype=t["datatype"], shape=t["shape"]) for t in meta["outputs"]],
        )

    async def ModelConfig(self, request: Any, grpc_context: Any = None) -> Any:  # noqa: N802
        from google.protobuf import json_format
        from tritonclient.grpc import model_config_pb2

        pb = _pb()
        if not self._checked(request, grpc_context):
            return pb.ModelConfigResponse()
        config = model_config(
            self.name,
            self.num_classes,
            self.top_k,
            self.spec.max_images_per_request,
            embedding=self.predictor.is_embedding,
            patch_shape=self.sized.patch_shape,
            parameters=self.export,
        )
        return pb.ModelConfigResponse(config=json_format.ParseDict(config, model_config_pb2.ModelConfig()))

    async def ModelStatistics(self, request: Any, grpc_context: Any = None) -> Any:  # noqa: N802
        from google.protobuf import json_format

        pb = _pb()
        if not self._allowed(grpc_context) or (request.name and not self._checked(request, grpc_context)):
            return pb.ModelStatisticsResponse()
        return json_format.ParseDict(self.stats.to_json(self.name, self.version), pb.ModelStatisticsResponse())

    async def ModelInfer(self, request: Any, grpc_context: Any = None) -> Any:  # noqa: N802
        start, times = time.perf_counter_ns(), {}
        clock = stage_timing.start(self.spec.stage_timing)
        if not self._allowed(grpc_context):
            return _pb().ModelInferResponse()
        try:
            self._known(request.model_version or None, model=request.model_name)
            body, head = http_form(request)
            if len(body) - head > self.spec.max_request_bytes:
                raise BodyTooLargeError(
                    f"request body is over the limit of {self.spec.max_request_bytes} bytes (serve.max_request_mb)"
                )
            served = protocol.served_outputs(self.predictor.is_embedding, self.predictor.has_patch_tokens)
            req = kserve_http.parse_infer_request(body, head, self.spec.max_images_per_request, served)
            names = [f"{protocol.INPUT}[{i}]" for i in range(len(req.images))]
            want = protocol.PATCH_TOKENS in req.outputs
            stage_timing.lap(clock, "read")
            t_classify = time.perf_counter_ns()
            logits, errors, tokens = await self._classify(list(zip(names, req.images)), times, want, req.image_size)
            stage_timing.batched(clock, times)
            if errors:
                raise errors[min(errors)]
            if grpc_context is not None:  # a rollout's shadow: the routing's metadata says where a copy goes
                metadata = dict(grpc_context.invocation_metadata() or ())
                self.copy_to_candidate(metadata, req.images, logits, time.perf_counter_ns() - t_classify)
        except protocol.RequestError as exc:
            self.stats.failure(time.perf_counter_ns() - start)
            _status(grpc_context, exc)
            return _pb().ModelInferResponse()
        t_out = time.perf_counter_ns()
        response = infer_response(
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
        value = stage_timing.finish(clock, self.timing, self.spans)
        if value is not None and grpc_context is not None:
            grpc_context.set_trailing_metadata([(stage_timing.GRPC_KEY, value)])
        return response


__all__ = [
    "KServeGrpcMethods",
    "SERVICER_FUNCTION",
    "add_servicer",
    "http_form",
    "infer_response",
    "register_proto_modules",
]
