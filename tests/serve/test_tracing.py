"""Traces (serve/tracing.py) without a server: when they are on, what Ray's proxy and replicas are given, the
stage spans a request's clock makes, the exporter against an OTLP receiver, and nothing imported when they are
off. The traces of a real server: test_ray_app.py (test_a_client_traceparent_is_continued_...)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vitdeploy.serve import stage_timing, tracing
from vitdeploy.serve.stage_timing import STAGES, StageClock, parse_server_timing

pytest.importorskip("opentelemetry.sdk.trace", reason="ray[serve] brings the OpenTelemetry SDK")

ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"


def test_traces_are_on_only_with_an_endpoint_and_the_proxy_gets_them_from_its_environment():
    assert tracing.config(0.01, {}) is None and tracing.ray_env(None, {}) == {}
    env = {ENDPOINT: "http://collector:4318"}
    traces = tracing.config(0.25, env)
    assert traces == {"enabled": True, "exporter_import_path": tracing.EXPORTER_IMPORT_PATH, "sampling_ratio": 0.25}
    node = tracing.ray_env(traces, env)
    assert node == {
        "RAY_SERVE_TRACING_EXPORTER_IMPORT_PATH": "vitdeploy.serve.tracing:span_processors",
        "RAY_SERVE_TRACING_SAMPLING_RATIO": "0.25",
        "OTEL_SERVICE_NAME": "vitdeploy-serve",
        ENDPOINT: "http://collector:4318",
    }
    assert tracing.ray_env(traces, {**env, "OTEL_SERVICE_NAME": "mine"})["OTEL_SERVICE_NAME"] == "mine"
    # OpenTelemetry's own off switch, and a Ray tracing exporter the user configured: theirs, left alone
    assert tracing.config(0.01, {**env, "OTEL_SDK_DISABLED": "true"}) is None
    assert tracing.config(0.01, {**env, "RAY_SERVE_TRACING_EXPORTER_IMPORT_PATH": "my.module:exporter"}) is None
    traces_only = {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://a:4318/v1/traces",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
    }
    assert tracing.config(1.0, traces_only) is not None and tracing.protocol(traces_only) == "grpc"


def test_the_line_serve_prints_never_shows_credentials_in_the_endpoint():
    env = {ENDPOINT: "https://user:s3cret@collector.example:4318/otlp?api_key=k3y"}
    line = tracing.progress_line(tracing.config(0.01, env), env)
    assert "https://collector.example:4318/otlp" in line and "0.01" in line
    assert "s3cret" not in line and "k3y" not in line and "user" not in line


def test_serve_start_gets_the_tracing_config_only_where_it_takes_one():
    def new_ray(*, http_options=None, tracing_config=None): ...

    def old_ray(*, http_options=None): ...

    traces = tracing.config(0.01, {ENDPOINT: "http://c:4318"})
    assert tracing.start_options(new_ray, traces) == {"tracing_config": traces}
    assert tracing.start_options(old_ray, traces) == {} and tracing.start_options(new_ray, None) == {}


def _provider():
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    provider, memory = TracerProvider(), InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    return provider, memory


def _clock() -> StageClock:
    clock = StageClock()
    clock.ns.update(read=300_000, decode=2_000_000, queue=4_000_000, model=7_500_000)
    clock.batch = 3
    clock.last = clock.start + sum(clock.ns.values())  # the laps so far; finish() takes post's lap from now
    return clock


def test_the_stages_are_spans_laid_end_to_end_under_the_request_with_the_server_timing_durations():
    provider, memory = _provider()
    tracer = provider.get_tracer("test")
    spans = tracing.StageSpans("vit", "2", "ort", tracer=tracer)
    clock = _clock()
    with tracer.start_as_current_span("replica_handle_request") as replica:
        header = stage_timing.finish(clock, None, spans)
    by_name = {s.name: s for s in memory.get_finished_spans()}
    request = by_name[tracing.REQUEST_SPAN]
    assert request.parent.span_id == replica.get_span_context().span_id
    assert request.context.trace_id == replica.get_span_context().trace_id
    assert dict(request.attributes) == {"vitdeploy.model": "vit", "vitdeploy.version": "2", "vitdeploy.backend": "ort"}
    stages = [by_name[s] for s in STAGES]
    assert all(s.parent.span_id == request.context.span_id for s in stages)
    assert stages[0].start_time == request.start_time and stages[-1].end_time <= request.end_time
    assert all(a.end_time == b.start_time for a, b in zip(stages, stages[1:]))  # one after the other, no gap
    assert by_name["model"].attributes["vitdeploy.batch"] == 3
    timing = parse_server_timing(header)
    for stage in (*STAGES, "total"):
        span = request if stage == "total" else by_name[stage]
        assert abs((span.end_time - span.start_time) / 1e6 - timing[stage]) <= 0.0006, stage


def test_no_stage_span_where_the_request_is_not_traced():
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, use_span

    provider, memory = _provider()
    spans = tracing.StageSpans("vit", "1", "ort", tracer=provider.get_tracer("test"))
    spans(_clock(), 20_000_000)  # no current span: Ray did not trace this request
    unsampled = NonRecordingSpan(SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(0)))
    with use_span(unsampled):  # a client's traceparent with the sampled flag off
        spans(_clock(), 20_000_000)
    assert memory.get_finished_spans() == ()


@pytest.mark.parametrize("protocol, module", [("http/protobuf", "http"), ("grpc", "grpc")])
def test_ray_gets_an_otlp_exporter_of_the_protocol_asked(monkeypatch, protocol, module):
    pytest.importorskip(f"opentelemetry.exporter.otlp.proto.{module}", reason="pip install 'vitdeploy[otel]'")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
    monkeypatch.setenv(ENDPOINT, "http://127.0.0.1:9")
    (processor,) = tracing.span_processors()
    try:
        assert type(processor).__name__ == "BatchSpanProcessor"
        exporter = processor._batch_processor._exporter  # the SDK's own attribute names (1.3x-1.4x)
        assert type(exporter).__module__.startswith(f"opentelemetry.exporter.otlp.proto.{module}")
    finally:
        processor.shutdown()


def test_the_exporter_delivers_spans_to_an_otlp_receiver(monkeypatch):
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="pip install 'vitdeploy[otel]'")
    from helpers.otlp_receiver import OtlpReceiver
    from opentelemetry.sdk.trace import TracerProvider

    with OtlpReceiver() as receiver:
        monkeypatch.setenv(ENDPOINT, receiver.endpoint)
        monkeypatch.delenv("OTEL_EXPORTER_OTLP_PROTOCOL", raising=False)
        provider = TracerProvider()
        for processor in tracing.span_processors():
            provider.add_span_processor(processor)
        with provider.get_tracer("test").start_as_current_span("hello"):
            pass
        assert provider.force_flush(10_000)
        assert [s.name for s in receiver.snapshot()] == ["hello"]
        provider.shutdown()


def test_written_deploy_files_carry_the_tracing_config_and_the_nodes_environment_never_credentials(monkeypatch):
    from ray.serve.schema import ServeDeploySchema

    from vitdeploy.base.config import parse_config
    from vitdeploy.serve import deploy_config
    from vitdeploy.serve.runner import ServeSettings

    for key in (tracing.RAY_EXPORTER_ENV, tracing.RAY_RATIO_ENV, "OTEL_SERVICE_NAME", "OTEL_SDK_DISABLED"):
        monkeypatch.delenv(key, raising=False)
    cfg = parse_config({"serve": {"tracing": {"sampling_ratio": 0.1}}})
    settings = ServeSettings(Path("/srv/export"), "ort", "127.0.0.1", 8000, 1)

    def written() -> tuple[dict, dict, str]:
        kube = deploy_config.rayservice(cfg, settings, "vit")
        container = kube["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in container["env"]}
        return deploy_config.serve_config(cfg, settings, "vit"), env, deploy_config.guard_comment(cfg)

    monkeypatch.delenv(ENDPOINT, raising=False)
    served, env, comment = written()
    assert "tracing_config" not in served and not any("TRACING" in k or k.startswith("OTEL") for k in env)
    monkeypatch.setenv(ENDPOINT, "http://collector:4318")
    for key in tracing.HEADERS_ENVS:
        monkeypatch.delenv(key, raising=False)
    served, env, comment = written()
    assert ServeDeploySchema.model_validate(served).tracing_config.sampling_ratio == 0.1  # `serve deploy` reads it
    assert env[tracing.RAY_EXPORTER_ENV] == tracing.EXPORTER_IMPORT_PATH and env[tracing.RAY_RATIO_ENV] == "0.1"
    assert env[ENDPOINT] == "http://collector:4318" and tracing.HEADERS_ENVS[-1] not in env
    assert f"{tracing.RAY_EXPORTER_ENV}={tracing.EXPORTER_IMPORT_PATH}" in comment
    # credentials in the endpoint: never written; the RayService reads them as headers from a Secret
    monkeypatch.setenv(ENDPOINT, "http://user:s3cret-pass@collector:4318")
    served, env, comment = written()
    assert env[ENDPOINT] == "http://collector:4318" and "s3cret-pass" not in comment + str(served)
    assert env[tracing.HEADERS_ENVS[-1]] is None  # a valueFrom, not a value
    kube = deploy_config.rayservice(cfg, settings, "vit")
    container = kube["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    ref = next(e["valueFrom"] for e in container["env"] if e["name"] == tracing.HEADERS_ENVS[-1])
    assert ref == {"secretKeyRef": {"name": deploy_config.otlp_secret("vit"), "key": "headers"}}
    assert "s3cret-pass" not in str(kube) and "OTEL_EXPORTER_OTLP_HEADERS" in comment
    assert tracing.ray_env(tracing.config(0.1))[ENDPOINT] == "http://user:s3cret-pass@collector:4318"  # a local Ray's


def test_opentelemetry_is_imported_only_inside_the_tracing_functions():
    import ast

    package = Path(tracing.__file__).resolve().parents[1]
    found = []
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        in_functions = {
            id(node)
            for fn in ast.walk(tree)
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
            for node in ast.walk(fn)
        }
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(n.startswith("opentelemetry") for n in names):
                found.append((path.relative_to(package).as_posix(), id(node) in in_functions))
    assert found and all(where == ("serve/tracing.py", True) for where in found), found


_PROBE = r"""
import importlib.abc, json, os, sys

