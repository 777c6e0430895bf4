"""`vitdeploy triton-repo`: a Triton model repository generated from an export's manifest.

    REPO/
      README.md                        how to run it (container, scaling, a tritonclient example)
      Dockerfile, .dockerignore        FROM the matching tritonserver image + the pins + the wheel
      requirements.txt, wheels/        the python models' pinned dependencies; this vitdeploy as a wheel
      <name>/config.pbtxt, 1/          ensemble: IMAGES -> LOGITS, TOPK_LABELS, TOPK_SCORES (an embedding: EMBEDDINGS)
      <name>_preprocess/               python backend: the runtime's preprocessing
      <name>_onnx/1/model[.fp16].onnx  onnxruntime_onnx over a graph the export validated (trt_cache/ beside)
      <name>_trt/1/model.engine        tensorrt_plan, only when the export built an engine
      <name>_ort_python/1/artifacts/   python backend + ONNX Runtime (Triton builds without onnxruntime)
      <name>_openvino/1/model.onnx     openvino backend (CPU), only with --inference openvino
      <name>_postprocess/              python backend: softmax top-k (none for an embedding export)

Every artifact is verified (size, sha256) before it is copied. The repository is built in a
temporary folder beside REPO and renamed into place when complete, so a failure never leaves a
half-written repository under REPO.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from ...base.errors import ArtifactError, ConfigError
from ...base.version import __version__
from ...base.vocab import VALIDATE_BF16
from ...runtime.artifacts import MANIFEST_NAME, Artifacts
from ..protocol import model_name
from . import config as tc
from .models import ARTIFACTS_DIR, model_py
from .package import write_package
from .readme import render_readme
from .versions import container_release

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RepoResult:
    path: Path
    name: str
    models: list[str]
    inference: str  # the model the ensemble calls
    onnx_precision: str  # the graph of the _onnx model: "fp32" (model.onnx) or "fp16" (model.fp16.onnx)
    engine: dict[str, Any] | None  # model.engine.json when an engine was packaged
    version: int = 1  # the version folder the export was written to (the one the ensemble calls)
    previous: int | None = None  # --new-version: the version the ensemble called before


def settings_from_config(cfg: Any, overrides: dict[str, Any] | None = None, top_k: int | None = None) -> tc.Settings:
    """The repository settings from a PipelineConfig: its ``triton`` section with ``overrides`` (CLI
    flags, validated like the YAML), K from ``serve.top_k`` (5 where the config has no serve section),
    the image limit from ``runtime.max_image_pixels`` and the TensorRT EP workspace from ``tensorrt``."""
    from pydantic import ValidationError

    from ...base.serving_sections import TritonSection

    try:
        triton = TritonSection.model_validate({**cfg.triton.model_dump(), **(overrides or {})})
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"triton.{key} = {first.get('input')!r}: {first['msg']}") from None
    serve = getattr(cfg, "serve", None)
    k = top_k if top_k is not None else int(getattr(serve, "top_k", 5))
    return tc.Settings(
        triton=triton,
        top_k=k,
        max_image_pixels=int(cfg.runtime.max_image_pixels),
        workspace_mb=int(cfg.tensorrt.workspace_mb),
        verify_key=getattr(cfg, "verify_key", None),
    )


def resolve_inference(requested: str, has_engine: bool, bf16_verdict: bool | None = None) -> str:
    """ "auto" -> "trt" with an engine, else "onnx"; ConfigError for "trt" without one, and for "openvino" when
    the export's ``validate-bf16`` failed (``bf16_verdict`` False): Triton's OpenVINO backend runs model.onnx
    at BF16 on a CPU with BF16 math, and cannot be asked for f32."""
    if requested == "auto":
        return "trt" if has_engine else "onnx"
    if requested not in tc.INFERENCE_KINDS:
        raise ConfigError(f"triton.inference = {requested!r}: expected auto, {', '.join(tc.INFERENCE_KINDS)}")
    if requested == "openvino" and bf16_verdict is False:
        raise ConfigError(
            "triton.inference = 'openvino' but model.onnx missed validation.bf16 (the export's validate-bf16): "
            "Triton's OpenVINO backend runs it at BF16 on a CPU with BF16 math and cannot be asked for f32; "
            "choose onnx or ort_python"
        )
    if requested == "trt" and not has_engine:
        raise ConfigError(
            "triton.inference = 'trt' but the export has no TensorRT engine (model.engine); build one "
            "with `vitdeploy export --engine require` on a GPU machine, or choose onnx / ort_python"
        )
    return requested


def fp16_validated(artifacts: Artifacts) -> bool:
    """Whether the export wrote model.fp16.onnx and its validation (``validate-fp16``) passed."""
    check = (artifacts.manifest.get("validation") or {}).get("validate-fp16") or {}
    return artifacts.has("onnx-fp16") and check.get("passed") is True


def resolve_onnx_precision(requested: str, artifacts: Artifacts) -> str:
    """ "auto" -> "fp16" when the export validated model.fp16.onnx, else "fp32"; ConfigError for an
    unvalidated "fp16"."""
    ok = fp16_validated(artifacts)
    if requested == "auto":
        return "fp16" if ok else "fp32"
    if requested == "fp16" and not ok:
        raise ConfigError(
            f"triton.onnx_precision = 'fp16' but {artifacts.directory / MANIFEST_NAME} has no "
            f"model.fp16.onnx that passed validation (validate-fp16); re-export with export.fp16.enabled: "
            f"true, or choose fp32"
        )
    if requested not in tc.ONNX_FILES:
        raise ConfigError(f"triton.onnx_precision = {requested!r}: expected auto, {', '.join(tc.ONNX_FILES)}")
    return requested


def _place(src: Path, dst: Path) -> None:
    """Hard-link ``src`` to ``dst`` (instant for multi-GB files; export replaces files by rename, so
    the link keeps the verified content), or copy it where links are impossible."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def _copy_role(artifacts: Artifacts, role: str, dest_dir: Path, name: str | None = None) -> dict[str, Any]:
    """Verify artifact ``role`` (and its external data), place it in ``dest_dir``; its manifest entry."""
    src = artifacts.path(role)  # size + sha256 checked here
    entry = dict(artifacts.entry(role))
    _place(src, dest_dir / (name or src.name))
    for sub in entry.get("external_data") or []:
        rel = Path(sub["path"])
        _place(artifacts.directory / rel, dest_dir / rel.name)
    return entry


