"""`vitdeploy serve` on a cluster of two nodes (``ray.cluster_utils.Cluster``, Ray's own test utility,
two raylets on this machine), no shared disk assumed: the replica is pinned to the second node by a
custom resource, the export folder is renamed away and the node's artifact cache wiped after `serve`
starts, and replicas started afterwards still get the files through Ray and answer as before. The
written Ray Serve config is deployed for real with `serve deploy` (the head node runs the dashboard).

One cluster for the module, with its own temp dir (RAY_TMPDIR), so that it never meets the other
serve modules' Ray instances when xdist runs two modules at once.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("ray.serve", reason="vitdeploy serve needs ray[serve] (pip install 'vitdeploy[serve]')")

from helpers.serve_process import ServeProcess, free_port, leave_ray  # noqa: E402

from vitdeploy.base.ray_join import init_ray  # noqa: E402
from vitdeploy.demo import IMAGES_DIR  # noqa: E402
from vitdeploy.runtime.artifact_transfer import CACHE_ENV  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.multinode]

NODE2 = "vitdeploy_test_node2"  # the custom resource only the second node has
NAME = "model-mn"


def _images() -> list[Path]:
    return [p for p in sorted(IMAGES_DIR.iterdir()) if p.suffix in (".png", ".jpg")][:4]


def _config(folder: Path, name: str) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(
        "runtime: {threads: 1}\n"
        "serve: {max_batch_size: 4, batch_wait_timeout_s: 0.005, decode_threads: 1, num_cpus_per_replica: 0.25,\n"
        "        graceful_shutdown_timeout_s: 5, metrics_port: %d, resources_per_replica: {%s: 1}}\n"
        % (free_port(), NODE2)
    )
    return path


def _answers(url: str, name: str = NAME) -> list[dict]:
    out = []
    for path in _images():
        r = httpx.post(
            f"{url}/v2/models/{name}/predict",
            content=path.read_bytes(),
            headers={"content-type": f"image/{path.suffix.lstrip('.').replace('jpg', 'jpeg')}"},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        [record] = r.json()
        out.append(record)
    return out


def _replicas(ray) -> list[str]:
    """The names of the live replica actors of model-mn (Serve names them SERVE_REPLICA::<app>#...)."""
    return sorted(
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith(f"SERVE_REPLICA::{NAME}#")
    )


def _node_of(actor_name: str) -> str:
    from ray.util.state import list_actors

    [actor] = list_actors(filters=[("name", "=", actor_name), ("state", "=", "ALIVE")])
    return actor.node_id


@pytest.fixture(scope="module")
def mn(demo_artifacts, tmp_path_factory):
    """A head node (1 CPU, dashboard on loopback) and a second node with the custom resource; model-mn
    served by `vitdeploy serve --address` from a copy of the demo export, its replica on node 2."""
    import ray
    from ray.cluster_utils import Cluster

    folder = tmp_path_factory.mktemp("multinode")
    art = folder / "export"
    shutil.copytree(demo_artifacts, art)  # renamed away by a test: never the session's folder
    ray_tmp = tempfile.mkdtemp(prefix="vdmn", dir="/tmp")  # short: Ray's socket paths have a length limit
    env = {
        "RAY_TMPDIR": ray_tmp,
        CACHE_ENV: str(folder / "node-cache"),
        "RAY_USAGE_STATS_ENABLED": "0",
        "OMP_NUM_THREADS": "1",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the raylets, hence every worker, and the CLI below inherit them
    os.makedirs(os.path.join(ray_tmp, "ray"))  # Ray's temp dir under RAY_TMPDIR
    dashboard_port = free_port()
    proc = cluster = None
    try:
        cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 1,
                "include_dashboard": True,
                "dashboard_host": "127.0.0.1",
                "dashboard_port": dashboard_port,
                "temp_dir": os.path.join(ray_tmp, "ray"),
                # Ray's fixed default ports, taken by whichever Ray on this machine started first: pick free ones
                "dashboard_agent_listen_port": free_port(),
                "metrics_export_port": free_port(),
            },
        )
        node2 = cluster.add_node(num_cpus=1, resources={NODE2: 2})
        proc = ServeProcess(art, _config(folder, "mn"), "--address", cluster.address, "--name", NAME)
        init_ray(ray, cluster.address, logging_level="WARNING")
        url = proc.url
        yield {
            "url": url,
            "port": proc.port,
            "art": art,
            "folder": folder,
            "cluster": cluster,
            "node2": node2.node_id,
            "dashboard": f"http://127.0.0.1:{dashboard_port}",
            "before": _answers(url),
            "ray": ray,
            "cache": folder / "node-cache",
        }
    finally:
        if proc is not None:
            assert proc.stop() == 0, "\n".join(proc.lines[-20:])
        leave_ray()
        if cluster is not None:
            cluster.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(ray_tmp, ignore_errors=True)


