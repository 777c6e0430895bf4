"""Issue 10, theme 1: an export directory is trusted only after it is checked.

Each case is hit as a user would: `vitdeploy predict` (exit 2, one `error:` line naming the key or
file, no prediction on stdout) and the Python API (`Predictor.from_artifacts` raises ArtifactError).
Cases: a malformed manifest (schema), a listed artifact failing its sha256 or size (the whole
directory refused whatever the backend, `auto` included), a graph or model.json that disagrees with
the manifest (sha256 updated, so only the IO check can catch it), unreadable files.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers.bad_input import (
    GOOD_IMAGES,
    assert_one_error_line,
    copy_export,
    edit_manifest,
    flip_byte,
    rehash,
    run_cli,
    toy_classifier,
)

from vitdeploy.base.errors import ArtifactError, ArtifactIntegrityError
from vitdeploy.base.vocab import AUTO, RUNTIME_BACKENDS
from vitdeploy.cli import main
from vitdeploy.runtime.predictor import Predictor

pytestmark = pytest.mark.integration


def predict_cli(artifacts: Path, backend: str = "auto"):
    return CliRunner().invoke(
        main, ["predict", str(GOOD_IMAGES[0]), "-a", str(artifacts), "-b", backend, "--json"], catch_exceptions=False
    )


def assert_refused(artifacts: Path, *needles: str, backend: str = "auto") -> None:
    res = predict_cli(artifacts, backend)
    assert res.exit_code == 2, (res.exit_code, res.stdout, res.stderr)
    assert res.stdout == "", "no prediction may be served"
    assert_one_error_line(res.stderr, *needles)
    with pytest.raises(ArtifactError) as info:
        Predictor.from_artifacts(artifacts, backend=backend)
    for needle in needles:
        assert needle in str(info.value)


def _set(path: str, value):
    def edit(m):
        *parents, last = path.split(".")
        node = m
        for p in parents:
            node = node[p]
        node[last] = value

    return edit


def _delete(path: str):
    def edit(m):
        *parents, last = path.split(".")
        node = m
        for p in parents:
            node = node[p]
        del node[last]

    return edit


MANIFEST_CASES = {
    "sha256 missing": (_delete("artifacts.onnx.sha256"), "'artifacts.onnx.sha256' is missing"),
    "sha256 malformed": (_set("artifacts.onnx.sha256", "abc123"), "'artifacts.onnx.sha256' = 'abc123'"),
    "sha256 not a string": (_set("artifacts.onnx.sha256", 12345), "'artifacts.onnx.sha256' = 12345"),
    "bytes negative": (_set("artifacts.onnx.bytes", -1), "'artifacts.onnx.bytes' = -1"),
    "bytes a string": (_set("artifacts.onnx.bytes", "778341"), "'artifacts.onnx.bytes' = '778341'"),
    "bytes a float": (_set("artifacts.onnx.bytes", 10.5), "'artifacts.onnx.bytes' = 10.5"),
    "path null": (_set("artifacts.onnx.path", None), "'artifacts.onnx.path' = None"),
    "path absolute": (_set("artifacts.onnx.path", "/etc/passwd"), "'artifacts.onnx.path' = '/etc/passwd'"),
    "path traversal": (_set("artifacts.onnx.path", "../other/model.onnx"), "'artifacts.onnx.path'"),
    "path windows drive": (_set("artifacts.onnx.path", "C:\\model.onnx"), "'artifacts.onnx.path'"),
    "unknown entry key": (_set("artifacts.onnx.url", "http://x"), "unknown key 'artifacts.onnx.url'"),
    "role not a name": (
        lambda m: m["artifacts"].update({"../x": {"path": "model.onnx", "sha256": "0" * 64, "bytes": 1}}),
        "artifact role '../x'",
    ),
    "labels ints": (_set("labels", list(range(10))), "'labels[0]' = 0"),
    "labels a string": (_set("labels", "0123456789"), "'labels' = '0123456789'"),
    "3 labels for 10 classes": (_set("labels", ["a", "b", "c"]), "labels has 3 entries"),
    "labels missing": (_delete("labels"), "'labels' is missing"),
    "NaN in mean": (_set("preprocess.mean", [math.nan, 0.5, 0.5]), "'preprocess.mean[0]' = nan"),
    "std zero": (_set("preprocess.std", [0.5, 0, 0.5]), "'preprocess.std[1]' = 0"),
    "interpolation unknown": (_set("preprocess.interpolation", "cubic"), "'preprocess.interpolation' = 'cubic'"),
    "batch max 0": (_set("batch.max", 0), "'batch.max' = 0"),
    "batch min > max": (_set("batch", {"min": 16, "opt": 8, "max": 4}), "min <= opt <= max"),
    "batch max huge": (_set("batch.max", 10**9), "'batch.max' = 1000000000"),
    "batch a string": (_set("batch.max", "32"), "'batch.max' = '32'"),
    "input 64x64 vs preprocess 32": (_set("io.input.shape", ["batch", 3, 64, 64]), "differs from the model input"),
    "input rank 3": (_set("io.input.shape", ["batch", 32, 32]), "io.input.shape"),
    "output dtype int8": (_set("io.output.dtype", "int8"), "'io.output.dtype' = 'int8'"),
    "output classes 0": (_set("io.output.shape", ["batch", 0]), "'io.output.shape'"),
    "io missing": (_delete("io"), "'io' is missing"),
    "format wrong": (_set("format", "onnx"), "not a vitdeploy manifest"),
    "version from the future": (_set("version", 99), "manifest version 99 is not supported"),
    "empty object": (lambda m: m.clear(), '"format" is None'),
}


@pytest.mark.parametrize("case", list(MANIFEST_CASES))
def test_malformed_manifest_is_refused_naming_the_key(demo_artifacts, tmp_path, case):
    edit, needle = MANIFEST_CASES[case]
    d = copy_export(demo_artifacts, tmp_path / "a")
    edit_manifest(d, edit)
    assert_refused(d, needle, "manifest.json")


def test_manifest_that_is_not_an_object_or_huge_or_deep_is_refused(demo_artifacts, tmp_path):
    d = copy_export(demo_artifacts, tmp_path / "a")
    for content, needle in (
        ("[1, 2]", "expected a JSON object"),
        ("[" * 100_000 + "]" * 100_000, "manifest.json"),
        ('{"format": ' + '"x"' * 3 + "}", "not valid JSON"),
    ):
        (d / "manifest.json").write_text(content)
        assert_refused(d, needle)


def test_long_hostile_values_are_cut_in_the_error(demo_artifacts, tmp_path):
    d = copy_export(demo_artifacts, tmp_path / "a")
    edit_manifest(d, _set("artifacts.onnx.sha256", "f" * 5_000_000))
    res = predict_cli(d)
    line = assert_one_error_line(res.stderr, "'artifacts.onnx.sha256'")
    assert len(line) < 1000


def test_manifest_written_by_this_version_validates_with_its_informational_keys(demo_artifacts):
    from vitdeploy.runtime.manifest_schema import parse_manifest

    data = json.loads((demo_artifacts / "manifest.json").read_text())
    schema = parse_manifest(data, demo_artifacts / "manifest.json")
    assert set(data) - set(type(schema).model_fields) == set(), "every key the exporter writes is described"
    parse_manifest({**data, "written_by_a_later_version": {"x": 1}}, demo_artifacts / "manifest.json")


# ----------------------------------------------------------------------------- tampered files


@pytest.mark.parametrize("backend", [AUTO, *RUNTIME_BACKENDS])  # every backend of the vocabulary
@pytest.mark.parametrize(
    "name", ["model.onnx", "model.ort.onnx", "model.fp16.onnx", "model.safetensors", "model.json"]
)
def test_one_tampered_artifact_refuses_the_directory_whatever_the_backend(demo_artifacts, tmp_path, name, backend):
    d = copy_export(demo_artifacts, tmp_path / "a")
    flip_byte(d / name)
    assert_refused(d, "tampered or corrupt", name, "sha256 expected", backend=backend)


@pytest.mark.parametrize("change", ["append", "truncate", "delete"])
def test_size_change_or_missing_artifact_refuses_the_directory(demo_artifacts, tmp_path, change):
    d = copy_export(demo_artifacts, tmp_path / "a")
    target = d / "model.ort.onnx"
    if change == "append":
        target.write_bytes(target.read_bytes() + b"\0")
    elif change == "truncate":
        target.write_bytes(target.read_bytes()[:100])
    else:
        target.unlink()
    with pytest.raises(ArtifactIntegrityError):
        Predictor.from_artifacts(d, backend="torch")  # even a backend that never reads that file
    assert_refused(d, "model.ort.onnx", backend="torch")


# ----------------------------------------------------------------------------- files that disagree with the manifest

GRAPH_CASES = {
    "7 classes": (dict(classes=7), "output shape"),
    "12 classes": (dict(classes=12), "[batch, 10] (10 labels)"),
    "64x64 input": (dict(side=64), "input shape"),
    "input renamed": (dict(input_name="x"), "input is named 'x'"),
    "output renamed": (dict(output_name="probs"), "no output named 'logits'"),
    "extra output": (dict(extra_output=True), "not in the manifest's io"),
}


@pytest.mark.parametrize("case", list(GRAPH_CASES))
@pytest.mark.parametrize(
    "name,backend", [("model.ort.onnx", "auto"), ("model.ort.onnx", "ort"), ("model.fp16.onnx", "ort-fp16")]
)
def test_valid_graph_that_disagrees_with_the_manifest_is_refused(demo_artifacts, tmp_path, case, name, backend):
    kwargs, needle = GRAPH_CASES[case]
    d = copy_export(demo_artifacts, tmp_path / "a")
    toy_classifier(d / name, **kwargs)
    rehash(d, {"model.ort.onnx": "onnx-ort", "model.fp16.onnx": "onnx-fp16"}[name])
    assert_refused(d, needle, name, "disagrees with", backend=backend)


@pytest.mark.parametrize("backend", ["auto", "ort"])
def test_listed_graph_that_is_not_onnx_at_all_is_refused_not_skipped(demo_artifacts, tmp_path, backend):
    d = copy_export(demo_artifacts, tmp_path / "a")
    (d / "model.ort.onnx").write_bytes(b"\x08\x07garbage that protobuf cannot parse" * 100)
    rehash(d, "onnx-ort")
    assert_refused(d, "model.ort.onnx", "not a valid ONNX graph", backend=backend)


def test_the_toy_graph_itself_is_accepted_when_it_agrees(demo_artifacts, tmp_path):
    """The cases above fail for the disagreement only: the same graph with 10 classes serves."""
    d = copy_export(demo_artifacts, tmp_path / "a")
    toy_classifier(d / "model.ort.onnx")
    rehash(d, "onnx-ort")
    with Predictor.from_artifacts(d, backend="ort") as p:
        assert len(p.predict([str(GOOD_IMAGES[0])])) == 1


@pytest.mark.parametrize(
    "key,value,needle",
    [
        ("num_classes", 12, "12 classes"),
        ("image_size", 64, "image size 64"),
        ("heads", 0, "'vit.heads' = 0"),
        ("width", "64", "'vit.width' = '64'"),
    ],
)
def test_model_json_that_disagrees_with_the_manifest_is_refused(demo_artifacts, tmp_path, key, value, needle):
    d = copy_export(demo_artifacts, tmp_path / "a")
    cfg = json.loads((d / "model.json").read_text())
    cfg["vit"][key] = value
    (d / "model.json").write_text(json.dumps(cfg))
    rehash(d, "weights-config")
    for backend in ("auto", "torch", "ort"):
        assert_refused(d, needle, "model.json", backend=backend)


# ----------------------------------------------------------------------------- unreadable files


@pytest.mark.parametrize("what", ["model.ort.onnx", "model.safetensors", "manifest.json", "directory"])
def test_unreadable_artifact_is_a_clean_error_naming_the_file(demo_artifacts, tmp_path, what):
    d = copy_export(demo_artifacts, tmp_path / "a")
    target = d if what == "directory" else d / what
    target.chmod(0)
    try:
        res = run_cli("predict", str(GOOD_IMAGES[0]), "-a", str(d), unprivileged=True)
        code = (
            "from vitdeploy.runtime.predictor import Predictor\n"
            "from vitdeploy.base.errors import ArtifactError\n"
            f"try:\n    Predictor.from_artifacts({str(d)!r})\nexcept ArtifactError as e:\n    print('REFUSED', e)"
        )
        from helpers.bad_input import run_python

        api = run_python(code, unprivileged=True)
    finally:
        target.chmod(0o755 if what == "directory" else 0o644)
    assert res.returncode == 2, res.stderr
    assert res.stdout == ""
    name = d.name if what == "directory" else what
    assert_one_error_line(res.stderr, name, "ermission denied")
    assert api.stdout.startswith("REFUSED") and name in api.stdout and "Traceback" not in api.stderr, api