def _facts(artifacts: Artifacts, engine_meta: dict[str, Any] | None) -> tc.ModelFacts:
    labels = artifacts.labels
    out_shape = artifacts.io.get("output", {}).get("shape") or []
    num_classes = len(labels) or (int(out_shape[-1]) if out_shape and isinstance(out_shape[-1], int) else 0)
    if num_classes < 1:
        raise ArtifactError(
            f"{artifacts.directory / MANIFEST_NAME}: neither labels nor io.output.shape give the number "
            f"of classes; re-run `vitdeploy export`"
        )
    engine_max = int(engine_meta["profile"]["max"]) if engine_meta else None
    return tc.ModelFacts(
        name=model_name(artifacts.name),
        input_name=artifacts.input_name,
        output_name=artifacts.output_name,
        chw=tuple(artifacts.input_shape),
        num_classes=num_classes,
        batch=artifacts.batch,
        engine_max_batch=engine_max,
        embedding=artifacts.schema.is_embedding,
        patch_shape=artifacts.schema.patch_shape,
        export_sha256=artifacts.manifest_sha256,
        image_sizes=artifacts.image_sizes,
        scores=artifacts.schema.output.scores,
    )


def _at_size(artifacts: Artifacts) -> dict[str, Any]:
    """Each listed size's preprocessing of an export for several sizes ({} for a fixed-size one)."""
    return {str(size): artifacts.preprocess_at(size).to_dict() for size in artifacts.image_sizes}


def _engine_meta(artifacts: Artifacts) -> dict[str, Any] | None:
    if not (artifacts.has("engine") and artifacts.has("engine-meta")):
        return None
    from ...runtime.backends.trt import EngineMetadata  # no tensorrt import: metadata only

    return EngineMetadata.load(artifacts.path("engine-meta")).to_dict()


