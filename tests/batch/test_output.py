"""batch-predict's output: complete under its final name only when the job ends; what a killed job
wrote is read back by --resume, a cut last line included."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from vitdeploy.base.errors import InputError
from vitdeploy.batch.output import Output, row_schema


def rows(paths, error=None):
    n = len(paths)
    top = [[{"label": "a", "index": 0, "score": 0.5}]] * n
    return pa.Table.from_pydict(
        {
            "path": list(paths),
            "label": ["a"] * n,
            "index": [0] * n,
            "score": [0.5] * n,
            "top_k": top if error is None else [None] * n,
            "error": [error] * n,
        },
        schema=row_schema(),
    )


@pytest.mark.parametrize("name", ["out", "out.parquet", "out.jsonl"])
def test_a_killed_job_leaves_what_it_flushed_and_resume_completes_it(tmp_path, name):
    out = Output.at(tmp_path / name)
    w = out.writer(resume=False, rows_per_file=2)
    w.write(rows(["a", "b"]))  # flushed: 2 rows
    w.write(rows(["c"]))  # pending when the job dies
    # killed here: no close()
    again = Output.at(tmp_path / name)
    assert set(again.answered()) == {"a", "b"}
    if name != "out":
        assert not (tmp_path / name).exists()  # never a half output under the final name
    with pytest.raises(InputError, match="output exists; pass --resume"):
        again.writer(resume=False)
    w2 = again.writer(resume=True)
    w2.write(rows(["c", "d"], error="d: broken"))
    w2.close()
    done = Output.at(tmp_path / name).answered()
    assert done == {"a": None, "b": None, "c": "d: broken", "d": "d: broken"}
    if name == "out.parquet":
        assert pq.read_table(tmp_path / name).num_rows == 4 and not out.staging.exists()
    if name == "out.jsonl":
        lines = (tmp_path / name).read_text().splitlines()
        assert [json.loads(line)["path"] for line in lines] == ["a", "b", "c", "d"]


def test_a_jsonl_line_cut_by_a_kill_is_not_an_answer_and_is_replaced(tmp_path):
    out = Output.at(tmp_path / "x.jsonl")
    out.staging.write_text(json.dumps({"path": "a", "error": None}) + "\n" + '{"path": "b", "lab')
    assert set(out.answered()) == {"a"}
    w = out.writer(resume=True)
    w.write(rows(["b"]))
    w.close()
    assert [json.loads(line)["path"] for line in (tmp_path / "x.jsonl").read_text().splitlines()] == ["a", "b"]


def test_a_finished_parquet_file_is_extended_by_resume(tmp_path):
    out = Output.at(tmp_path / "x.parquet")
    w = out.writer(resume=False)
    w.write(rows(["a"]))
    w.close()
    w = Output.at(tmp_path / "x.parquet").writer(resume=True)
    w.write(rows(["b"]))
    w.close()
    assert sorted(pq.read_table(tmp_path / "x.parquet").column("path").to_pylist()) == ["a", "b"]


def test_unknown_output_suffix_and_garbage_files_are_one_line_errors(tmp_path):
    with pytest.raises(InputError, match=r"unknown output format '\.csv'"):
        Output.at(tmp_path / "x.csv")
    (tmp_path / "x.jsonl").write_text("not json\n")
    with pytest.raises(InputError, match=r"x\.jsonl:1: not a batch-predict row"):
        Output.at(tmp_path / "x.jsonl").answered()
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "part-1.parquet").write_bytes(b"garbage")
    with pytest.raises(InputError, match=r"part-1\.parquet: cannot read this output file"):
        Output.at(tmp_path / "d").answered()


def vectors(paths, dim=3, dtype="float32", error=None):
    """Embedding rows: row i holds [i, i, ...] (null with ``error``)."""
    schema = row_schema(dim, dtype)
    values = [None if error else [float(i)] * dim for i in range(len(paths))]
    return pa.Table.from_pydict({"path": list(paths), "embedding": values, "error": [error] * len(paths)}, schema)


@pytest.mark.parametrize("dtype, arrow", [("float32", pa.float32()), ("float16", pa.float16())])
def test_embedding_rows_are_a_fixed_size_list_and_a_killed_job_resumes(tmp_path, dtype, arrow):
    schema = row_schema(3, dtype)
    assert schema.names == ["path", "embedding", "error"] and schema.field("embedding").type == pa.list_(arrow, 3)
    out = Output.at(tmp_path / "v.parquet", schema)
    w = out.writer(resume=False, rows_per_file=2)
    w.write(vectors(["a", "b"], dtype=dtype))  # flushed
    w.write(vectors(["c"], dtype=dtype))  # lost with the kill
    again = Output.at(tmp_path / "v.parquet", schema)
    assert set(again.answered()) == {"a", "b"}
    w = again.writer(resume=True)
    w.write(vectors(["c"], dtype=dtype))
    w.write(vectors(["d"], dtype=dtype, error="d: not an image"))
    w.close()
    table = pq.read_table(tmp_path / "v.parquet")
    assert table.schema.field("embedding").type == pa.list_(arrow, 3)
    assert sorted(table.column("path").to_pylist()) == ["a", "b", "c", "d"]  # each once
    rows = {r["path"]: r for r in table.to_pylist()}
    assert rows["b"]["embedding"] == [1.0, 1.0, 1.0] and rows["d"]["embedding"] is None


def test_embeddings_refuse_json_lines_and_resume_refuses_another_kind_of_rows(tmp_path):
    with pytest.raises(InputError, match=r"-o .*x\.jsonl: an embedding export's vectors are written as Parquet"):
        Output.at(tmp_path / "x.jsonl", row_schema(3))
    w = Output.at(tmp_path / "d").writer(resume=False)  # a classifier's rows
    w.write(rows(["a"]))
    w.close()
    with pytest.raises(InputError, match=r"its rows \(label, index, score, top_k\) are not this job's \(embedding"):
        Output.at(tmp_path / "d", row_schema(3)).answered()
    w = Output.at(tmp_path / "e", row_schema(3)).writer(resume=False)
    w.write(vectors(["a"]))
    w.close()
    with pytest.raises(InputError, match=r"halffloat.*another export, --embedding-dtype"):
        Output.at(tmp_path / "e", row_schema(3, "float16")).answered()
    assert Output.at(tmp_path / "e", row_schema(3)).answered() == {"a": None}


def test_rows_without_an_answer_hold_only_the_path_and_the_reason(tmp_path):
    table = Output.at(tmp_path / "e", row_schema(4, "float16")).empty_rows(["x.jpg"], ["x.jpg: no such file"])
    assert table.to_pylist() == [{"path": "x.jpg", "embedding": None, "error": "x.jpg: no such file"}]
    assert Output.at(tmp_path / "c.jsonl").empty_rows(["y"], ["y: gone"]).to_pylist()[0]["top_k"] is None
