"""batch-predict on a two-node Ray cluster (both nodes on this machine): the artifacts travel through the
object store, an inference actor runs on each node, and both produce rows equal to predict's."""

from __future__ import annotations

import shutil
import tempfile

import pytest

from vitdeploy.base.ray_join import init_ray
from vitdeploy.batch.job import BatchSettings, run_batch
from vitdeploy.demo import IMAGES_DIR
from vitdeploy.runtime.backends import BackendOptions
from vitdeploy.runtime.batch_predict import predict_paths
from vitdeploy.runtime.predictor import Predictor

pytest.importorskip("ray")

pytestmark = [pytest.mark.integration, pytest.mark.multinode, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster():
    """Two nodes of 3 logical CPUs: an actor asking for 2 fits once per node, leaving a CPU for decoding."""
    import ray
    import ray.data
    from ray.cluster_utils import Cluster

    temp = tempfile.mkdtemp(prefix="vm", dir="/tmp")
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 3, "include_dashboard": False, "temp_dir": temp})
    c.add_node(num_cpus=3)
    c.wait_for_nodes()
    init_ray(ray, c.address, log_to_driver=False, logging_level="ERROR")
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield c
    ray.shutdown()
    c.shutdown()
    shutil.rmtree(temp, ignore_errors=True)


def _job(demo_artifacts, tmp_path, copies: int) -> tuple:
    """(a folder of the demo images copied ``copies`` times, a job over it: one 2-CPU actor per node)."""
    images = tmp_path / "images"
    for copy in range(copies):
        shutil.copytree(IMAGES_DIR, images / f"c{copy}", ignore=shutil.ignore_patterns("*.csv", "*.md"))
    settings = BatchSettings(
        inputs=[str(images)],
        artifacts=str(demo_artifacts),
        output=str(tmp_path / "out.jsonl"),
        backend="ort",
        workers=2,
        cpus_per_worker=2,
        batch_size=4,
        cache_dir=str(tmp_path / "cache"),
    )
    return images, settings


def test_workers_on_both_nodes_produce_rows(cluster, demo_artifacts, tmp_path):
    images, settings = _job(demo_artifacts, tmp_path, copies=4)
    summary = run_batch(settings, options=BackendOptions(threads=1), max_pixels=89_478_485)
    assert summary.failed == 0 and summary.images == 160
    assert len(summary.nodes) == 2 and all(n > 0 for n in summary.nodes.values()), summary.nodes
    import json

    rows = {r["path"]: r for r in map(json.loads, (tmp_path / "out.jsonl").read_text().splitlines())}
    with Predictor.from_artifacts(demo_artifacts, "ort") as p:
        want = {r["path"]: r for r in predict_paths(p, [images])}
    assert rows.keys() == want.keys()
    assert all(
        rows[k]["label"] == want[k]["label"] and rows[k]["score"] == pytest.approx(want[k]["score"], abs=1e-6)
        for k in want
    )


def test_an_actor_killed_on_one_node_mid_job_leaves_every_input_answered_once(cluster, demo_artifacts, tmp_path):
    """`kill -9` of one of the two nodes' inference actors while it works: every input once in the output."""
    import json

    from helpers.held import run_killing_an_actor

    images, settings = _job(demo_artifacts, tmp_path, copies=8)
    summary = run_killing_an_actor(
        lambda: run_batch(settings, options=BackendOptions(threads=1), max_pixels=89_478_485)
    )
    paths = [json.loads(line)["path"] for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    expected = sorted(str(p) for p in images.rglob("*") if p.suffix in (".png", ".jpg"))
    assert sorted(paths) == expected  # every input, none twice
    assert summary.images == len(expected) and summary.failed == 0
