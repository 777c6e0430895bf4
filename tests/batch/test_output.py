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
