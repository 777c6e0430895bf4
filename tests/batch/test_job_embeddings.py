"""`vitdeploy batch-predict` of an embedding export (a headless checkpoint exported for real): Parquet rows of
``path``, ``embedding`` (fixed_size_list<float>[D], the Predictor's vectors), ``error``; unreadable images are
error rows; a resumed job answers each input once; pyarrow, DuckDB and Ray Data read the output as it is."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from helpers.collection import make_collection

from vitdeploy.cli import main

pytest.importorskip("ray")

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("local_ray")]  # local_ray: conftest.py

WIDTH = 64  # the tiny DINOv2's hidden size: the embedding's dimension


@pytest.fixture(scope="module")
def collection(tmp_path_factory) -> Path:
    """The demo images twice (80 files) plus a truncated JPEG and a text file named .png."""
    root = tmp_path_factory.mktemp("collection")
    return make_collection(root, 2)


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("embcfg")
    path = folder / "pipeline.yaml"
    path.write_text(f"batch:\n  cache_dir: {folder / 'cache'}\n  rows_per_file: 30\n")
    return path


@pytest.fixture(scope="module")
def embedded(embedding_artifacts, collection) -> dict[str, np.ndarray]:
    """Predictor.embed's vector of every readable image, by path."""
    from vitdeploy.runtime.predictor import Predictor

    paths = sorted(str(p) for p in collection.glob("c*/*"))
    predictor = Predictor.from_artifacts(embedding_artifacts, "ort")
    assert predictor.is_embedding and predictor.output_width == WIDTH
    return dict(zip(paths, predictor.embed(paths)))


def batch(config: Path, artifacts: Path, *args: str):
    cmd = ["batch-predict", *args, "-a", str(artifacts), "-b", "ort", "-c", str(config)]
    return CliRunner().invoke(main, cmd, catch_exceptions=False)


def read(out: Path) -> pa.Table:
    return pq.read_table(out) if out.is_file() else pa.concat_tables(map(pq.read_table, sorted(out.glob("*.parquet"))))


def assert_vectors_equal_embed(table: pa.Table, embedded: dict[str, np.ndarray], dtype=pa.float32(), atol=1e-5):
    assert table.column_names == ["path", "embedding", "error"]  # no label, score or top-k
    assert table.schema.field("embedding").type == pa.list_(dtype, WIDTH)
    rows = table.to_pylist()
    assert sorted(r["path"] for r in rows) == sorted([*embedded, *(p for p in map(str, bad_files(rows)))])
    for row in rows:
        if row["path"] not in embedded:
            assert row["embedding"] is None and row["error"], row
            continue
        assert row["error"] is None
        np.testing.assert_allclose(row["embedding"], embedded[row["path"]], atol=atol, rtol=0)


def bad_files(rows: list[dict]) -> list[str]:
    bad = [r["path"] for r in rows if r["error"] is not None]
    assert sorted(Path(p).name for p in bad) == ["text.png", "truncated.jpg"], bad
    return bad


@pytest.fixture(scope="module")
def vectors(embedding_artifacts, collection, config, tmp_path_factory):
    """The job's output folder (Parquet part files) over the collection, and what the command printed."""
    out = tmp_path_factory.mktemp("vectors") / "out"
    return out, batch(config, embedding_artifacts, str(collection), "-o", str(out))


@pytest.mark.slow
def test_vectors_are_the_predictors_and_pyarrow_and_ray_data_read_them(vectors, embedded):
    out, res = vectors
    assert res.exit_code == 1, res.output  # the two unreadable files
    assert "82 images, 2 errors" in res.stderr and f"embeddings of {WIDTH} float32" in res.stderr
    assert len(list(out.glob("*.parquet"))) >= 2  # part files of batch.rows_per_file rows
    table = read(out)
    assert_vectors_equal_embed(table, embedded)
    errors = {Path(r["path"]).name: r["error"] for r in table.to_pylist() if r["error"]}
    assert "truncated" in errors["truncated.jpg"] and "not a recognised image" in errors["text.png"]

    import ray.data

    got = ray.data.read_parquet(str(out)).take_batch(1000, batch_format="numpy")  # the whole output, in numpy
    assert sorted(got["path"]) == sorted(table.column("path").to_pylist())
    for path, vector, error in zip(got["path"], got["embedding"], got["error"]):
        if error is None:
            assert isinstance(vector, np.ndarray) and vector.shape == (WIDTH,) and vector.dtype == np.float32
            np.testing.assert_allclose(vector, embedded[path], atol=1e-5, rtol=0)


