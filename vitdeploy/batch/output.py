"""Where a batch job's rows go: Parquet (a folder of part files, or one file) or JSON Lines, resumable.

    out = Output.at("scores/")                # or "scores.parquet", "scores.jsonl"
    done = out.answered()                     # {path: error or None} of the rows already written
    w = out.writer(resume=True)
    w.write(rows)                             # a pyarrow Table with the columns of out.schema
    w.close()                                 # the output is complete under its final name

A classifier's rows hold a label and k scores (:data:`COLUMNS`); an embedding export's rows hold the
vector as an Arrow fixed-size list (:data:`EMBEDDING_COLUMNS`, ``row_schema(dim)``), always in Parquet,
which pyarrow, DuckDB and Ray Data read as they are (JSON Lines would spell every float as text).

Rows are small (a path, a label, k scores, a vector), so the driver writes them all, and every write is
atomic: part files are written under a temporary name and renamed; one file (``x.parquet``,
``x.jsonl``) is assembled beside the final name (``.x.parquet.parts/``, ``x.jsonl.partial``) and
renamed onto it when the job ends. A job killed halfway leaves complete parts (or complete lines)
that ``--resume`` reads back, so no answered input is ever read again.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..base._deps import require
from ..base.errors import InputError, WriteError
from ..base.vocab import EMBEDDING_DTYPES

log = logging.getLogger(__name__)

COLUMNS = ("path", "label", "index", "score", "top_k", "error")
#: an embedding export's row: the vector null when ``error`` is not (and ``patch_tokens`` before ``error`` when
#: the job asked for them)
EMBEDDING_COLUMNS = ("path", "embedding", "error")


def row_schema(dim: int | None = None, dtype: str = EMBEDDING_DTYPES[0], patch_shape: Any = None) -> Any:
    """The output's Arrow schema: one row per input; ``error`` null, or the one-line reason. ``dim``: an embedding
    export's width, the rows then ``path``, ``embedding`` (``fixed_size_list<dtype>[dim]``), ``error``; with
    ``patch_shape`` (P, D), ``patch_tokens`` (``fixed_size_list<fixed_size_list<dtype>[D]>[P]``) before ``error``."""
    pa = require("pyarrow", "batch-predict output")
    if dim is not None:
        value = _ARROW_FLOATS[dtype](pa)
        columns = [("path", pa.string()), ("embedding", pa.list_(value, int(dim)))]
        if patch_shape is not None:
            patches, width = (int(d) for d in patch_shape)
            columns.append(("patch_tokens", pa.list_(pa.list_(value, width), patches)))
        return pa.schema([*columns, ("error", pa.string())])
    top = pa.struct([("label", pa.string()), ("index", pa.int64()), ("score", pa.float64())])
    return pa.schema(
        [
            ("path", pa.string()),
            ("label", pa.string()),
            ("index", pa.int64()),
            ("score", pa.float64()),
            ("top_k", pa.list_(top)),
            ("error", pa.string()),
        ]
    )


_ARROW_FLOATS = {EMBEDDING_DTYPES[0]: lambda pa: pa.float32(), EMBEDDING_DTYPES[1]: lambda pa: pa.float16()}


def _tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")


@dataclass(frozen=True)
class Output:
    """An output location: ``kind`` "parquet-dir", "parquet-file" or "jsonl"; ``schema`` its rows' (None: a
    classifier's, :func:`row_schema`)."""

    path: Path
    kind: str
    schema: Any = None

    @classmethod
    def at(cls, path: str | os.PathLike[str], schema: Any = None) -> "Output":
        """``schema``: ``row_schema(dim)`` for an embedding export, whose vectors go to Parquet only."""
        p = Path(path)
        suffix = p.suffix.lower()
        if suffix == ".jsonl":
            kind = "jsonl"
        elif suffix == ".parquet":
            kind = "parquet-file"
        elif suffix in ("", ".d") or p.is_dir():
            kind = "parquet-dir"
        else:
            raise InputError(
                f"-o {p}: unknown output format {suffix!r}; use a folder (Parquet part files), "
                "x.parquet (one Parquet file) or x.jsonl (JSON Lines)"
            )
        if p.exists() and (p.is_dir() != (kind == "parquet-dir")):
            raise InputError(
                f"-o {p}: exists and is {'a folder' if p.is_dir() else 'a file'}, but {kind} output "
                f"needs {'a folder' if kind == 'parquet-dir' else 'a file'}"
            )
        schema = schema if schema is not None else row_schema()
        if kind == "jsonl" and "embedding" in schema.names:
            raise InputError(
                f"-o {p}: an embedding export's vectors are written as Parquet (a fixed-size list column that "
                "pyarrow, DuckDB and Ray Data read as it is); use -o a folder (part files) or -o x.parquet"
            )
        return cls(p, kind, schema)

    # ------------------------------------------------------------------ what is there already

    @property
    def staging(self) -> Path:
        """Where rows accumulate before the final rename (the folder itself for parquet-dir)."""
        if self.kind == "parquet-dir":
            return self.path
        if self.kind == "parquet-file":
            return self.path.with_name(f".{self.path.name}.parts")
        return self.path.with_name(self.path.name + ".partial")

    def exists(self) -> bool:
        if self.kind == "parquet-dir":
            return self.path.is_dir() and any(self._parts(self.path))
        return self.path.exists() or self.staging.exists()

    @staticmethod
    def _parts(folder: Path) -> list[Path]:
        if not folder.is_dir():
            return []
        return sorted(p for p in folder.iterdir() if p.suffix == ".parquet" and not p.name.startswith("."))

    def _files(self) -> list[Path]:
        if self.kind == "jsonl":
            return [p for p in (self.path, self.staging) if p.is_file()]
        if self.kind == "parquet-file":
            return ([self.path] if self.path.is_file() else []) + self._parts(self.staging)
        return self._parts(self.path)

    def answered(self) -> dict[str, str | None]:
        """{path: error or None} of every row already written (complete parts and lines only)."""
        done: dict[str, str | None] = {}
        for file in self._files():
            for path, error in _jsonl_rows(file) if self.kind == "jsonl" else _parquet_rows(file, self.schema):
                done[path] = error
        return done

    def writer(self, *, resume: bool, rows_per_file: int = 10_000, flush_seconds: float = 30.0) -> "RowWriter":
        if self.exists() and not resume:
            raise InputError(
                f"-o {self.path}: output exists; pass --resume to continue it (inputs already answered "
                "are skipped), or remove it"
            )
        return RowWriter(self, rows_per_file, flush_seconds)

    def empty_rows(self, paths: list[str], errors: list[str]) -> Any:
        """Rows of inputs without an answer: each ``path`` with its ``error``, every other column null."""
        pa = require("pyarrow", "batch-predict output")
        columns = {name: pa.nulls(len(paths), self.schema.field(name).type) for name in self.schema.names}
        columns["path"], columns["error"] = pa.array(paths, pa.string()), pa.array(errors, pa.string())
        return pa.Table.from_pydict(columns, schema=self.schema)