def test_the_replica_runs_on_the_second_node_and_answers_as_the_in_process_predictor(mn, demo_artifacts):
    from vitdeploy.runtime.predictor import Predictor

    [replica] = _replicas(mn["ray"])
    assert _node_of(replica) == mn["node2"]
    with Predictor.from_artifacts(demo_artifacts, "ort") as p:  # the same files as the renamed copy
        expected = [p.predict([path])[0].to_dict() for path in _images()]
    for got, exp in zip(mn["before"], expected):
        assert [t["label"] for t in got["top_k"]] == [t["label"] for t in exp["top_k"]], (got, exp)
        # scores to 1e-5: the replica may batch these images together, the Predictor ran them one by one
        assert got["top_k"] == [{**t, "score": pytest.approx(t["score"], abs=1e-5)} for t in exp["top_k"]]


def test_replicas_started_after_the_folder_is_gone_get_it_through_ray_and_answer_the_same(mn):
    ray = mn["ray"]
    [old] = _replicas(ray)
    mn["art"].rename(mn["folder"] / "gone")  # no disk copy left: neither the export nor the node's cache
    shutil.rmtree(mn["cache"])
    ray.kill(ray.get_actor(old, namespace="serve"), no_restart=True)  # Serve starts a replacement
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (_replicas(ray) in ([], [old]) or not _running(ray)):
        time.sleep(0.5)
    [new] = _replicas(ray)
    assert new != old and _node_of(new) == mn["node2"]
    # unpacked from Ray's object store into the node's cache: the files `serve` packed for "ort", the fused graph too
    assert (mn["cache"] / _bundle_key(mn["folder"] / "gone") / "model.ort.onnx").is_file()
    assert _answers(mn["url"]) == mn["before"]  # identical JSON, byte for byte in every score


def _bundle_key(folder: Path) -> str:
    from vitdeploy.runtime.artifact_transfer import pack
    from vitdeploy.runtime.artifacts import Artifacts
    from vitdeploy.runtime.backends import shipped_roles

    artifacts = Artifacts.open(folder)
    return pack(artifacts, shipped_roles("ort", artifacts)).key


def _running(ray) -> bool:
    from ray import serve

    app = serve.status().applications.get(NAME)
    return app is not None and app.status == "RUNNING"


def test_the_written_config_deploys_with_serve_deploy_and_answers(mn, demo_artifacts):
    out = mn["folder"] / "serve.yaml"
    cfg = _config(mn["folder"], "deploy")
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "vitdeploy.cli",
            "serve",
            "-a",
            str(demo_artifacts),
            "-b",
            "ort",
            "--port",
            str(mn["port"]),
            "--name",
            "from-deploy",
            "-c",
            str(cfg),
            "--write-config",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    serve_cli = str(Path(sys.executable).with_name("serve"))
    dep = subprocess.run(
        [serve_cli, "deploy", str(out), "--address", mn["dashboard"]], capture_output=True, text=True, timeout=120
    )
    assert dep.returncode == 0, dep.stdout[-2000:] + dep.stderr[-2000:]
    deadline = time.monotonic() + 150
    status = ""
    while time.monotonic() < deadline:
        st = subprocess.run(
            [serve_cli, "status", "--address", mn["dashboard"]], capture_output=True, text=True, timeout=60
        )
        status = st.stdout
        if "from-deploy" in status and "DEPLOY_FAILED" in status:
            break
        try:  # a busy machine may answer slowly while the application starts: only the deadline decides
            if httpx.get(f"{mn['url']}/v2/models/from-deploy/ready", timeout=30).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(1)
    answers = _answers(mn["url"], "from-deploy")
    assert [a["top_k"] for a in answers] == [b["top_k"] for b in mn["before"]], status
