"""An OTLP/HTTP trace receiver on 127.0.0.1 for the tests: ``POST /v1/traces`` (protobuf, gzip or not) decoded
with ``opentelemetry.proto``, each span kept as a :class:`Span`.

    with OtlpReceiver() as receiver:          # receiver.endpoint: http://127.0.0.1:PORT
        ...                                   # OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint in the server's env
        spans = receiver.wait_for(lambda spans: ..., timeout_s=30)   # polls until the condition holds
"""

from __future__ import annotations

import gzip
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable


@dataclass(frozen=True)
class Span:
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_id: str  # "" for a root
    name: str
    start_ns: int
    end_ns: int
    service: str
    attributes: dict = field(default_factory=dict)

    @property
    def ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


def _value(any_value) -> object:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


def decode(body: bytes) -> list[Span]:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest.FromString(body)
    out = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for s in scope_spans.spans:
                out.append(
                    Span(
                        trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(),
                        parent_id=s.parent_span_id.hex(),
                        name=s.name,
                        start_ns=s.start_time_unix_nano,
                        end_ns=s.end_time_unix_nano,
                        service=str(resource.get("service.name", "")),
                        attributes={a.key: _value(a.value) for a in s.attributes},
                    )
                )
    return out


class OtlpReceiver:
    """Collects the spans exporters send; :meth:`wait_for` polls them with a deadline."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.posts = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                ok = self.path == "/v1/traces"
                if ok:
                    spans = decode(body)
                    with receiver._lock:
                        receiver.spans.extend(spans)
                        receiver.posts += 1
                self.send_response(200 if ok else 404)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def snapshot(self) -> list[Span]:
        with self._lock:
            return list(self.spans)

    def wait_for(self, done: Callable[[list[Span]], bool], timeout_s: float = 30.0) -> list[Span]:
        """The spans received once ``done(spans)`` holds; the spans so far when ``timeout_s`` passes first."""
        deadline = time.monotonic() + timeout_s
        while True:
            spans = self.snapshot()
            if done(spans) or time.monotonic() > deadline:
                return spans
            time.sleep(0.05)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> "OtlpReceiver":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
