"""Artifacts: manifest errors, sha256/size verification, paths that leave the directory."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from vitdeploy.base.errors import ArtifactError, ArtifactIntegrityError
from vitdeploy.base.preprocess_spec import PreprocessSpec
from vitdeploy.runtime import artifacts as artifacts_mod
from vitdeploy.runtime.artifacts import Artifacts, check_onnx_external_data, sha256_file


def entry(directory: Path, name: str) -> dict:
    path = directory / name
    return {"path": name, "sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "bytes": path.stat().st_size}


def manifest(artifacts: dict, **overrides) -> dict:
    data = {
        "format": "vitdeploy-manifest",
        "version": 1,
        "name": "tiny",
        "created": "2025-01-01T00:00:00+00:00",
        "model": {"vit": {}, "source": {"path": "x", "format": "vitdeploy"}},
        "labels": ["cat", "dog"],
        "preprocess": {
            "style": "timm",
            "height": 48,
            "width": 48,
            "crop_pct": 0.9,
            "interpolation": "bicubic",
            "mean": [0.485, 0.456, 0.406],
            "std": [0.229, 0.224, 0.225],
            "background": [0, 0, 0],
        },
        "io": {
            "input": {"name": "pixel_values", "dtype": "float32", "shape": ["batch", 3, 48, 48]},
            "output": {"name": "logits", "dtype": "float32", "shape": ["batch", 2]},
        },
        "batch": {"min": 1, "opt": 4, "max": 16},
        "artifacts": artifacts,
    }
    data.update(overrides)
    return data


def onnx_with_external_data(path: Path, location: str, nbytes: int) -> None:
    """A valid ONNX graph whose one initializer (``nbytes`` of float32) is stored in ``location``."""
    from onnx import TensorProto, helper, save

    weight = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[nbytes // 4])
    weight.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", str(nbytes))):
        weight.external_data.add(key=key, value=value)
    out = helper.make_tensor_value_info("w_out", TensorProto.FLOAT, [nbytes // 4])
    graph = helper.make_graph([helper.make_node("Identity", ["w"], ["w_out"])], "g", [], [out], initializer=[weight])
    save(helper.make_model(graph), str(path))


@pytest.fixture
def export_dir(tmp_path) -> Path:
    """An export directory with a 'model' (plus external data) and a 'weights' file."""
    d = tmp_path / "out"
    d.mkdir()
    onnx_with_external_data(d / "model.onnx", "model.onnx.data", 4096)
    (d / "model.onnx.data").write_bytes(os.urandom(4096))
    (d / "model.safetensors").write_bytes(os.urandom(2048))
    onnx_entry = entry(d, "model.onnx")
    onnx_entry["external_data"] = [entry(d, "model.onnx.data")]
    (d / "manifest.json").write_text(
        json.dumps(manifest({"onnx": onnx_entry, "weights": entry(d, "model.safetensors")}))
    )
    return d


def flip_byte(path: Path, at: int = 10) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


# ----------------------------------------------------------------------------- opening the manifest


def test_missing_directory(tmp_path):
    with pytest.raises(ArtifactError) as info:
        Artifacts.open(tmp_path / "nope")
    assert str(tmp_path / "nope") in str(info.value) and "vitdeploy export" in str(info.value)


def test_missing_manifest(tmp_path):
    with pytest.raises(ArtifactError) as info:
        Artifacts.open(tmp_path)
    assert str(tmp_path / "manifest.json") in str(info.value) and "vitdeploy export" in str(info.value)


def test_bad_json(tmp_path):
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(ArtifactError, match=r"manifest\.json is not valid JSON.*vitdeploy export"):
        Artifacts.open(tmp_path)


@pytest.mark.parametrize("fmt", ["vitdeploy", None, "onnx"])
def test_wrong_format(tmp_path, fmt):
    (tmp_path / "manifest.json").write_text(json.dumps(manifest({}, format=fmt)))
    with pytest.raises(ArtifactError) as info:
        Artifacts.open(tmp_path)
    assert "vitdeploy-manifest" in str(info.value) and repr(fmt) in str(info.value)
    assert "vitdeploy export" in str(info.value)


def test_newer_manifest_version_is_refused(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps(manifest({}, version=2)))
    with pytest.raises(ArtifactError, match="version 2"):
        Artifacts.open(tmp_path)


def test_bad_preprocess_or_io_is_an_artifact_error(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps(manifest({}, preprocess={"style": "keras"})))
    with pytest.raises(ArtifactError, match="preprocess"):
        Artifacts.open(tmp_path)
    bad_io = {
        "input": {"name": "pixel_values", "shape": ["batch", 3]},
        "output": {"name": "logits", "shape": ["batch", 2]},
    }
    (tmp_path / "manifest.json").write_text(json.dumps(manifest({}, io=bad_io)))
    with pytest.raises(ArtifactError, match="io.input.shape"):
        Artifacts.open(tmp_path)


def test_properties(export_dir):
    art = Artifacts.open(export_dir)
    assert art.directory == export_dir
    assert art.name == "tiny"
    assert art.labels == ["cat", "dog"]
    assert art.input_shape == (3, 48, 48)
    assert art.batch == {"min": 1, "opt": 4, "max": 16}
    assert art.preprocess == PreprocessSpec(
        style="timm",
        height=48,
        width=48,
        crop_pct=0.9,
        interpolation="bicubic",
        mean=(0.485, 0.456, 0.406),
        std=(0.229, 0.224, 0.225),
        background=(0, 0, 0),
    )
    assert art.has("onnx") and art.has("weights") and not art.has("engine")
    assert art.manifest["format"] == "vitdeploy-manifest"
    assert Artifacts.open(export_dir / "manifest.json").directory == export_dir  # the file itself is accepted


def test_missing_role_names_role_and_present_ones(export_dir):
    with pytest.raises(ArtifactError) as info:
        Artifacts.open(export_dir).path("engine")
    assert "'engine'" in str(info.value) and "onnx" in str(info.value)


# ----------------------------------------------------------------------------- verification


def test_sha256_file_streams_large_files(tmp_path):
    big = tmp_path / "big.bin"
    data = os.urandom(3 * (1 << 20) + 123)  # spans several 1 MiB chunks
    big.write_bytes(data)
    assert sha256_file(big) == hashlib.sha256(data).hexdigest()


def test_good_files_verify(export_dir):
    art = Artifacts.open(export_dir)
    assert art.path("onnx") == (export_dir / "model.onnx").resolve()
    assert set(art.verify()) == {"onnx", "weights"}


def test_flipped_byte_is_reported_as_tampered_and_refuses_the_directory(export_dir):
    flip_byte(export_dir / "model.safetensors")
    with pytest.raises(ArtifactIntegrityError) as info:
        Artifacts.open(export_dir)  # one tampered file refuses the whole directory, at open
    msg = str(info.value)
    assert "tampered or corrupt" in msg and "model.safetensors" in msg and "sha256 expected" in msg
    art = Artifacts.open(export_dir, verify=False)  # role by role, the others are still fine
    assert art.path("onnx") == (export_dir / "model.onnx").resolve()
    with pytest.raises(ArtifactIntegrityError):
        art.path("weights")


def test_tampered_external_data_is_reported(export_dir):
    flip_byte(export_dir / "model.onnx.data", at=100)
    with pytest.raises(ArtifactError, match=r"tampered or corrupt: .*model\.onnx\.data sha256 expected"):
        Artifacts.open(export_dir).path("onnx")


def test_size_mismatch_is_reported(export_dir):
    with open(export_dir / "model.safetensors", "ab") as fh:
        fh.write(b"\0")
    with pytest.raises(ArtifactError, match=r"model\.safetensors size expected 2048 bytes got 2049"):
        Artifacts.open(export_dir).path("weights")


def test_missing_file_is_reported(export_dir):
    (export_dir / "model.onnx.data").unlink()
    with pytest.raises(ArtifactError, match=r"model\.onnx\.data is missing"):
        Artifacts.open(export_dir).path("onnx")


def test_each_file_is_hashed_once_per_instance(export_dir, monkeypatch):
    calls = []
    real = artifacts_mod.sha256_file
    monkeypatch.setattr(artifacts_mod, "sha256_file", lambda p: (calls.append(Path(p).name), real(p))[1])
    art = Artifacts.open(export_dir)  # verifies every listed file once
    for _ in range(3):
        art.path("onnx")
    assert sorted(calls) == ["model.onnx", "model.onnx.data", "model.safetensors"]
    Artifacts.open(export_dir).path("onnx")  # a new instance verifies again
    assert len(calls) == 6


# ----------------------------------------------------------------------------- paths leaving the directory


@pytest.mark.parametrize("bad", ["../outside.bin", "sub/../../outside.bin", "ABSOLUTE"])
def test_artifact_path_escaping_the_directory_is_refused(tmp_path, bad):
    d = tmp_path / "out"
    d.mkdir()
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"secret")
    path = str(outside) if bad == "ABSOLUTE" else bad
    item = {"path": path, "sha256": hashlib.sha256(b"secret").hexdigest(), "bytes": 6}
    (d / "manifest.json").write_text(json.dumps(manifest({"onnx": item})))
    with pytest.raises(ArtifactError, match="outside|absolute|stay inside"):
        Artifacts.open(d).path("onnx")


def test_symlink_escaping_the_directory_is_refused(tmp_path):
    d = tmp_path / "out"
    d.mkdir()
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"secret")
    (d / "model.onnx").symlink_to(outside)
    (d / "manifest.json").write_text(json.dumps(manifest({"onnx": entry(d, "model.onnx")})))
    with pytest.raises(ArtifactError, match="outside"):
        Artifacts.open(d).path("onnx")


def test_external_data_entry_escaping_the_directory_is_refused(export_dir, tmp_path):
    (tmp_path / "evil.bin").write_bytes(b"x")
    data = json.loads((export_dir / "manifest.json").read_text())
    data["artifacts"]["onnx"]["external_data"] = [{"path": "../evil.bin", "sha256": "0" * 64, "bytes": 1}]
    (export_dir / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match=r"artifacts\.onnx\.external_data\[0\]\.path.*stay inside"):
        Artifacts.open(export_dir).path("onnx")


# ----------------------------------------------------------------------------- ONNX external data locations


def _onnx_with_external(directory: Path, location: str) -> Path:
    import onnx
    from onnx import TensorProto, helper

    weight = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4])
    weight.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", "16")):
        weight.external_data.add(key=key, value=value)
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        initializer=[weight],
    )
    path = directory / "model.onnx"
    onnx.save(helper.make_model(graph), str(path))
    return path


def test_onnx_external_data_inside_is_accepted(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"\0" * 16)
    assert check_onnx_external_data(_onnx_with_external(tmp_path, "weights.bin")) == [
        (tmp_path / "weights.bin").resolve()
    ]


@pytest.mark.parametrize("location", ["../evil.bin", "/etc/passwd"])
def test_onnx_external_data_outside_is_refused(tmp_path, location):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (tmp_path / "evil.bin").write_bytes(b"\0" * 16)
    with pytest.raises(ArtifactError) as info:
        check_onnx_external_data(_onnx_with_external(model_dir, location))
    assert location in str(info.value) and "'w'" in str(info.value)


def test_onnx_external_data_missing_file_is_reported(tmp_path):
    with pytest.raises(ArtifactError, match="missing"):
        check_onnx_external_data(_onnx_with_external(tmp_path, "gone.bin"))


# ----------------------------------------------------------------------------- malformed manifest values


@pytest.mark.parametrize("value", ["2048", "lots", 2048.5, -1, True, [2048]])
def test_non_integer_bytes_is_an_artifact_error_naming_the_key(export_dir, value):
    data = json.loads((export_dir / "manifest.json").read_text())
    data["artifacts"]["weights"]["bytes"] = value
    (export_dir / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ArtifactError) as info:
        Artifacts.open(export_dir).path("weights")
    assert "'artifacts.weights.bytes'" in str(info.value) and repr(value) in str(info.value)


def test_non_integer_external_data_bytes_is_an_artifact_error(export_dir):
    data = json.loads((export_dir / "manifest.json").read_text())
    data["artifacts"]["onnx"]["external_data"][0]["bytes"] = "4k"
    (export_dir / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match=r"'artifacts\.onnx\.external_data\[0\]\.bytes' = '4k'"):
        Artifacts.open(export_dir).path("onnx")


@pytest.mark.parametrize("value", [5, [1, 8, 32], "min", "1-32"])
def test_non_mapping_batch_is_an_artifact_error_naming_the_key(tmp_path, value):
    (tmp_path / "manifest.json").write_text(json.dumps(manifest({}, batch=value)))
    with pytest.raises(ArtifactError) as info:
        Artifacts.open(tmp_path)
    assert "manifest.json: 'batch' = " in str(info.value) and repr(value) in str(info.value)


def test_missing_batch_uses_the_defaults(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"w")
    data = manifest({"weights": entry(tmp_path, "model.safetensors")})
    del data["batch"]
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    assert Artifacts.open(tmp_path).batch == {"min": 1, "opt": 8, "max": 32}


@pytest.mark.parametrize("bad", [{"interpolation": "cubic"}, {"background": [0, 0, 256]}, {"background": [0, 0]}])
def test_invalid_preprocess_values_are_an_artifact_error(tmp_path, bad):
    data = manifest({})
    data["preprocess"].update(bad)
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ArtifactError) as info:
        Artifacts.open(tmp_path)
    assert f"manifest.json: 'preprocess.{next(iter(bad))}" in str(info.value)
