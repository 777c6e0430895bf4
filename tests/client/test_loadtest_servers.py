"""`vitdeploy loadtest` against the real servers: `vitdeploy serve` (Ray Serve; predict, v2 over HTTP and gRPC)
and the generated Triton repository on the bundled tritonserver (v2 over HTTP and gRPC). Every request is
answered, counted once, and the server's own statistics agree with the count."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("ray.serve", reason="vitdeploy serve needs ray[serve] (pip install 'vitdeploy[serve]')")
pytest.importorskip("tritonclient.grpc", reason="v2-grpc needs tritonclient[grpc]")

from click.testing import CliRunner  # noqa: E402
from helpers.serve_process import GRPC_WITHOUT_TOKEN, ServeProcess  # noqa: E402

from vitdeploy.client.loadtest import LoadPlan, load_images, run_loadtest  # noqa: E402
from vitdeploy.client.protocols import PREDICT, V2_GRPC, V2_HTTP, Target  # noqa: E402
from vitdeploy.serve.triton.local import BundledTriton, default_venv, free_port  # noqa: E402

pytestmark = pytest.mark.integration

NAME = "vit-demo-digits"
VENV = default_venv()
REQUESTS = 12


@pytest.fixture(scope="module")
def serve(demo_artifacts: Path, tmp_path_factory):
    grpc_port = free_port()
    cfg = tmp_path_factory.mktemp("serve_cfg") / "pipeline.yaml"
    cfg.write_text(
        "runtime: {threads: 1}\n"
        f"serve: {{max_batch_size: 4, batch_wait_timeout_s: 0.002, metrics_port: {free_port()}, "
        f"grpc_port: {grpc_port}}}\n"
    )
    server = ServeProcess(demo_artifacts, cfg, *GRPC_WITHOUT_TOKEN, start_timeout_s=240)
    yield {"http": server.url, "grpc": f"127.0.0.1:{grpc_port}"}
    server.stop()


@pytest.fixture(scope="module")
def triton(demo_artifacts: Path, tmp_path_factory):
    if not (VENV / "bin" / "python").exists():
        reason = f"no {VENV} (create it with `make triton-env`): the bundled tritonserver is not installed"
        pytest.fail(reason) if os.environ.get("CI", "").lower() == "true" else pytest.skip(reason)
    from vitdeploy.base.config import parse_config
    from vitdeploy.serve.triton.repo import build_triton_repo, settings_from_config

    cfg = parse_config({"triton": {"inference": "ort_python", "max_queue_delay_us": 2000}})
    repo = build_triton_repo(demo_artifacts, tmp_path_factory.mktemp("triton") / "repo", settings_from_config(cfg))
    with BundledTriton(VENV, repo.path, load=[NAME]) as server:
        yield {"http": server.http_url, "grpc": server.grpc_url}


def _run(url: str, protocol: str, model: str | None = NAME):
    plan = LoadPlan(
        Target(url, protocol, model), load_images(None), concurrency=(3,), duration_s=None, requests=REQUESTS
    )
    return run_loadtest(plan).levels[0]


@pytest.mark.parametrize("protocol", [PREDICT, V2_HTTP, V2_GRPC])
def test_loadtest_against_vitdeploy_serve(serve, protocol):
    url = serve["grpc"] if protocol == V2_GRPC else serve["http"]
    level = _run(url, protocol, None if protocol == PREDICT else NAME)
    assert level.statuses == ({"OK": REQUESTS} if protocol == V2_GRPC else {"200": REQUESTS})
    assert len(level.latencies_ms) == REQUESTS and level.percentile(99) >= level.percentile(50) > 0
    if protocol != PREDICT:  # one replica: its statistics count exactly this level's requests
        assert level.server["requests"] == REQUESTS and level.server["compute_infer_ms"] > 0


@pytest.mark.parametrize("protocol", [V2_HTTP, V2_GRPC])
def test_loadtest_against_the_bundled_tritonserver(triton, protocol):
    level = _run(triton["grpc" if protocol == V2_GRPC else "http"], protocol)
    assert level.ok == REQUESTS and not level.errors
    assert level.server["requests"] == REQUESTS  # Triton's own statistics of the ensemble


def test_the_command_against_tritonserver_names_the_levels(triton):
    from vitdeploy.cli import main

    args = ["loadtest", triton["grpc"], "--model", NAME, "--protocol", V2_GRPC, "--concurrency", "1,2"]
    result = CliRunner().invoke(main, [*args, "--requests", "6", "--warmup", "0"])
    assert result.exit_code == 0, result.output
    rows = [line.split() for line in result.stdout.splitlines() if line.strip().startswith(("1 c", "2 c"))]
    assert [row[:3] for row in rows] == [["1", "c", "6"], ["2", "c", "6"]]
