"""Traces of `vitdeploy serve` (OpenTelemetry, OTLP), made by Ray Serve's own tracing.

Ray Serve traces requests itself when its tracing is set up: its HTTP and gRPC proxies continue a client's W3C
``traceparent`` (HTTP header or gRPC metadata) with a ``proxy_http_request`` / ``proxy_grpc_request`` span, the
router adds ``route_to_replica``, the replica ``replica_handle_request``, and every span goes to the span
processors a function named by ``exporter_import_path`` returns, in each proxy and replica process; sampling is a
parent-based ratio (a client's sampled ``traceparent`` is always followed, an unsampled one never; a request
without one starts a trace with probability ``sampling_ratio``). vitdeploy adds:

* :func:`config`: Ray's ``TracingConfig`` for ``serve.start`` when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or
  ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set and the ``[otel]`` extra is installed, else None: nothing
  changes; :func:`ray_env`, the same for the proxy, which in Ray 2.60 reads its tracing only from
  ``RAY_SERVE_TRACING_*`` variables (``serve.start``'s config reaches the replicas, never the proxy);
* :func:`span_processors`, the ``exporter_import_path``: an OTLP exporter (``http/protobuf``, or ``grpc`` as
  ``OTEL_EXPORTER_OTLP_PROTOCOL`` says) behind a batch processor, configured by the standard ``OTEL_*``
  variables each process inherits;
* :class:`StageSpans`: a request's stages as spans under Ray's replica span, one ``vitdeploy.request`` span and
  its children ``read``, ``decode``, ``queue``, ``model``, ``post``, laid end to end from the laps of the
  request's stage clock (serve/stage_timing.py): the durations of its ``Server-Timing`` header, not timed twice.

Nothing here imports OpenTelemetry unless traces are on.
"""

from __future__ import annotations

import importlib.util
import os
import time
from typing import Any, Dict, Mapping, Optional
from urllib.parse import urlsplit

from ..base.ray_private import TRACING_EXPORTER_ENV, TRACING_RATIO_ENV, tracing_enabled

#: The endpoint variables, the traces' own first (the OpenTelemetry exporter's order).
ENDPOINT_ENVS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
PROTOCOL_ENVS = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
#: The collector's credentials (``key=value,...``, e.g. ``Authorization=Basic ...``): never copied into a file.
HEADERS_ENVS = ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS")
#: OpenTelemetry's own switch: "true" turns the SDK (here: vitdeploy's tracing) off whatever else is set.
DISABLED_ENV = "OTEL_SDK_DISABLED"
SERVICE_ENV = "OTEL_SERVICE_NAME"
#: Ray Serve's own tracing variables (ray/serve/_private/constants.py), read by each proxy and replica at start.
RAY_EXPORTER_ENV = TRACING_EXPORTER_ENV.variable
RAY_RATIO_ENV = TRACING_RATIO_ENV.variable
SERVICE_NAME = "vitdeploy-serve"
GRPC = "grpc"
_EXPORTERS = {
    GRPC: "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
    "http/protobuf": "opentelemetry.exporter.otlp.proto.http.trace_exporter",
}
#: What Ray imports in each proxy and replica: a function of no arguments returning the span processors.
EXPORTER_IMPORT_PATH = f"{__name__}:span_processors"
EXTRA = "pip install 'vitdeploy[otel]'"
REQUEST_SPAN = "vitdeploy.request"


def endpoint(env: Mapping[str, str] = os.environ) -> Optional[str]:
    """The OTLP endpoint traces go to, None when none is set (or ``OTEL_SDK_DISABLED=true``)."""
    if env.get(DISABLED_ENV, "").strip().lower() == "true":
        return None
    for key in ENDPOINT_ENVS:
        if env.get(key, "").strip():
            return env[key].strip()
    return None


def protocol(env: Mapping[str, str] = os.environ) -> str:
    """The OTLP protocol: ``grpc`` or ``http/protobuf`` (the OpenTelemetry default, and for any other value)."""
    for key in PROTOCOL_ENVS:
        value = env.get(key, "").strip().lower()
        if value:
            return GRPC if value == GRPC else "http/protobuf"
    return "http/protobuf"


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a parent package missing
        return False


def shown(url: str) -> str:
    """``url`` as it may be printed: scheme, host, port and path (a user:password or a query left out)."""
    try:
        parts = urlsplit(url if "://" in url else f"//{url}")
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "(an endpoint that is not a URL)"
    scheme = f"{parts.scheme}://" if parts.scheme else ""
    return f"{scheme}{host}{port}{parts.path}"


def unavailable(env: Mapping[str, str] = os.environ) -> Optional[str]:
    """Why traces are not exported although an endpoint is set (the exporter not installed), else None."""
    if endpoint(env) is None or _installed(_EXPORTERS[protocol(env)]):
        return None
    key = next(k for k in ENDPOINT_ENVS if env.get(k, "").strip())
    return f"{key} is set but the OTLP exporter is not installed: {EXTRA}"


def config(sampling_ratio: float, env: Mapping[str, str] = os.environ) -> Optional[Dict[str, Any]]:
    """Ray Serve's ``TracingConfig`` (as a dict) of vitdeploy's traces, None when they are off: no endpoint, the
    ``[otel]`` extra missing, or ``RAY_SERVE_TRACING_EXPORTER_IMPORT_PATH`` set by the user (Ray's tracing is
    then theirs, as they configured it)."""
    if (
        endpoint(env) is None
        or unavailable(env)
        or env.get(RAY_EXPORTER_ENV, EXPORTER_IMPORT_PATH) not in ("", EXPORTER_IMPORT_PATH)
    ):
        return None
    return {"enabled": True, "exporter_import_path": EXPORTER_IMPORT_PATH, "sampling_ratio": float(sampling_ratio)}