def _labels_text(labels: list[str], num_classes: int) -> str:
    rows = [labels[i] if i < len(labels) else str(i) for i in range(num_classes)]
    return "".join(r.replace("\r", " ").replace("\n", " ") + "\n" for r in rows)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _pruned_manifest(artifacts: Artifacts, entries: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The manifest with only the artifacts copied beside it (paths are file names in that folder)."""
    manifest = json.loads(json.dumps(artifacts.manifest))
    pruned = {}
    for role, entry in entries.items():
        e = dict(entry, path=Path(entry["path"]).name)
        if e.get("external_data"):
            e["external_data"] = [dict(s, path=Path(s["path"]).name) for s in e["external_data"]]
        pruned[role] = e
    manifest["artifacts"] = pruned
    return manifest


def build_models(
    tmp: Path,
    artifacts: Artifacts,
    facts: tc.ModelFacts,
    settings: tc.Settings,
    engine_meta: dict[str, Any] | None,
    version: int = 1,
) -> list[str]:
    """Every model's folder under ``tmp``: config.pbtxt (and labels.txt) beside the ``version`` folder
    holding the export's files; the model names."""
    names = tc.model_names(facts.name)
    labels = _labels_text(artifacts.labels, facts.num_classes)
    models: list[str] = []

    def model(role: str, config: str, with_labels: bool = False) -> Path:
        root = tmp / names[role]
        _write(root / "config.pbtxt", config)
        (root / str(version)).mkdir(parents=True, exist_ok=True)
        if with_labels and not facts.embedding:  # an embedding has no labels (and no postprocess model)
            _write(root / tc.LABELS_FILE, labels)
        models.append(names[role])
        return root / str(version)

    pre = model(
        "preprocess",
        tc.preprocess_config(facts, settings, artifacts.preprocess.to_dict(), __version__, _at_size(artifacts)),
    )
    _write(pre / "model.py", model_py("PreprocessModel", f"{names['preprocess']}: encoded images -> float32 NCHW"))
    if not facts.embedding:
        post = model("postprocess", tc.postprocess_config(facts, settings, __version__), with_labels=True)
        _write(post / "model.py", model_py("PostprocessModel", f"{names['postprocess']}: logits -> top-k"))

    onnx_dir = model("onnx", tc.onnx_config(facts, settings), with_labels=True)
    onnx_role = "onnx-fp16" if settings.onnx_precision == "fp16" else "onnx"
    _copy_role(artifacts, onnx_role, onnx_dir, tc.ONNX_FILES[settings.onnx_precision])
    if settings.onnx_precision == "fp16":
        _write(
            onnx_dir.parent / tc.TRT_CACHE_DIR / "README.txt",
            "ONNX Runtime's TensorRT EP caches its engine here (keep this folder on a volume).\n",
        )

    if settings.inference == "openvino":  # only when asked: a Triton without that backend would fail to load it
        ov_dir = model("openvino", tc.openvino_config(facts, settings), with_labels=True)
        _copy_role(artifacts, "onnx", ov_dir, tc.ONNX_FILES["fp32"])

    ort_dir = model("ort_python", tc.ort_python_config(facts, settings, __version__), with_labels=True)
    _write(
        ort_dir / "model.py", model_py("OrtPythonModel", f"{names['ort_python']}: ONNX Runtime in the python backend")
    )
    roles = ["onnx"] + (["onnx-ort"] if artifacts.has("onnx-ort") else [])
    entries = {role: _copy_role(artifacts, role, ort_dir / ARTIFACTS_DIR) for role in roles}
    _write(ort_dir / ARTIFACTS_DIR / MANIFEST_NAME, json.dumps(_pruned_manifest(artifacts, entries), indent=2) + "\n")

    if engine_meta is not None:
        trt_dir = model("trt", tc.trt_config(facts, settings), with_labels=True)
        _copy_role(artifacts, "engine", trt_dir, tc.ENGINE_FILE)
        _write(trt_dir.parent / "model.engine.json", json.dumps(engine_meta, indent=2) + "\n")

    model("ensemble", tc.ensemble_config(facts, settings, version))
    return sorted(models)


def resolved(artifacts: Artifacts, settings: tc.Settings) -> tuple[tc.Settings, tc.ModelFacts, dict[str, Any] | None]:
    engine_meta = _engine_meta(artifacts)
    verdict = (artifacts.manifest.get("validation") or {}).get(VALIDATE_BF16)
    settings = replace(
        settings,
        inference=resolve_inference(
            settings.triton.inference, engine_meta is not None, None if verdict is None else verdict.get("passed")
        ),
        onnx_precision=resolve_onnx_precision(settings.triton.onnx_precision, artifacts),
    )
    return settings, _facts(artifacts, engine_meta), engine_meta


def model_configs(artifacts_dir: str | os.PathLike[str], settings: tc.Settings) -> dict[str, str]:
    """Model name -> the config.pbtxt ``build_triton_repo`` writes for it, without writing anything: what a
    running server reloads when only the settings change (`vitdeploy tune --target triton`)."""
    artifacts = Artifacts.open(artifacts_dir, public_key=settings.verify_key)
    settings, facts, engine_meta = resolved(artifacts, settings)
    names = tc.model_names(facts.name)
    configs = {
        names["preprocess"]: tc.preprocess_config(
            facts, settings, artifacts.preprocess.to_dict(), __version__, _at_size(artifacts)
        ),
        names["onnx"]: tc.onnx_config(facts, settings),
        names["ort_python"]: tc.ort_python_config(facts, settings, __version__),
        names["ensemble"]: tc.ensemble_config(facts, settings),
    }
    if not facts.embedding:
        configs[names["postprocess"]] = tc.postprocess_config(facts, settings, __version__)
    if engine_meta is not None:
        configs[names["trt"]] = tc.trt_config(facts, settings)
    if settings.inference == "openvino":
        configs[names["openvino"]] = tc.openvino_config(facts, settings)
    return configs


def build_triton_repo(
    artifacts_dir: str | os.PathLike[str],
    out: str | os.PathLike[str],
    settings: tc.Settings,
    force: bool = False,
    on_step: Callable[[str], None] | None = None,
) -> RepoResult:
    """Write the Triton repository for the export in ``artifacts_dir`` to ``out``.

    The ensemble calls ``settings.triton.inference`` ("auto": trt with an engine, else onnx).
    ``out`` must not exist unless ``force``; it is replaced only once the new one is complete.
    """
    step = on_step or (lambda _msg: None)
    artifacts = Artifacts.open(artifacts_dir, public_key=settings.verify_key)  # signed, when asked, before a write
    out = Path(out).expanduser().absolute()
    if out.exists() and not force:
        raise ConfigError(
            f"{out} already exists; pass --force to replace it (the new repository is built beside it "
            f"and swapped in when complete)"
        )
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out} exists and is not a directory")
    try:
        if artifacts.directory.resolve() == out.resolve() or out.resolve() in artifacts.directory.resolve().parents:
            raise ConfigError(f"{out} would replace the artifact directory {artifacts.directory}; choose another path")
    except OSError:
        pass
    step("checking the engine metadata")
    settings, facts, engine_meta = resolved(artifacts, settings)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        step("verifying and copying artifacts")
        models = build_models(tmp, artifacts, facts, settings, engine_meta)
        write_package(tmp, container_release(engine_meta)[0])
        _write(tmp / "README.md", render_readme(facts, settings, engine_meta, models))
        os.chmod(tmp, 0o755)
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
            os.replace(out, old / "repo")
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("wrote Triton repository %s (%s)", out, ", ".join(models))
    return RepoResult(
        path=out,
        name=facts.name,
        models=models,
        inference=settings.inference,
        onnx_precision=settings.onnx_precision,
        engine=engine_meta,
    )


__all__ = [
    "RepoResult",
    "build_models",
    "build_triton_repo",
    "fp16_validated",
    "model_configs",
    "resolve_inference",
    "resolve_onnx_precision",
    "resolved",
    "settings_from_config",
]