class Blocked(importlib.abc.MetaPathFinder):  # the [otel] extra not installed
    def find_spec(self, name, path=None, target=None):
        if name.startswith("opentelemetry.exporter") and os.environ.get("BLOCK"):
            raise ModuleNotFoundError(f"No module named {name!r}")

sys.meta_path.insert(0, Blocked())
import fastapi, ray.serve  # what Ray Serve and FastAPI import is theirs
theirs = {m for m in sys.modules if m.startswith("opentelemetry")}
from vitdeploy.base.config import parse_config
from vitdeploy.serve import deploy_config, kserve_grpc, ray_app, runner, stage_timing, tracing
ratio = parse_config({}).serve.tracing.sampling_ratio
off = {"config": tracing.config(ratio), "spans": tracing.stage_spans("m", "1", "ort")}
clock = stage_timing.start(True)
stage_timing.lap(clock, "read")
stage_timing.finish(clock, None, off["spans"])
ours = sorted(m for m in sys.modules if m.startswith("opentelemetry") and m not in theirs)
os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"], os.environ["BLOCK"] = "http://127.0.0.1:4318", "1"
print(json.dumps({"ours": ours, "off": repr(off), "ratio": ratio,
                  "no_extra": [tracing.config(ratio), tracing.unavailable()]}))
"""


def test_off_nothing_is_imported_and_without_the_extra_the_endpoint_is_said_to_be_ignored():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "RAY_SERVE_TRACING"))}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH", "")])
    res = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["ours"] == [] and out["off"] == "{'config': None, 'spans': None}"
    assert out["ratio"] == 0.01  # the default for requests without a client's traceparent (Ray Serve's)
    config, reason = out["no_extra"]
    assert config is None
    assert reason == "OTEL_EXPORTER_OTLP_ENDPOINT is set but the OTLP exporter is not installed: " + tracing.EXTRA