@pytest.mark.slow
def test_duckdb_selects_a_vector_as_it_is(vectors, embedded):
    duckdb = pytest.importorskip("duckdb")  # the dev extra
    out, _ = vectors
    path = sorted(embedded)[0]
    got = duckdb.sql(  # Parquet has no fixed-size list: DuckDB reads FLOAT[], cast to FLOAT[D] for array functions
        f"SELECT embedding, len(embedding), typeof(embedding), array_cosine_similarity(embedding::FLOAT[{WIDTH}], "
        f"embedding::FLOAT[{WIDTH}]) FROM read_parquet('{out}/*.parquet') WHERE path = $path",
        params={"path": path},
    ).fetchall()
    assert len(got) == 1 and got[0][1:3] == (WIDTH, "FLOAT[]") and got[0][3] == pytest.approx(1.0, abs=1e-6), got
    np.testing.assert_allclose(got[0][0], embedded[path], atol=1e-5, rtol=0)


@pytest.mark.slow
def test_a_killed_float16_job_resumes_each_input_once(embedding_artifacts, collection, config, embedded, tmp_path):
    """A job killed after writing part of its output (the first 40 inputs' rows in a part file), then --resume:
    only the rest is answered, every input once; a run with the other dtype is refused, naming the file."""
    out = tmp_path / "half.parquet"
    first = sorted(embedded)[:40]
    head = tmp_path / "head.parquet"
    res = batch(config, embedding_artifacts, *first, "-o", str(head), "--embedding-dtype", "float16")
    assert res.exit_code == 0, res.output
    staging = out.with_name(f".{out.name}.parts")  # where a killed single-file job leaves its parts
    staging.mkdir()
    shutil.copy(head, staging / "part-killed-00001.parquet")
    res = batch(
        config, embedding_artifacts, str(collection), "-o", str(out), "--embedding-dtype", "float32", "--resume"
    )
    assert res.exit_code == 2 and "part-killed-00001.parquet: its rows (embedding" in res.stderr, res.stderr
    res = batch(
        config, embedding_artifacts, str(collection), "-o", str(out), "--embedding-dtype", "float16", "--resume"
    )
    assert res.exit_code == 1 and "42 images, 2 errors, 40 already answered" in res.stderr, res.stderr
    assert_vectors_equal_embed(read(out), embedded, pa.float16(), atol=2e-3)
    again = batch(
        config, embedding_artifacts, str(collection), "-o", str(out), "--embedding-dtype", "float16", "--resume"
    )
    assert "nothing to do: all 82 inputs already answered" in again.stderr
    assert_vectors_equal_embed(read(out), embedded, pa.float16(), atol=2e-3)


def test_json_lines_are_refused_for_vectors_before_any_ray_work(embedding_artifacts, collection, config, tmp_path):
    res = batch(config, embedding_artifacts, str(collection), "-o", str(tmp_path / "v.jsonl"))
    assert res.exit_code == 2 and "an embedding export's vectors are written as Parquet" in res.stderr
    assert "use -o a folder (part files) or -o x.parquet" in res.stderr and not (tmp_path / "v.jsonl").exists()


def test_patch_tokens_column_only_when_asked(embedding_artifacts, tiny_artifacts, config, tmp_path):
    """--patch-tokens: a patch_tokens column (fixed-size list of P fixed-size lists of D, the embedding dtype) that
    pyarrow reads back as the Predictor's patch tokens, null for an unreadable image; the runs above, without the
    option, have no such column; an export without patch tokens refuses the option before any work."""
    from vitdeploy.demo import IMAGES_DIR
    from vitdeploy.runtime.predictor import Predictor

    paths = sorted(str(p) for p in IMAGES_DIR.glob("*.jpg"))[:3]
    bad = tmp_path / "text.png"
    bad.write_text("not an image")
    out = tmp_path / "tokens.parquet"
    res = batch(config, embedding_artifacts, *paths, str(bad), "-o", str(out), "--patch-tokens")
    assert res.exit_code == 1, res.output  # the unreadable file
    table = pq.read_table(out)
    assert table.column_names == ["path", "embedding", "patch_tokens", "error"]
    assert table.schema.field("patch_tokens").type == pa.list_(pa.list_(pa.float32(), WIDTH), 16)
    with Predictor.from_artifacts(embedding_artifacts, "ort") as predictor:
        vectors, tokens = predictor.embed(paths, patch_tokens=True)
    rows = {r["path"]: r for r in table.to_pylist()}
    assert rows[str(bad)]["patch_tokens"] is None and rows[str(bad)]["error"]
    for path, vector, patch in zip(paths, vectors, tokens):
        np.testing.assert_allclose(rows[path]["embedding"], vector, atol=1e-5, rtol=0)
        np.testing.assert_allclose(np.array(rows[path]["patch_tokens"]), patch, atol=1e-5, rtol=0)
    refused = batch(config, tiny_artifacts(), *paths, "-o", str(tmp_path / "no.parquet"), "--patch-tokens")
    assert refused.exit_code == 2 and "was exported without patch tokens" in refused.stderr, refused.stderr
    assert not (tmp_path / "no.parquet").exists()
