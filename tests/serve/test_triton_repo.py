"""`vitdeploy triton-repo`: every config.pbtxt parses into Triton's own ModelConfig (tritonclient's
model_config_pb2) with the values the manifest dictates; artifacts are verified and copied; the
repository appears atomically; the README names the matching Triton container."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from vitdeploy.cli import main
from vitdeploy.runtime.artifacts import sha256_file

pb = pytest.importorskip(
    "tritonclient.grpc.model_config_pb2", reason="tritonclient not installed (pip install 'tritonclient[grpc]')"
)
from google.protobuf import text_format  # noqa: E402  (protobuf comes with tritonclient[grpc])

pytestmark = pytest.mark.integration

NAME = "vit-demo-digits"
FAKE_TRT = "10.13.3.9"


def run(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def parse(path: Path) -> "pb.ModelConfig":
    return text_format.Parse(path.read_text(encoding="utf-8"), pb.ModelConfig())


def configs(repo: Path) -> dict[str, "pb.ModelConfig"]:
    return {p.parent.name: parse(p) for p in sorted(repo.glob("*/config.pbtxt"))}


def write_yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pipeline.yaml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def with_engine(demo_artifacts: Path, tmp_path_factory) -> Path:
    """The demo export plus an engine entry: a stand-in plan file (never deserialized here; no
    TensorRT on this machine) and a genuine model.engine.json, both listed with sha256 in the manifest."""
    out = tmp_path_factory.mktemp("with_engine") / "artifacts"
    shutil.copytree(demo_artifacts, out)
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "model.engine").write_bytes(b"stand-in plan bytes")
    meta = {
        "tensorrt_version": FAKE_TRT,
        "gpu_name": "NVIDIA H100 80GB HBM3",
        "compute_capability": "9.0",
        "profile": {"min": 1, "opt": 8, "max": 16},
        "input": "pixel_values",
        "chw": [3, 32, 32],
        "precision": "fp16",
        "onnx_sha256": "0" * 64,
        "workspace_mb": 4096,
        "optimization_level": 3,
        "built": "2026-01-01T00:00:00+00:00",
    }
    (out / "model.engine.json").write_text(json.dumps(meta))
    for role, name in (("engine", "model.engine"), ("engine-meta", "model.engine.json")):
        manifest["artifacts"][role] = {
            "path": name,
            "sha256": sha256_file(out / name),
            "bytes": (out / name).stat().st_size,
        }
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


def test_every_config_parses_into_tritons_model_config_with_the_manifests_values(demo_artifacts: Path, tmp_path: Path):
    manifest = json.loads((demo_artifacts / "manifest.json").read_text())
    batch = manifest["batch"]
    res = run(
        "triton-repo",
        "-a",
        str(demo_artifacts),
        "-o",
        str(tmp_path / "repo"),
        "-c",
        str(write_yaml(tmp_path, "triton: {instances: 2, kind: cpu, max_queue_size: 7}\n")),
    )
    assert res.exit_code == 0, res.output
    cfg = configs(tmp_path / "repo")
    assert set(cfg) == {NAME, f"{NAME}_preprocess", f"{NAME}_postprocess", f"{NAME}_onnx", f"{NAME}_ort_python"}
    assert not (tmp_path / "repo" / f"{NAME}_trt").exists()  # no engine, no _trt model
    for name, c in cfg.items():
        assert c.name == name
        assert c.max_batch_size == batch["max"]
    chw = list(manifest["io"]["input"]["shape"][1:])
    classes = len(manifest["labels"])

    onnx = cfg[f"{NAME}_onnx"]
    assert onnx.platform == "onnxruntime_onnx"
    assert [(i.name, i.data_type, list(i.dims)) for i in onnx.input] == [("pixel_values", pb.TYPE_FP32, chw)]
    assert [(o.name, o.data_type, list(o.dims), o.label_filename) for o in onnx.output] == [
        ("logits", pb.TYPE_FP32, [classes], "labels.txt")
    ]
    assert list(onnx.dynamic_batching.preferred_batch_size) == sorted({batch["opt"], batch["max"]})
    assert onnx.dynamic_batching.max_queue_delay_microseconds == 2000
    assert onnx.dynamic_batching.default_queue_policy.max_queue_size == 7
    assert [(g.count, g.kind) for g in onnx.instance_group] == [(2, pb.ModelInstanceGroup.KIND_CPU)]
    # The export validated model.fp16.onnx, so "auto" serves that graph as it is: the TensorRT EP without
    # its FP16 flag (no re-cast of the keep-float nodes), its engine cache in the model's own folder.
    assert onnx.default_model_filename == "model.fp16.onnx"
    (trt_ep,) = onnx.optimization.execution_accelerators.gpu_execution_accelerator
    assert trt_ep.name == "tensorrt"
    assert trt_ep.parameters["precision_mode"] == "FP32"
    assert trt_ep.parameters["trt_engine_cache_enable"] == "1"
    assert trt_ep.parameters["trt_engine_cache_path"] == f"/models/{NAME}_onnx/trt_cache"
    assert (tmp_path / "repo" / f"{NAME}_onnx" / "trt_cache").is_dir()
    assert trt_ep.parameters["trt_profile_max_shapes"] == f"pixel_values:{batch['max']}x" + "x".join(map(str, chw))
    # Ready means warm: zero batches at 1, opt and max run before the model is READY.
    for model in (f"{NAME}_onnx", f"{NAME}_ort_python"):
        warm = cfg[model].model_warmup
        assert [w.batch_size for w in warm] == sorted({1, batch["opt"], batch["max"]}), model
        assert all(list(w.inputs["pixel_values"].dims) == chw and w.inputs["pixel_values"].zero_data for w in warm)
    labels = (tmp_path / "repo" / f"{NAME}_onnx" / "labels.txt").read_text().splitlines()
    assert labels == manifest["labels"]

    pre = cfg[f"{NAME}_preprocess"]
    assert pre.backend == "python"
    assert [(i.name, i.data_type, list(i.dims)) for i in pre.input] == [("IMAGES", pb.TYPE_STRING, [1])]
    assert [(o.name, o.data_type, list(o.dims)) for o in pre.output] == [("PIXEL_VALUES", pb.TYPE_FP32, chw)]
    assert json.loads(pre.parameters["preprocess"].string_value) == manifest["preprocess"]
    assert pre.parameters["max_image_pixels"].string_value == "89478485"
    assert pre.dynamic_batching.default_queue_policy.max_queue_size == 7

    post = cfg[f"{NAME}_postprocess"]
    assert [(o.name, o.data_type, list(o.dims)) for o in post.output] == [
        ("LOGITS", pb.TYPE_FP32, [classes]),
        ("TOPK_LABELS", pb.TYPE_STRING, [5]),
        ("TOPK_SCORES", pb.TYPE_FP32, [5]),
    ]

    ens = cfg[NAME]
    assert ens.platform == "ensemble"
    assert [(i.name, i.data_type, list(i.dims)) for i in ens.input] == [("IMAGES", pb.TYPE_STRING, [1])]
    assert [(o.name, list(o.dims)) for o in ens.output] == [
        ("LOGITS", [classes]),
        ("TOPK_LABELS", [5]),
        ("TOPK_SCORES", [5]),
    ]
    steps = [(s.model_name, dict(s.input_map), dict(s.output_map)) for s in ens.ensemble_scheduling.step]
    assert steps == [
        (f"{NAME}_preprocess", {"IMAGES": "IMAGES"}, {"PIXEL_VALUES": "pixel_values"}),
        (f"{NAME}_onnx", {"pixel_values": "pixel_values"}, {"logits": "logits"}),
        (
            f"{NAME}_postprocess",
            {"LOGITS": "logits"},
            {"LOGITS": "LOGITS", "TOPK_LABELS": "TOPK_LABELS", "TOPK_SCORES": "TOPK_SCORES"},
        ),
    ]
    # Every ensemble output comes from the last step: none is also another step's input (Triton answers
    # requests naming a subset of such outputs with 400 "unexpected deadlock").
    assert {o.name for o in ens.output} <= set(steps[-1][2].values())
    assert not {o.name for o in ens.output} & {v for _, inputs, _ in steps for v in inputs.values()}
    # Each step's inputs are produced by an earlier step or are ensemble inputs; every output is produced.
    available = {i.name for i in ens.input}
    for model, inputs, outputs in steps:
        step_cfg = cfg[model]
        assert set(inputs) == {i.name for i in step_cfg.input}
        assert set(outputs) <= {o.name for o in step_cfg.output}
        assert set(inputs.values()) <= available
        available |= set(outputs.values())
    assert {o.name for o in ens.output} <= available
    # The ensemble says which export it answers with (the manifest's sha256) and on which backend: validate --url
    # reads them from the running server's /config.
    assert {k: v.string_value for k, v in ens.parameters.items()} == {
        "vitdeploy_export_sha256": sha256_file(demo_artifacts / "manifest.json"),
        "vitdeploy_backend": "ort-fp16",  # "auto" serves the validated model.fp16.onnx
    }

    # The copied ONNX is the verified artifact, byte for byte.
    copied = tmp_path / "repo" / f"{NAME}_onnx" / "1" / "model.fp16.onnx"
    assert sha256_file(copied) == manifest["artifacts"]["onnx-fp16"]["sha256"]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_the_onnx_model_serves_the_graph_the_export_validated_as_chosen(
    demo_artifacts: Path, tmp_path: Path, precision: str
):
    manifest = json.loads((demo_artifacts / "manifest.json").read_text())
    res = run(
        "triton-repo",
        "-a",
        str(demo_artifacts),
        "-o",
        str(tmp_path / "repo"),
        "-c",
        str(write_yaml(tmp_path, f"triton: {{onnx_precision: {precision}, repository_mount: /srv/m}}\n")),
    )
    assert res.exit_code == 0, res.output
    onnx = configs(tmp_path / "repo")[f"{NAME}_onnx"]
    files = sorted(p.name for p in (tmp_path / "repo" / f"{NAME}_onnx" / "1").iterdir())
    ensemble = configs(tmp_path / "repo")[NAME]
    assert ensemble.parameters["vitdeploy_backend"].string_value == {"fp32": "ort", "fp16": "ort-fp16"}[precision]
    if precision == "fp32":  # model.onnx on the CUDA EP (Triton's onnxruntime default on a GPU): no accelerator
        assert files == ["model.onnx"] and onnx.default_model_filename == "model.onnx"
        assert not onnx.optimization.execution_accelerators.gpu_execution_accelerator
        assert (
            sha256_file(tmp_path / "repo" / f"{NAME}_onnx" / "1" / "model.onnx")
            == manifest["artifacts"]["onnx"]["sha256"]
        )
    else:
        assert files == ["model.fp16.onnx"]
        (ep,) = onnx.optimization.execution_accelerators.gpu_execution_accelerator
        assert ep.parameters["trt_engine_cache_path"] == f"/srv/m/{NAME}_onnx/trt_cache"
        assert ep.parameters["precision_mode"] == "FP32" and "trt_fp16_enable" not in ep.parameters


def test_fp16_is_refused_when_the_export_did_not_validate_it(demo_artifacts: Path, tmp_path: Path):
    bad = tmp_path / "art"
    shutil.copytree(demo_artifacts, bad)
    manifest = json.loads((bad / "manifest.json").read_text())
    manifest["validation"]["validate-fp16"]["passed"] = False
    (bad / "manifest.json").write_text(json.dumps(manifest))
    res = run(
        "triton-repo",
        "-a",
        str(bad),
        "-o",
        str(tmp_path / "repo"),
        "-c",
        str(write_yaml(tmp_path, "triton: {onnx_precision: fp16}\n")),
    )
    assert res.exit_code == 2 and "validate-fp16" in res.output and not (tmp_path / "repo").exists()
    res = run("triton-repo", "-a", str(bad), "-o", str(tmp_path / "repo"))  # auto falls back to the FP32 graph
    assert res.exit_code == 0, res.output
    assert parse(tmp_path / "repo" / f"{NAME}_onnx" / "config.pbtxt").default_model_filename == "model.onnx"


def test_the_repository_ships_a_dockerfile_its_wheel_and_pinned_requirements(demo_artifacts: Path, tmp_path: Path):
    import zipfile

    from vitdeploy import __version__
    from vitdeploy.serve.triton.package import copy_sources
    from vitdeploy.serve.triton.versions import IMAGE, TRITON_RELEASES, latest_release

    repo = tmp_path / "repo"
    assert run("triton-repo", "-a", str(demo_artifacts), "-o", str(repo)).exit_code == 0
    lines = (repo / "Dockerfile").read_text().splitlines()
    (base,) = [line.split()[1] for line in lines if line.startswith("FROM ")]
    assert base == f"{IMAGE}:{latest_release()}-py3" and base.split(":")[1][:-4] in TRITON_RELEASES
    sources = copy_sources(lines)
    assert sources and all((repo / src).exists() for src in sources), sources
    wheel = repo / "wheels" / f"vitdeploy-{__version__}-py3-none-any.whl"
    assert f"--no-deps /opt/vitdeploy/wheels/{wheel.name}" in "\n".join(lines)
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        assert zf.testzip() is None
        assert {
            "vitdeploy/serve/triton/models.py",
            "vitdeploy/runtime/preprocess.py",
            f"vitdeploy-{__version__}.dist-info/RECORD",
        } <= names
        assert not any("__pycache__" in n for n in names)
        assert f"Version: {__version__}" in zf.read(f"vitdeploy-{__version__}.dist-info/METADATA").decode()
    reqs = [r for r in (repo / "requirements.txt").read_text().splitlines() if r and not r.startswith("#")]
    assert all("==" in r for r in reqs) and "numpy==1.26.4" in reqs  # numpy < 2 for the python stub
    assert {r.split("==")[0] for r in reqs} >= {"numpy", "pillow", "onnxruntime"}
    # The Docker build context is the wheel and the pins, never the models.
    assert (repo / ".dockerignore").read_text().splitlines()[0] == "*"
    readme = (repo / "README.md").read_text()
    assert "docker build -t" in readme and '-v "$PWD":/models' in readme and "pip install 'vitdeploy" not in readme
    # The same vitdeploy gives the same wheel, byte for byte.
    assert run("triton-repo", "-a", str(demo_artifacts), "-o", str(tmp_path / "again")).exit_code == 0
    assert (tmp_path / "again" / "wheels" / wheel.name).read_bytes() == wheel.read_bytes()


def test_with_an_engine_the_trt_model_is_the_ensembles_and_the_readme_names_the_matching_triton(
    with_engine: Path, tmp_path: Path
):
    res = run(
        "triton-repo",
        "-a",
        str(with_engine),
        "-o",
        str(tmp_path / "repo"),
        "--gpus",
        "0,1",
        "--kind",
        "gpu",
        "-k",
        "3",
    )
    assert res.exit_code == 0, res.output
    cfg = configs(tmp_path / "repo")
    trt = cfg[f"{NAME}_trt"]
    assert trt.platform == "tensorrt_plan"
    assert trt.default_model_filename == "model.engine"
    assert trt.max_batch_size == 16  # the engine's profile max, below the export's 32
    assert [(g.kind, list(g.gpus)) for g in trt.instance_group] == [(pb.ModelInstanceGroup.KIND_GPU, [0, 1])]
    assert (tmp_path / "repo" / f"{NAME}_trt" / "1" / "model.engine").read_bytes() == b"stand-in plan bytes"
    ens = cfg[NAME]
    assert ens.max_batch_size == 16
    assert [s.model_name for s in ens.ensemble_scheduling.step][1] == f"{NAME}_trt"
    assert ens.parameters["vitdeploy_backend"].string_value == "trt"
    assert ens.parameters["vitdeploy_export_sha256"].string_value == sha256_file(with_engine / "manifest.json")
    assert [list(o.dims) for o in ens.output][1:] == [[3], [3]]
    readme = (tmp_path / "repo" / "README.md").read_text()
    assert "nvcr.io/nvidia/tritonserver:25.10-py3" in readme
    assert f"TensorRT {FAKE_TRT}" in readme and "25.09 or 25.10" in readme
    assert "FROM nvcr.io/nvidia/tritonserver:25.10-py3" in (tmp_path / "repo" / "Dockerfile").read_text()
    assert "docker build" in readme and "tritonclient" in readme


def test_a_tampered_artifact_is_refused_and_no_repository_is_left(with_engine: Path, tmp_path: Path):
    bad = tmp_path / "bad"
    shutil.copytree(with_engine, bad)
    (bad / "model.onnx").write_bytes((bad / "model.onnx").read_bytes()[:-1] + b"\0")
    res = run("triton-repo", "-a", str(bad), "-o", str(tmp_path / "repo"))
    assert res.exit_code == 2
    assert "tampered or corrupt" in res.output and "sha256" in res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad"]  # no repo, no temp folder


def test_an_existing_repository_is_replaced_only_with_force(demo_artifacts: Path, tmp_path: Path):
    repo = tmp_path / "repo"
    assert run("triton-repo", "-a", str(demo_artifacts), "-o", str(repo)).exit_code == 0
    (repo / "stale.txt").write_text("old")
    res = run("triton-repo", "-a", str(demo_artifacts), "-o", str(repo))
    assert res.exit_code == 2 and "--force" in res.output
    assert (repo / "stale.txt").exists()
    res = run("triton-repo", "-a", str(demo_artifacts), "-o", str(repo), "--force", "--inference", "ort_python")
    assert res.exit_code == 0, res.output
    assert not (repo / "stale.txt").exists()
    assert [s.model_name for s in parse(repo / NAME / "config.pbtxt").ensemble_scheduling.step][
        1
    ] == f"{NAME}_ort_python"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["repo"]


def test_trt_inference_without_an_engine_is_a_config_error(demo_artifacts: Path, tmp_path: Path):
    res = run("triton-repo", "-a", str(demo_artifacts), "-o", str(tmp_path / "repo"), "--inference", "trt")
    assert res.exit_code == 2
    assert "no TensorRT engine" in res.output
    assert not (tmp_path / "repo").exists()


def test_the_triton_release_is_matched_on_the_tensorrt_version_and_never_guessed():
    from vitdeploy.serve.triton.versions import container_release as _container
    from vitdeploy.serve.triton.versions import latest_release, triton_releases_for

    assert triton_releases_for("10.13.3.9") == ["25.09", "25.10"]
    assert triton_releases_for("10.14.1.48") == ["25.11", "25.12", "26.01"]
    assert triton_releases_for("10.8.0") == ["25.01", "25.02"]  # the build number does not matter
    assert triton_releases_for("10.13.4.1") == [] and triton_releases_for("8.6.1.6") == []
    # 24.12's TensorRT could not be confirmed (sources disagree) and no Triton release with TensorRT 11
    # was found: both are left to NVIDIA's support matrix rather than guessed.
    assert triton_releases_for("10.7.0.23") == [] and triton_releases_for("11.4.0.106") == []
    assert latest_release() == "26.05"
    tag, why = _container({"tensorrt_version": "10.99.0.1", "gpu_name": "g", "compute_capability": "9.0"})
    text = " ".join(why)
    assert "does not know which Triton" in text and "support-matrix" in text and "10.99.0.1" in text
    tag, why = _container(None)
    assert "No TensorRT engine" in " ".join(why)


def test_an_embedding_export_has_an_embeddings_ensemble_and_no_labels_or_postprocess(
    embedding_artifacts: Path, tmp_path: Path
):
    """A headless checkpoint's export (with its patch tokens): the ensemble is preprocess -> inference and its
    outputs are the graph's EMBEDDINGS, FP32 [-1, D], and PATCH_TOKENS, FP32 [-1, P, D]; no postprocess model, no
    labels.txt, no label_filename; the README says to name the outputs wanted."""
    manifest = json.loads((embedding_artifacts / "manifest.json").read_text())
    name, dim = manifest["name"], manifest["io"]["output"]["shape"][1]
    res = run("triton-repo", "-a", str(embedding_artifacts), "-o", str(tmp_path / "repo"), "--inference", "ort_python")
    assert res.exit_code == 0, res.output
    cfg = configs(tmp_path / "repo")
    assert set(cfg) == {name, f"{name}_preprocess", f"{name}_onnx", f"{name}_ort_python"}
    assert not list((tmp_path / "repo").glob("*/labels.txt"))
    ensemble = cfg[name]
    patches = manifest["io"]["patch_tokens"]["shape"][1:]
    outputs = [("EMBEDDINGS", pb.TYPE_FP32, [dim], ""), ("PATCH_TOKENS", pb.TYPE_FP32, patches, "")]
    assert [(o.name, o.data_type, list(o.dims), o.label_filename) for o in ensemble.output] == outputs
    steps = ensemble.ensemble_scheduling.step
    assert [s.model_name for s in steps] == [f"{name}_preprocess", f"{name}_ort_python"]
    assert dict(steps[1].output_map) == {"EMBEDDINGS": "EMBEDDINGS", "PATCH_TOKENS": "PATCH_TOKENS"}
    for model in (f"{name}_onnx", f"{name}_ort_python"):
        assert [(o.name, o.data_type, list(o.dims), o.label_filename) for o in cfg[model].output] == outputs
    readme = (tmp_path / "repo" / "README.md").read_text()
    assert f"`EMBEDDINGS` [N, {dim}]" in readme and 'result.as_numpy("EMBEDDINGS")' in readme
    assert f"`PATCH_TOKENS` [N, {patches[0]}, {patches[1]}]" in readme and "Triton answers every output" in readme
    assert "TOPK_LABELS" not in readme


def test_an_export_for_several_sizes_has_dynamic_height_and_width_and_each_sizes_recipe(
    sized_artifacts: Path, tmp_path: Path
):
    """export.image_sizes: the preprocessing and inference models' image dims are [3, -1, -1], PATCH_TOKENS [-1, D];
    the preprocessing model holds each listed size's recipe; the ensemble and README name the sizes and the
    request parameter that asks for one."""
    manifest = json.loads((sized_artifacts / "manifest.json").read_text())
    name = manifest["name"]
    res = run("triton-repo", "-a", str(sized_artifacts), "-o", str(tmp_path / "repo"), "--inference", "ort_python")
    assert res.exit_code == 0, res.output
    cfg = configs(tmp_path / "repo")
    assert list(cfg[f"{name}_preprocess"].output[0].dims) == [3, -1, -1]
    for model in (f"{name}_onnx", f"{name}_ort_python"):
        assert list(cfg[model].input[0].dims) == [3, -1, -1]
        assert [list(o.dims) for o in cfg[model].output] == [[64], [-1, 64]]
    recipes = json.loads(cfg[f"{name}_preprocess"].parameters["preprocess_at_size"].string_value)
    assert recipes == manifest["image_sizes"]["preprocess"]
    assert cfg[name].parameters["vitdeploy_image_sizes"].string_value == "28,42,56"
    readme = (tmp_path / "repo" / "README.md").read_text()
    assert "answers at 28, 42, 56 px" in readme and 'parameters={"image_size": 56}' in readme


def test_a_sigmoid_classifiers_postprocess_model_is_told_its_score_function():
    """A SigLIP zero-shot export (output.scores sigmoid): the postprocess model's parameters name it, so its
    TOPK_SCORES are sigmoids as predict's (softmax where the manifest says nothing)."""
    from vitdeploy.serve.triton import config as tc

    facts = dict(name="zs", input_name="pixel_values", output_name="logits", chw=(3, 32, 32), num_classes=5)
    batch = {"min": 1, "opt": 2, "max": 8}
    for scores in ("sigmoid", "softmax"):
        text = tc.postprocess_config(tc.ModelFacts(**facts, batch=batch, scores=scores), tc.Settings(), "0.1.0")
        parsed = text_format.Parse(text, pb.ModelConfig())
        assert parsed.parameters["scores"].string_value == scores
        assert f"the {scores} top-k labels and scores" in text