def _parquet_rows(file: Path, schema: Any) -> list[tuple[str, str | None]]:
    pq = require("pyarrow.parquet", "batch-predict --resume")
    try:
        have = pq.read_schema(file)
        table = pq.read_table(file, columns=["path", "error"])
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a bad file
        raise InputError(
            f"{file}: cannot read this output file ({str(exc).splitlines()[0]}); it was not written "
            "by batch-predict, or it was damaged: move it away and run again with --resume"
        ) from None
    if not have.remove_metadata().equals(schema):  # another export's rows (classes, a width or a dtype)
        raise InputError(
            f"{file}: its rows ({_describe(have)}) are not this job's ({_describe(schema)}); it was written "
            "for another export, --embedding-dtype or --patch-tokens: write to another -o"
        )
    return list(zip(table.column("path").to_pylist(), table.column("error").to_pylist()))


def _describe(schema: Any) -> str:
    if "embedding" in schema.names:
        tokens = f", patch_tokens {schema.field('patch_tokens').type}" if "patch_tokens" in schema.names else ""
        return f"embedding {schema.field('embedding').type}{tokens}"
    return "label, index, score, top_k" if "label" in schema.names else ", ".join(schema.names)


def _jsonl_rows(file: Path) -> list[tuple[str, str | None]]:
    data = file.read_bytes()
    complete = data[: data.rfind(b"\n") + 1]  # a line cut by a kill is not an answer
    rows = []
    for number, line in enumerate(complete.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            rows.append((str(rec["path"]), rec.get("error")))
        except (ValueError, KeyError, TypeError):
            raise InputError(
                f"{file}:{number}: not a batch-predict row (expected a JSON object with a 'path'); "
                "move the file away or fix that line"
            ) from None
    return rows


class RowWriter:
    """Appends row tables; :meth:`close` publishes the output under its final name."""

    def __init__(self, output: Output, rows_per_file: int, flush_seconds: float) -> None:
        self.output = output
        self.rows_per_file = max(1, int(rows_per_file))
        self.flush_seconds = flush_seconds
        self._pending: list[Any] = []
        self._pending_rows = 0
        self._last_flush = time.monotonic()
        self._run = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        self._seq = 0
        self.rows = 0
        self._prepare()

    def _prepare(self) -> None:
        out = self.output
        if out.kind == "parquet-dir":
            out.path.mkdir(parents=True, exist_ok=True)
            for stale in out.path.glob(".*.tmp"):
                stale.unlink(missing_ok=True)
        elif out.kind == "parquet-file":
            out.path.parent.mkdir(parents=True, exist_ok=True)
            out.staging.mkdir(exist_ok=True)
            if out.path.is_file():  # a finished output being extended: its rows become the first part
                os.replace(out.path, out.staging / f"part-0-{self._run}-previous.parquet")
        else:
            out.path.parent.mkdir(parents=True, exist_ok=True)
            if out.path.is_file():
                if out.staging.exists():
                    raise InputError(f"-o {out.path}: both {out.path} and {out.staging} exist; merge or remove one")
                os.replace(out.path, out.staging)
            _drop_cut_line(out.staging)

    def write(self, table: Any) -> None:
        if table.num_rows == 0:
            return
        self._pending.append(table)
        self._pending_rows += table.num_rows
        self.rows += table.num_rows
        if self._pending_rows >= self.rows_per_file or time.monotonic() - self._last_flush >= self.flush_seconds:
            self.flush()

    def flush(self) -> None:
        self._last_flush = time.monotonic()
        if not self._pending:
            return
        try:
            self._flush()
        except OSError as exc:  # the disk full: one line; what was written stays for --resume
            if exc.errno not in WriteError.ERRNOS:
                raise
            raise WriteError(
                f"{WriteError.from_os(exc, self.output.path)} (the rows written before are kept beside it "
                f"in {self.output.staging.name}: with space back, --resume answers only the rest)"
            ) from exc

    def _flush(self) -> None:
        pa = require("pyarrow", "batch-predict output")
        table = pa.concat_tables(self._pending).cast(self.output.schema)
        self._pending, self._pending_rows = [], 0
        if self.output.kind == "jsonl":
            with open(self.output.staging, "a", encoding="utf-8") as fh:
                fh.write("".join(json.dumps(rec) + "\n" for rec in table.to_pylist()))
                fh.flush()
                os.fsync(fh.fileno())
            return
        pq = require("pyarrow.parquet", "batch-predict output")
        self._seq += 1
        final = self.output.staging / f"part-{self._run}-{self._seq:05d}.parquet"
        tmp = _tmp_name(final)
        pq.write_table(table, tmp)
        os.replace(tmp, final)

    def close(self) -> None:
        """Flush, then publish: the single file is assembled and renamed onto its final name."""
        self.flush()
        out = self.output
        if out.kind == "jsonl":
            if out.staging.exists():
                os.replace(out.staging, out.path)
            else:
                _write_atomic(out.path, b"")
        elif out.kind == "parquet-file":
            pa = require("pyarrow", "batch-predict output")
            pq = require("pyarrow.parquet", "batch-predict output")
            parts = out._parts(out.staging)
            tables = [pq.read_table(p).cast(out.schema) for p in parts]
            tmp = _tmp_name(out.path)
            pq.write_table(pa.concat_tables(tables) if tables else out.schema.empty_table(), tmp)
            os.replace(tmp, out.path)
            shutil.rmtree(out.staging, ignore_errors=True)
        log.info("wrote %d rows to %s", self.rows, out.path)


def _drop_cut_line(file: Path) -> None:
    """Cut a last line left unfinished by a killed job, so appended rows start on a line of their own."""
    if not file.is_file():
        return
    data = file.read_bytes()
    keep = data.rfind(b"\n") + 1
    if keep != len(data):
        with open(file, "r+b") as fh:
            fh.truncate(keep)


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = _tmp_name(path)
    tmp.write_bytes(data)
    os.replace(tmp, path)


__all__ = ["COLUMNS", "EMBEDDING_COLUMNS", "Output", "RowWriter", "row_schema"]
