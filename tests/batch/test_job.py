"""`vitdeploy batch-predict` on a local Ray: every row is predict's answer for that file, bad images are
error rows (exit 1), a resumed job answers each input once, list files, globs and file:// URIs work."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from helpers.collection import make_collection

from vitdeploy.cli import main

ray = pytest.importorskip("ray")

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("local_ray")]  # local_ray: tests/batch/conftest.py


@pytest.fixture(scope="module")
def collection(tmp_path_factory) -> Path:
    """The demo images copied 8 times (320 files), plus a truncated JPEG and a text file named .png."""
    root = tmp_path_factory.mktemp("collection")
    return make_collection(root, 8)


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    """batch.cache_dir in a private folder (the artifacts are unpacked there, not in ~/.cache)."""
    folder = tmp_path_factory.mktemp("batchcfg")
    path = folder / "pipeline.yaml"
    path.write_text(f"batch:\n  cache_dir: {folder / 'cache'}\n  rows_per_file: 50\n")
    return path


def run(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def batch(config: Path, artifacts: Path, *args: str):
    return run("batch-predict", *args, "-a", str(artifacts), "-b", "ort", "-c", str(config))


@pytest.fixture(scope="module")
def predicted(demo_artifacts, collection) -> dict[str, dict]:
    res = run("predict", str(collection), "-a", str(demo_artifacts), "-b", "ort", "--json")
    return {rec["path"]: rec for rec in map(json.loads, res.stdout.splitlines())}


def read_rows(out: Path) -> list[dict]:
    if out.suffix == ".jsonl":
        return [json.loads(line) for line in out.read_text().splitlines()]
    return (
        pq.read_table(out).to_pylist()
        if out.is_file()
        else pa.concat_tables([pq.read_table(p) for p in sorted(out.glob("*.parquet"))]).to_pylist()
    )


def assert_rows_equal_predict(rows: list[dict], predicted: dict[str, dict]) -> None:
    assert sorted(r["path"] for r in rows) == sorted(predicted)  # one row per input, none twice
    for row in rows:
        want = predicted[row["path"]]
        if "error" in want:
            assert row["error"] == want["error"] and row["label"] is None, row["path"]
            continue
        assert row["error"] is None and (row["label"], row["index"]) == (want["label"], want["index"]), row["path"]
        assert row["score"] == pytest.approx(want["score"], abs=1e-6)
        assert [(t["label"], t["index"]) for t in row["top_k"]] == [(t["label"], t["index"]) for t in want["top_k"]]
        assert [t["score"] for t in row["top_k"]] == pytest.approx([t["score"] for t in want["top_k"]], abs=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["rows.parquet", "rows.jsonl"])
def test_every_row_is_predicts_answer_and_bad_images_are_error_rows(
    demo_artifacts, collection, config, predicted, tmp_path, name
):
    out = tmp_path / name
    res = batch(config, demo_artifacts, str(collection), "-o", str(out))
    assert res.exit_code == 1, res.output
    assert "322 images, 2 errors" in res.stderr and "images/s" in res.stderr
    rows = read_rows(out)
    assert_rows_equal_predict(rows, predicted)
    errors = {Path(r["path"]).name: r["error"] for r in rows if r["error"] is not None}
    assert set(errors) == {"truncated.jpg", "text.png"}
    assert "truncated" in errors["truncated.jpg"] and "not a recognised image" in errors["text.png"]


def test_workers_run_the_graph_predict_runs(demo_artifacts, collection, config, tmp_path):
    """`predict -b ort` runs model.ort.onnx (ONNX Runtime's fused graph, ~10% faster on ViT-S/16): the copy each
    worker gets must hold it too, or the workers silently run the slower plain graph."""
    assert (demo_artifacts / "model.ort.onnx").is_file()
    res = batch(config, demo_artifacts, str(collection / "c0"), "-o", str(tmp_path / "out.jsonl"))
    assert res.exit_code == 0, res.output
    copies = [d for d in (config.parent / "cache").iterdir() if (d / ".complete").is_file()]
    assert copies and all((d / "model.ort.onnx").is_file() for d in copies), copies


@pytest.mark.slow
def test_a_job_that_starts_its_own_ray_runs_a_worker_per_core_by_default(
    demo_artifacts, collection, predicted, tmp_path
):
    """The command as a user runs it, no Ray running: batch.workers auto starts one single-threaded actor per core
    (what one machine runs fastest), its workers open the export where it lies (no copy in the cache), and the rows
    are still predict's answers."""
    out = tmp_path / "auto.jsonl"
    cfg = tmp_path / "pipeline.yaml"
    cfg.write_text(f"batch:\n  cache_dir: {tmp_path / 'cache'}\n")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    args = ["batch-predict", str(collection / "c0"), "-a", str(demo_artifacts), "-b", "ort", "-o", str(out)]
    res = subprocess.run(
        [sys.executable, "-m", "vitdeploy.cli", *args, "-c", str(cfg)], capture_output=True, text=True, env=env
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"workers auto: {os.cpu_count()} on this machine" in res.stderr
    assert not (tmp_path / "cache").exists()  # its workers opened the export where it lies: no copy
    rows = read_rows(out)
    assert len(rows) == len(list((collection / "c0").iterdir()))
    assert_rows_equal_predict(rows, {r["path"]: predicted[r["path"]] for r in rows})


@pytest.mark.slow
def test_resume_answers_only_what_is_missing_and_a_finished_job_does_nothing(
    demo_artifacts, collection, config, predicted, tmp_path
):
    out = tmp_path / "parts"
    first = sorted(predicted)[:150]  # a job killed after writing part of its output
    full = tmp_path / "full.parquet"
    assert batch(config, demo_artifacts, *first, "-o", str(full)).exit_code == 1  # the two bad files are in it
    out.mkdir()
    shutil.copy(full, out / "part-killed-00001.parquet")
    res = batch(config, demo_artifacts, str(collection), "-o", str(out))
    assert res.exit_code == 2 and "output exists; pass --resume" in res.stderr
    res = batch(config, demo_artifacts, str(collection), "-o", str(out), "--resume")
    assert res.exit_code == 1 and "172 images, 0 errors, 150 already answered" in res.stderr
    assert_rows_equal_predict(read_rows(out), predicted)
    again = batch(config, demo_artifacts, str(collection), "-o", str(out), "--resume")
    assert "nothing to do: all 322 inputs already answered" in again.stderr and again.exit_code == 1
    assert_rows_equal_predict(read_rows(out), predicted)


def test_a_list_file_a_glob_and_a_file_uri(demo_artifacts, collection, config, predicted, tmp_path):
    good = sorted((collection / "c0").iterdir())
    listing = tmp_path / "list.txt"
    listing.write_text(f"{good[0]}\n{good[1]}\n{collection / 'c0' / 'missing.png'}\n")
    out = tmp_path / "x.jsonl"
    res = batch(
        config,
        demo_artifacts,
        str(listing),
        str(collection / "c1" / "digit3_*"),
        (collection / "c2" / good[2].name).as_uri(),
        "-o",
        str(out),
    )
    assert res.exit_code == 1, res.output
    rows = {r["path"]: r for r in read_rows(out)}
    assert rows[str(collection / "c0" / "missing.png")]["error"].endswith("missing.png: no such file or directory")
    globbed = sorted(str(p) for p in (collection / "c1").glob("digit3_*"))
    uri = (collection / "c2" / good[2].name).as_uri()
    assert set(rows) == {str(good[0]), str(good[1]), str(collection / "c0" / "missing.png"), *globbed, uri}
    for path in [str(good[0]), str(good[1]), *globbed]:
        assert rows[path]["label"] == predicted[path]["label"]
    assert rows[uri]["label"] == predicted[str(collection / "c2" / good[2].name)]["label"]


def test_a_bad_output_name_is_one_line_before_ray_work(demo_artifacts, collection, config, tmp_path):
    res = batch(config, demo_artifacts, str(collection), "-o", str(tmp_path / "x.csv"))
    assert res.exit_code == 2 and "unknown output format '.csv'" in res.stderr
    assert "Traceback" not in res.output


def test_a_worker_error_reaches_the_user_as_one_line_of_its_own_type():
    from vitdeploy.base.errors import ArtifactIntegrityError
    from vitdeploy.batch.job import _unwrap

    @ray.remote
    def worker():
        raise ArtifactIntegrityError("cache/abc/model.onnx: sha256 mismatch\nsecond line")

    with pytest.raises(Exception) as info:
        ray.get(worker.remote())
    err = _unwrap(info.value)
    assert type(err) is ArtifactIntegrityError and str(err) == "cache/abc/model.onnx: sha256 mismatch"
    assert _unwrap(RuntimeError("boom\nat line 3")).args == ("batch job failed on a Ray worker: boom",)


def test_a_pool_that_leaves_no_cpu_for_decoding_is_refused_before_it_hangs(caplog):
    from vitdeploy.base.errors import ConfigError
    from vitdeploy.batch.job import BatchSettings, _check_resources

    settings = BatchSettings(inputs=[], artifacts="a", output="o", workers=2, cpus_per_worker=1.0)
    with pytest.raises(
        ConfigError,
        match=r"2 worker\(s\) x batch.cpus_per_worker 1 \+ batch.decode_cpus 1 = 3 CPUs, "
        r"the cluster has 2",
    ):
        _check_resources({"CPU": 2.0}, settings, strict=True)
    _check_resources({"CPU": 2.0}, settings, strict=False)  # a joined cluster may grow: a warning
    assert "cannot schedule its workers" in caplog.text
    _check_resources({"CPU": 3.0}, settings, strict=True)


@pytest.mark.slow
def test_an_inference_actor_killed_mid_job_leaves_every_input_answered_once(
    demo_artifacts, collection, config, predicted, tmp_path
):
    """`kill -9` of the one inference actor's process while it works: Ray Data starts another and retries
    its batches; the output holds every input exactly once, each predict's answer."""

    from helpers.held import run_killing_an_actor

    from vitdeploy.batch.job import BatchSettings, run_batch
    from vitdeploy.runtime.backends import BackendOptions

    out = tmp_path / "rows.jsonl"
    settings = BatchSettings(
        inputs=[str(collection)],
        artifacts=str(demo_artifacts),
        output=str(out),
        backend="ort",
        workers=1,
        batch_size=4,
        cache_dir=str(tmp_path / "cache"),
    )
    summary = run_killing_an_actor(
        lambda: run_batch(settings, options=BackendOptions(threads=1), max_pixels=89_478_485)
    )
    assert summary.images == len(predicted)
    assert_rows_equal_predict(read_rows(out), predicted)


@pytest.fixture
def small_disk(tmp_path):
    """A 48 KiB file system (tmpfs) for the job's output, grown to 16 MiB by calling the fixture's value:
    a real ENOSPC for the output only (Ray's own files, and this process's others, are elsewhere)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system needs root (CI runs as root)")
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=48k", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")

    def grow() -> None:
        subprocess.run(["mount", "-o", "remount,size=16m", str(mount)], check=True)

    try:
        yield mount, grow
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.slow
def test_a_full_disk_mid_job_keeps_the_rows_written_and_resume_finishes_once_space_is_back(
    demo_artifacts, collection, config, predicted, small_disk
):
    """The output's disk fills up mid-job (ENOSPC): one line naming the file and the cause; the rows
    written before stay readable; with space back, --resume answers only the rest, every input once."""
    mount, grow = small_disk
    out = mount / "rows.jsonl"
    res = batch(config, demo_artifacts, str(collection), "-o", str(out))
    lines = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert res.exit_code == 1 and len(lines) == 1, res.stderr
    assert lines[0].startswith(f"error: cannot write {out}: No space left on device"), lines[0]
    assert "--resume" in lines[0]
    assert "Traceback" not in res.stderr and not out.exists()  # not complete: not under the final name
    from vitdeploy.batch.output import Output

    kept = Output.at(out).answered()
    assert 10 < len(kept) < len(predicted)  # what was written before the disk filled is there, readable
    grow()
    res = batch(config, demo_artifacts, str(collection), "-o", str(out), "--resume")
    assert res.exit_code == 1 and f"{len(kept)} already answered" in res.stderr, res.stderr  # the 2 bad files
    assert_rows_equal_predict(read_rows(out), predicted)
