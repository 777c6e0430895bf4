"""Backends and their registry: input checks, batch splitting, ORT vs torch agreement, providers.

The tiny export directory comes from the ``tiny_artifacts`` fixture (tests/conftest.py).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers.tiny_export import LABELS, file_entry, write_manifest  # tests/: on sys.path beside conftest.py

from vitdeploy.base.errors import ArtifactError, BackendError, ConfigError, InputError
from vitdeploy.base.vocab import BACKENDS, RUNTIME_BACKENDS
from vitdeploy.runtime.artifacts import Artifacts
from vitdeploy.runtime.backends import BackendOptions, backend_unavailable_reason, open_backend

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_dir(tiny_artifacts) -> Path:
    return tiny_artifacts(seed=0)


def _any_onnx(path) -> None:
    """A valid (empty) ONNX graph: every listed graph is parsed when a directory is opened."""
    from onnx import helper, save

    save(helper.make_model(helper.make_graph([], "g", [], [])), str(path))


@pytest.fixture(scope="module")
def artifacts(tiny_dir) -> Artifacts:
    return Artifacts.open(tiny_dir)


@pytest.fixture(scope="module")
def ort_backend(artifacts):
    backend = open_backend("ort", artifacts, BackendOptions())
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def batch5() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((5, 3, 32, 32)).astype(np.float32)


# ----------------------------------------------------------------------------- registry


def test_registry_lists_the_backends_and_rejects_unknown_names(artifacts):
    assert RUNTIME_BACKENDS == (
        "torch",
        "ort",
        "ort-fp16",
        "ort-int8",
        "trt",
        "trt-int8",
        "openvino",
        "openvino-int8",
        "openvino-bf16",
    )
    with pytest.raises(ConfigError) as info:
        open_backend("tensorflow", artifacts)
    for name in RUNTIME_BACKENDS:
        assert name in str(info.value)


def test_importing_registry_and_predictor_loads_no_heavy_library():
    code = (
        "import sys, vitdeploy.runtime.backends, vitdeploy.runtime.predictor, vitdeploy.runtime.batch_predict; "
        "print(sorted(m for m in ('torch', 'onnxruntime', 'tensorrt', 'onnx', 'openvino') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_unavailable_reasons(artifacts, tmp_path):
    assert backend_unavailable_reason("ort", artifacts) is None
    assert backend_unavailable_reason("torch", artifacts) is None
    # a manifest without the fp16 graph
    _any_onnx(tmp_path / "m.onnx")
    write_manifest(tmp_path, {"onnx": file_entry(tmp_path, "m.onnx")})
    only_onnx = Artifacts.open(tmp_path)
    assert backend_unavailable_reason("ort-fp16", only_onnx) == "manifest has no 'onnx-fp16' artifact"
    assert "weights" in backend_unavailable_reason("torch", only_onnx)
    with pytest.raises(ConfigError):
        backend_unavailable_reason("nope", only_onnx)


def test_trt_unavailable_without_an_engine_names_the_manifest(artifacts):
    assert backend_unavailable_reason("trt", artifacts) == "manifest has no 'engine' artifact"


def test_trt_unavailable_with_an_engine_names_the_missing_tensorrt(tmp_path):
    from vitdeploy.base._deps import available

    if available("tensorrt")[0]:
        pytest.skip("tensorrt is installed here: its absence cannot be reported")
    for name in ("model.engine", "model.engine.json"):
        (tmp_path / name).write_bytes(b"{}")
    write_manifest(
        tmp_path,
        {"engine": file_entry(tmp_path, "model.engine"), "engine-meta": file_entry(tmp_path, "model.engine.json")},
    )
    assert backend_unavailable_reason("trt", Artifacts.open(tmp_path, verify=False)) == "tensorrt not installed"


def test_open_backend_for_a_role_the_manifest_lacks_names_it(tmp_path):
    _any_onnx(tmp_path / "m.onnx")
    write_manifest(tmp_path, {"onnx": file_entry(tmp_path, "m.onnx")})
    with pytest.raises(ArtifactError, match="'engine'"):
        open_backend("trt", Artifacts.open(tmp_path))


def test_open_backend_refuses_a_tampered_onnx(tiny_dir, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(tiny_dir, copy)
    data = bytearray((copy / "model.onnx").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (copy / "model.onnx").write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=r"tampered or corrupt: .*model\.onnx sha256 expected"):
        open_backend("ort", Artifacts.open(copy))


# ----------------------------------------------------------------------------- input checks + splitting


def test_wrong_dtype_names_expected_and_actual(ort_backend, batch5):
    with pytest.raises(InputError) as info:
        ort_backend.run(batch5.astype(np.float64))
    assert "float32" in str(info.value) and "float64" in str(info.value)


def test_wrong_shape_names_expected_and_actual(ort_backend):
    with pytest.raises(InputError) as info:
        ort_backend.run(np.zeros((2, 3, 16, 16), np.float32))
    assert "(N, 3, 32, 32)" in str(info.value) and "(2, 3, 16, 16)" in str(info.value)
    with pytest.raises(InputError, match=r"got \(3, 32, 32\)"):
        ort_backend.run(np.zeros((3, 32, 32), np.float32))
    with pytest.raises(InputError, match="numpy"):
        ort_backend.run([[0.0]])


def test_batch_larger_than_max_batch_is_split_and_equals_single_runs(artifacts, batch5):
    from vitdeploy.runtime.backends.ort import OrtBackend

    backend = OrtBackend(artifacts.path("onnx"), artifacts.input_shape, max_batch=2)
    seen = []
    original = backend._run
    backend._run = lambda b: (seen.append(b.shape[0]), original(b))[1]
    out = backend.run(batch5)
    assert seen == [2, 2, 1]
    singles = np.concatenate([original(batch5[i : i + 1]) for i in range(5)])
    assert out.shape == (5, 5) and out.dtype == np.float32
    np.testing.assert_allclose(out, singles, rtol=0, atol=1e-5)


def test_ort_and_torch_logits_agree(artifacts, ort_backend, batch5):
    torch_backend = open_backend("torch", artifacts)
    try:
        ref = torch_backend.run(batch5)
        got = ort_backend.run(batch5)
    finally:
        torch_backend.close()
    assert ref.dtype == got.dtype == np.float32 and ref.shape == got.shape == (5, 5)
    assert np.abs(ref).max() > 0.1  # the comparison means something: logits are not all ~0
    assert np.abs(ref - got).max() <= 1e-4


# ----------------------------------------------------------------------------- ORT specifics


def test_ort_describe_and_names(ort_backend):
    assert ort_backend.name == "ort"
    assert ort_backend.describe().startswith("onnxruntime 1.")
    assert "CPUExecutionProvider" in ort_backend.describe()
    assert (ort_backend.input_name, ort_backend.output_name) == ("pixel_values", "logits")
    assert ort_backend.max_batch == 4  # the manifest's batch.max


def test_ort_fp16_uses_the_fp16_artifact(artifacts):
    backend = open_backend("ort-fp16", artifacts)
    assert backend.name == "ort-fp16"
    assert backend.onnx_path.name == "model.fp16.onnx"


def test_gpu_provider_that_falls_back_to_cpu_is_an_error_unless_allowed(artifacts):
    from vitdeploy.runtime.backends.ort import available_providers

    if "CUDAExecutionProvider" in available_providers():
        pytest.skip("this onnxruntime has CUDA: no CPU fallback to provoke")
    options = BackendOptions(providers=("CUDAExecutionProvider", "CPUExecutionProvider"))
    with pytest.raises(BackendError) as info:
        open_backend("ort", artifacts, options)
    assert "CUDAExecutionProvider" in str(info.value) and "allow_cpu_fallback" in str(info.value)
    relaxed = BackendOptions(providers=options.providers, allow_cpu_fallback=True, threads=1)
    backend = open_backend("ort", artifacts, relaxed)
    assert backend.providers == ["CPUExecutionProvider"]
    backend.close()


def test_ort_refuses_onnx_whose_external_data_escapes(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    from vitdeploy.runtime.backends.ort import OrtBackend

    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (tmp_path / "evil.bin").write_bytes(np.ones(3 * 32 * 32, np.float32).tobytes())
    weight = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[1, 3, 32, 32])
    weight.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "../evil.bin"), ("offset", "0"), ("length", str(3 * 32 * 32 * 4))):
        weight.external_data.add(key=key, value=value)
    graph = helper.make_graph(
        [helper.make_node("Add", ["pixel_values", "w"], ["logits"])],
        "g",
        [helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, ["batch", 3, 32, 32])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 3, 32, 32])],
        initializer=[weight],
    )
    path = model_dir / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    with pytest.raises(ArtifactError, match=r"\.\./evil\.bin.*outside"):
        OrtBackend(path, (3, 32, 32), 1)


# ----------------------------------------------------------------------------- torch specifics


def test_torch_backend_explicit_paths_and_fp16_on_cpu(tiny_dir, batch5):
    from vitdeploy.runtime.backends.torch_backend import TorchBackend

    backend = TorchBackend(tiny_dir, (3, 32, 32))  # a directory: model.safetensors + model.json inside
    assert backend.run(batch5).shape == (5, 5)
    assert backend.describe().startswith("torch ")
    with pytest.raises(BackendError, match="fp16 needs a CUDA device"):
        TorchBackend(tiny_dir, (3, 32, 32), options=BackendOptions(precision="fp16"))
    with pytest.raises(BackendError, match="disagree"):
        TorchBackend(tiny_dir, (3, 64, 64))


def _copy_with_manifest(tiny_dir: Path, dest: Path, change) -> Path:
    shutil.copytree(tiny_dir, dest)
    data = json.loads((dest / "manifest.json").read_text())
    change(data)
    (dest / "manifest.json").write_text(json.dumps(data))
    return dest


def test_torch_backend_needs_a_verified_weights_config(tiny_dir, tmp_path):
    """model.json decides the architecture the weights load into: it is never read unverified."""
    from vitdeploy.runtime.backends import artifact_roles

    assert artifact_roles("torch") == ("weights", "weights-config")
    no_config = Artifacts.open(
        _copy_with_manifest(tiny_dir, tmp_path / "a", lambda m: m["artifacts"].pop("weights-config"))
    )
    assert backend_unavailable_reason("torch", no_config) == "manifest has no 'weights-config' artifact"
    with pytest.raises(ArtifactError, match="'weights-config'"):
        open_backend("torch", no_config)


def test_tampered_weights_config_is_refused_by_every_verifier(tiny_dir, tmp_path):
    from vitdeploy.evaluate.specs import backend_specs, verify_spec_files
    from vitdeploy.runtime.backends import verify_backend_files
    from vitdeploy.runtime.predictor import Predictor

    copy = _copy_with_manifest(tiny_dir, tmp_path / "t", lambda m: None)
    config = json.loads((copy / "model.json").read_text())
    config["name"] = "edited"
    (copy / "model.json").write_text(json.dumps(config))
    with pytest.raises(ArtifactError, match=r"tampered or corrupt: .*model\.json"):
        Artifacts.open(copy)  # at open: the whole directory is refused
    for check in (
        lambda a: verify_backend_files("torch", a),
        lambda a: open_backend("torch", a),
        lambda a: verify_spec_files(backend_specs(["torch"])[0], a),
        lambda a: Predictor.from_artifacts(a, backend="torch"),
        lambda a: Predictor.from_artifacts(a, backend="ort"),
    ):
        with pytest.raises(ArtifactError, match=r"tampered or corrupt: .*model\.json"):
            check(Artifacts.open(copy, verify=False))
    assert set(verify_backend_files("ort", Artifacts.open(copy, verify=False))) == {"onnx"}


def test_torch_weights_that_do_not_fit_model_json_name_both_files(tiny_dir, tmp_path):
    from vitdeploy.runtime.backends.torch_backend import TorchBackend

    config = json.loads((tiny_dir / "model.json").read_text())
    config["vit"]["num_classes"] = 7  # the head in model.safetensors has 5 rows
    other = tmp_path / "other.json"
    other.write_text(json.dumps(config))
    with pytest.raises(BackendError) as info:
        TorchBackend((tiny_dir / "model.safetensors", other), (3, 32, 32))
    msg = str(info.value)
    assert str(tiny_dir / "model.safetensors") in msg and str(other) in msg
    assert "size mismatch for head" in msg and "re-export" in msg


def _onnx_with_external_weight(directory: Path, location: str = "weights.bin") -> Path:
    """A valid [batch, 3, 32, 32] -> [batch, 5] graph (flatten, matmul) whose weight is external."""
    import onnx
    from onnx import TensorProto, helper

    (directory / location).write_bytes(np.ones(3 * 32 * 32 * 5, np.float32).tobytes())
    weight = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[3 * 32 * 32, 5])
    weight.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", str(3 * 32 * 32 * 5 * 4))):
        weight.external_data.add(key=key, value=value)
    graph = helper.make_graph(
        [
            helper.make_node("Flatten", ["pixel_values"], ["flat"], axis=1),
            helper.make_node("MatMul", ["flat", "w"], ["logits"]),
        ],
        "g",
        [helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, ["batch", 3, 32, 32])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 5])],
        initializer=[weight],
    )
    path = directory / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), str(path))
    return path


#: (main role, name) of every backend of the vocabulary that runs an ONNX graph
ONNX_BACKENDS = [(kind.roles[0], kind.name) for kind in BACKENDS if kind.libraries == ("onnxruntime",)]


@pytest.mark.parametrize("role,backend", ONNX_BACKENDS)
def test_onnx_external_data_missing_from_the_manifest_is_refused(tmp_path, role, backend):
    """External data the manifest does not list has no sha256 to check: never loaded."""
    _onnx_with_external_weight(tmp_path)
    write_manifest(tmp_path, {role: file_entry(tmp_path, "model.onnx")})  # no "external_data"
    with pytest.raises(ArtifactError) as info:
        open_backend(backend, Artifacts.open(tmp_path))
    assert "weights.bin" in str(info.value) and f"artifacts.{role}.external_data" in str(info.value)


def test_onnx_external_data_listed_in_the_manifest_opens_and_runs(tmp_path):
    _onnx_with_external_weight(tmp_path)
    entry = {**file_entry(tmp_path, "model.onnx"), "external_data": [file_entry(tmp_path, "weights.bin")]}
    write_manifest(tmp_path, {"onnx": entry})
    backend = open_backend("ort", Artifacts.open(tmp_path))
    try:
        out = backend.run(np.ones((2, 3, 32, 32), np.float32))
    finally:
        backend.close()
    np.testing.assert_array_equal(out, np.full((2, 5), 3 * 32 * 32, np.float32))


def test_ort_run_outputs_checks_closed_and_wraps_errors(artifacts, batch5):
    backend = open_backend("ort", artifacts)
    assert backend.run_outputs(batch5[:2], ["logits"])[0].shape == (2, 5)
    with pytest.raises(BackendError, match=r"failed to compute outputs \['features'\]"):
        backend.run_outputs(batch5[:2], ["features"])
    backend.close()
    with pytest.raises(BackendError, match="backend is closed"):
        backend.run_outputs(batch5[:2], ["logits"])
    with pytest.raises(BackendError, match="backend is closed"):
        backend.run(batch5[:2])


def test_ort_reads_its_session_once_per_call(artifacts, batch5):
    """close() on another thread between a check and the use of the session must not crash a run:
    simulate it with a session attribute that reads as None after its first read."""
    from vitdeploy.runtime.backends.ort import OrtBackend

    class ClosesAfterOneRead(OrtBackend):
        @property
        def _session(self):
            session = self.__dict__["_session"]
            self.__dict__["_session"] = None  # close() "ran" right after this read
            return session

    for call in (lambda b: b._run(batch5[:2]), lambda b: b.run_outputs(batch5[:2], ["logits"])[0]):
        backend = open_backend("ort", artifacts)
        backend.__class__ = ClosesAfterOneRead
        assert call(backend).shape == (2, 5)
        with pytest.raises(BackendError, match="backend is closed"):
            call(backend)


def test_one_first_line_helper_for_every_report():
    from vitdeploy.evaluate import drift
    from vitdeploy.export import manifest
    from vitdeploy.runtime import backends, predictor

    assert drift.first_line is backends.first_line and predictor.first_line is backends.first_line
    assert drift.library_versions is manifest.library_versions
    assert backends.first_line(ValueError("a\nb")) == "a" and backends.first_line(KeyError()) == "KeyError"
    assert backends.first_line("  x\ny ") == "x" and backends.first_line("") == ""


# ----------------------------------------------------------------------------- options from pipeline.yaml


def test_backend_options_from_the_runtime_section_carry_every_key():
    from vitdeploy.base.config import parse_config

    runtime = parse_config(
        {
            "runtime": {
                "providers": ["CUDAExecutionProvider", "CPUExecutionProvider"],
                "threads": 3,
                "allow_cpu_fallback": True,
                "ort_allow_spinning": False,
            }
        },
        None,
    ).runtime
    assert BackendOptions.from_runtime(runtime) == BackendOptions(
        device="cpu",
        providers=("CUDAExecutionProvider", "CPUExecutionProvider"),
        allow_cpu_fallback=True,
        threads=3,
        ort_allow_spinning=False,
        trt_contexts=2,
    )
    assert BackendOptions.from_runtime(parse_config({}, None).runtime) == BackendOptions()


@pytest.mark.parametrize(
    "setting, threads, expected",
    [(True, None, True), (False, None, False), ("auto", 10_000, False), ("auto", 1, None)],
)
def test_ort_allow_spinning_decides_whether_idle_threads_spin(setting, threads, expected):
    from vitdeploy.runtime.backends.ort import _allow_spinning, _usable_cores

    options = BackendOptions(threads=threads, ort_allow_spinning=setting)
    assert _allow_spinning(options) is (expected if expected is not None else 1 < _usable_cores())


# ----------------------------------------------------------------------------- open, or say why not


def test_open_or_reason_opens_or_says_why_not_and_never_skips_a_tampered_file(tiny_dir, artifacts, tmp_path):
    """The one way auto-selection, validate and bench open a backend."""
    from vitdeploy.base.errors import ArtifactIntegrityError, MissingDependencyError
    from vitdeploy.runtime.backends import open_or_reason

    opened = open_or_reason("ort", artifacts)
    assert (opened.ok, opened.status, opened.reason, opened.error) == (True, "opened", "", None)
    assert opened.backend.run(np.zeros((1, 3, 32, 32), np.float32)).shape == (1, len(LABELS))
    opened.backend.close()

    missing = open_or_reason("trt", artifacts, BackendOptions(device="cuda"))
    assert (missing.ok, missing.status, missing.error) == (False, "unavailable", MissingDependencyError)
    assert missing.reason == backend_unavailable_reason("trt", artifacts, BackendOptions(device="cuda"))

    refused = open_or_reason("ort", artifacts, refuse=lambda: "needs CUDA")
    assert (refused.backend, refused.status, refused.reason) == (None, "refused", "needs CUDA")

    broken = tmp_path / "broken"  # a graph ONNX cannot read, listed with its true hash: verified, then fails
    shutil.copytree(tiny_dir, broken)
    (broken / "model.onnx").write_bytes(b"not an onnx graph")
    manifest = json.loads((broken / "manifest.json").read_text())
    manifest["artifacts"]["onnx"] = file_entry(broken, "model.onnx")
    (broken / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactIntegrityError, match="cannot read ONNX model"):  # refused, never skipped
        open_or_reason("ort", Artifacts.open(broken))

    tampered = _copy_with_manifest(tiny_dir, tmp_path / "tampered", lambda m: None)
    (tampered / "model.onnx").write_bytes(b"not an onnx graph")
    with pytest.raises(ArtifactError, match=r"tampered or corrupt: .*model\.onnx"):
        open_or_reason("ort", Artifacts.open(tampered))