def ray_env(
    traces: Optional[Dict[str, Any]], env: Mapping[str, str] = os.environ, written: bool = False
) -> Dict[str, str]:
    """The environment each Ray node needs for ``traces`` (from :func:`config`; {} when None): Ray 2.60's proxy
    never gets ``serve.start``'s tracing_config (proxy_state.py starts ProxyActor without it) and reads only
    ``RAY_SERVE_TRACING_*``: without them it neither continues a client's traceparent nor passes the trace on to
    the replicas. The endpoint and protocol variables are ``env``'s, as set; ``written`` (a file we write): each
    endpoint without its user:password or query (:func:`shown`; the credentials travel as
    ``OTEL_EXPORTER_OTLP_HEADERS`` from a secret: :func:`credentials`)."""
    if not traces:
        return {}
    endpoints = {k: env[k].strip() for k in ENDPOINT_ENVS if env.get(k, "").strip()}
    return {
        RAY_EXPORTER_ENV: traces["exporter_import_path"],
        RAY_RATIO_ENV: repr(float(traces["sampling_ratio"])),
        SERVICE_ENV: env.get(SERVICE_ENV) or SERVICE_NAME,
        **{k: shown(v) if written else v for k, v in endpoints.items()},
        **{k: env[k] for k in PROTOCOL_ENVS if env.get(k, "").strip()},
    }


def credentials(env: Mapping[str, str] = os.environ) -> bool:
    """Whether the collector gets credentials a written file must not hold: a headers variable, or an endpoint
    with a user:password or a query (what :func:`shown` leaves out)."""

    def carries(url: str) -> bool:
        parts = urlsplit(url if "://" in url else f"//{url}")
        return "@" in parts.netloc or bool(parts.query or parts.fragment)

    endpoints = [env[k].strip() for k in ENDPOINT_ENVS if env.get(k, "").strip()]
    return any(env.get(k, "").strip() for k in HEADERS_ENVS) or any(carries(e) for e in endpoints)


def start_options(start: Any, traces: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """``serve.start``'s (``start``) keyword for ``traces``: {} when they are off, or when this Ray's ``serve.start``
    takes no tracing_config (an older Ray reads only the ``RAY_SERVE_TRACING_*`` variables of :func:`ray_env`)."""
    import inspect

    return {"tracing_config": traces} if traces and "tracing_config" in inspect.signature(start).parameters else {}


def progress_line(traces: Dict[str, Any], env: Mapping[str, str] = os.environ) -> str:
    """The line `vitdeploy serve` prints when traces are exported."""
    return (
        f"traces: OTLP ({protocol(env)}) to {shown(endpoint(env) or '')}; a client's sampled traceparent is "
        f"followed, {traces['sampling_ratio']:g} of the other requests are sampled (serve.tracing.sampling_ratio)"
    )


def fastapi_options() -> Dict[str, Any]:
    """FastAPI's own request spans off, where FastAPI has them (its ``telemetry`` argument, FastAPI 0.165 here):
    it traces with the tracer provider Ray sets up in the replica, but as a child of the client's header, a
    sibling of Ray's spans rather than under the replica's; Ray's spans already say what it would."""
    import inspect

    from fastapi import FastAPI

    return {"telemetry": {"tracing": False}} if "telemetry" in inspect.signature(FastAPI).parameters else {}


def span_processors() -> list:
    """Ray Serve's exporter hook (``exporter_import_path``), called in every proxy and replica: an OTLP exporter
    behind a batch processor, both configured by the ``OTEL_*`` variables of this process."""
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    module = importlib.import_module(_EXPORTERS[protocol()])
    return [BatchSpanProcessor(module.OTLPSpanExporter())]


class StageSpans:
    """A replica's stage spans: called with a finished request's stage clock, under the current span (Ray's
    replica span, which carries the client's trace); nothing when that span is not sampled."""

    def __init__(self, model: str, version: str, backend: str, tracer: Any = None) -> None:
        from opentelemetry import trace

        self._trace = trace
        self._tracer = tracer or trace.get_tracer("vitdeploy.serve")  # the provider Ray set up in this process
        self._attributes = {"vitdeploy.model": model, "vitdeploy.version": str(version), "vitdeploy.backend": backend}

    def __call__(self, clock: Any, total_ns: int) -> None:
        if not self._trace.get_current_span().is_recording():
            return
        offset = time.time_ns() - time.perf_counter_ns()  # the clock's perf_counter ns -> the epoch ns of spans
        t = clock.start + offset
        request = self._tracer.start_span(REQUEST_SPAN, start_time=t, attributes=self._attributes)
        context = self._trace.set_span_in_context(request)
        for stage, ns in clock.ns.items():
            attributes = {"vitdeploy.batch": clock.batch} if stage == "model" and clock.batch else None
            self._tracer.start_span(stage, context=context, start_time=t, attributes=attributes).end(end_time=t + ns)
            t += ns
        request.end(end_time=clock.start + offset + total_ns)


def stage_spans(model: str, version: Any, backend: str) -> Optional[StageSpans]:
    """The replica's :class:`StageSpans` when Ray Serve traces this process, else None (nothing imported)."""
    return StageSpans(model, str(version), backend) if tracing_enabled() else None


__all__ = [
    "ENDPOINT_ENVS",
    "EXPORTER_IMPORT_PATH",
    "HEADERS_ENVS",
    "REQUEST_SPAN",
    "StageSpans",
    "config",
    "credentials",
    "endpoint",
    "fastapi_options",
    "progress_line",
    "ray_env",
    "span_processors",
    "stage_spans",
    "start_options",
    "unavailable",
]
