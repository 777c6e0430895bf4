"""The export's FP32 rows and its last: ``model`` (the checkpoint understood and saved), ``onnx``
(model.onnx), ``reference`` (eager PyTorch logits on the validation inputs, once for every check),
``ort-optimize`` (model.ort.onnx) and ``manifest``. Rows of the table in export/pipeline.py.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import numpy as np

from ..base.config import PipelineConfig
from ..base.errors import ExportError, MissingDependencyError, StageUnavailableError
from ..base.vocab import EXPORT_REPORT_NAME
from ..demo import IMAGES_DIR as DEMO_IMAGES_DIR
from ..runtime.backends import first_line
from . import manifest as manifest_mod
from . import memory_budget
from .context import ExportContext, StageRecord
from .onnx import INPUT_NAME
from .rows import Artifact, Made, Stage, ort_gate

log = logging.getLogger(__name__)


def validation_images(cfg: PipelineConfig) -> list[Path]:
    from ..runtime.image_paths import iter_image_paths

    folder = cfg.resolve(cfg.validation.images) or (DEMO_IMAGES_DIR if DEMO_IMAGES_DIR.is_dir() else None)
    if folder is None:
        return []
    return iter_image_paths([folder])[: cfg.validation.max_images]


def reference_outputs(model: Any, batch: np.ndarray, chunk: int = 16) -> tuple[np.ndarray, ...]:
    """Eager PyTorch over ``batch``: every output of ``model`` (the logits or the embedding; then its patch
    tokens where the network returns them), float32."""
    import torch

    parts: list[tuple[np.ndarray, ...]] = []
    with torch.inference_mode():
        for i in range(0, len(batch), chunk):
            out = model(torch.from_numpy(batch[i : i + chunk]))
            parts.append(tuple(t.float().numpy() for t in (out if isinstance(out, tuple) else (out,))))
    return tuple(np.concatenate(column) for column in zip(*parts))


def reference_logits(model: Any, batch: np.ndarray, chunk: int = 16) -> np.ndarray:
    return reference_outputs(model, batch, chunk)[0]


def _model(ctx: ExportContext, rec: StageRecord) -> Made:
    from ..base.output_spec import resolve_output
    from ..model.checkpoints import save_checkpoint
    from ..model.vit import output_network
    from .effective import Effective, describe, load_model, resolve_preprocess

    cfg = ctx.cfg
    ctx.loaded = load_model(cfg)
    scores = "softmax"
    if cfg.model.zero_shot is not None:  # the text tower runs here, once; its classes become the head
        ctx.loaded, ctx.zero_shot = _zero_shot(cfg, ctx.loaded)
        scores = ctx.zero_shot["scores"]
    vit = ctx.loaded.config
    ctx.output = resolve_output(
        cfg.model.output,
        cfg.model.normalize,
        vit.num_classes,
        cfg.checkpoint_ref or "the demo model",
        cfg.model.patch_tokens,
        scores,
    )
    ctx.spec, origins = resolve_preprocess(cfg, ctx.loaded)
    ctx.effective = Effective(ctx.loaded, ctx.spec, origins)
    rec.details = describe(ctx.effective, cfg)
    ctx.name = cfg.model.name or ctx.loaded.name
    save_checkpoint(ctx.out_dir, ctx.loaded.model, ctx.loaded.labels, ctx.spec, ctx.name, ctx.output)
    ctx.weights = memory_budget.weight_bytes(ctx.loaded.model)
    if ctx.output.is_embedding:  # what every later stage runs and judges: the pooled vector, no labels
        ctx.loaded = dataclasses.replace(ctx.loaded, model=output_network(ctx.loaded.model, ctx.output), labels=())
        ctx.effective = dataclasses.replace(ctx.effective, loaded=ctx.loaded)
    rec.outputs = [ctx.path("weights"), ctx.path("weights-config")]  # in the manifest last (the manifest row)
    ctx.chw = (vit.in_channels, vit.image_size, vit.image_size)
    ctx.image_sizes = tuple(cfg.export.image_sizes or ()) if vit.dynamic_size else ()
    return ()


def _zero_shot(cfg: PipelineConfig, loaded: Any) -> tuple[Any, dict[str, Any]]:
    """``model.zero_shot``: the checkpoint's text tower run over the class prompts, baked into the image tower's
    head (model/zero_shot.py); the classifier and the manifest's record of it."""
    from ..demo import DEMO_DIR
    from ..model.zero_shot import compile_zero_shot

    ref = cfg.checkpoint_ref
    source = loaded.hub.folder if loaded.hub is not None else Path(ref) if ref is not None else DEMO_DIR
    return compile_zero_shot(loaded, cfg.model.zero_shot, cfg.base_dir, source)


def _onnx(ctx: ExportContext, rec: StageRecord) -> Made:
    from .onnx import export_onnx

    vit, cfg = ctx.loaded.config, ctx.cfg
    metadata = {
        "vitdeploy.name": ctx.name,
        "vitdeploy.labels": list(ctx.loaded.labels),
        "vitdeploy.preprocess": ctx.spec.to_dict(),
        "vitdeploy.vit": vit.to_dict(),
        "vitdeploy.output": ctx.output.to_dict(),
        **({"vitdeploy.image_sizes": list(ctx.image_sizes)} if ctx.image_sizes else {}),
    }
    onnx_art = export_onnx(
        ctx.loaded.model,
        ctx.path("onnx"),
        image_size=vit.image_size,
        in_channels=vit.in_channels,
        opset=cfg.export.opset,
        metadata=metadata,
        output_name=ctx.output.tensors,
        external_data_threshold_mb=cfg.export.external_data_threshold_mb,
        sizes=ctx.image_sizes,
        patch_size=vit.patch_size,
    )
    return (Artifact("onnx", onnx_art.path, tuple(onnx_art.external_data)),)


def _reference(ctx: ExportContext, rec: StageRecord) -> Made:
    from ..runtime.preprocess import Preprocessor
    from .validate import build_inputs, validation_batch_sizes

    cfg = ctx.cfg
    ctx.sizes = ctx.validation_batch or validation_batch_sizes(cfg.export.batch.max)
    ctx.inputs = build_inputs(
        Preprocessor(ctx.spec),
        validation_images(cfg),
        noise_samples=cfg.validation.noise_samples,
        seed=cfg.validation.seed,
        min_count=max(ctx.sizes),
    )
    outputs = reference_outputs(ctx.loaded.model, ctx.inputs.batch)
    ctx.reference = outputs[0]
    ctx.patch_reference = outputs[1] if ctx.output.patch_tokens else None
    for side in ctx.image_sizes:  # the same images and noise at every other size, preprocessed for it
        if side != ctx.chw[1]:
            inputs = build_inputs(
                Preprocessor(ctx.spec.at_size(side)),
                validation_images(cfg),
                noise_samples=cfg.validation.noise_samples,
                seed=cfg.validation.seed,
                min_count=max(ctx.sizes),
            )
            ctx.other_sizes[side] = (inputs, reference_logits(ctx.loaded.model, inputs.batch))
    ctx.release_model()  # the last stage that runs the eager model
    n, n_images = len(ctx.inputs.names), ctx.inputs.image_count
    what = "embeddings" if ctx.output.is_embedding else "logits"
    what += " and patch tokens" if ctx.output.patch_tokens else ""
    rec.reason = f"eager PyTorch {what} for {n} inputs ({n_images} images, {n - n_images} noise)" + (
        f" at each of {', '.join(map(str, ctx.image_sizes))} px" if ctx.image_sizes else ""
    )
    return ()


def _ort_optimize(ctx: ExportContext, rec: StageRecord) -> Made:
    """model.ort.onnx: the ONNX Runtime-only FP32 graph (contrib ops, never fed to TensorRT).

    Optional: when the optimiser is missing or fails, the stage is skipped and "ort" runs
    model.onnx; when the graph drifts it is rejected like any other artifact (exit 3)."""
    from .optimize import fused_op_counts, optimize_for_ort

    vit, cfg, path = ctx.loaded.config, ctx.cfg, ctx.path("onnx-ort")
    data = path.with_name(path.name + ".data")
    try:
        # the class-token-only last block is sound only when the classifier reads the class token alone;
        # MultiHeadAttention takes projected q/k/v, with no place for qk-norm's LayerNorms between
        if vit.qk_norm:
            log.info(
                "attention fusion skipped: qk-norm normalises q and k between the projection and the "
                "attention, which the fused MultiHeadAttention op cannot express"
            )
        optimize_for_ort(
            ctx.path("onnx"),
            path,
            num_heads=vit.heads,
            hidden_size=vit.width,
            external_data_threshold_mb=cfg.export.external_data_threshold_mb,
            attention="none" if vit.qk_norm else "MultiHeadAttention",
            # patch tokens are an output too: every row of the last block is read
            class_token_only=vit.reads_class_token_only and not ctx.output.patch_tokens,
        )
    except (ExportError, MissingDependencyError) as exc:
        # Said once, on the stage's line (not also as a warning).
        ctx.drop(("onnx-ort",))
        rec.status = "skipped"
        rec.reason = f"model.ort.onnx not written, the ort backend will run model.onnx: {first_line(exc)}"
        return ()
    fused = fused_op_counts(path)
    ctx.extra["ort_optimize"] = {"fused": fused}
    rec.reason = ", ".join(f"{n} {op}" for op, n in fused.items())
    return (Artifact("onnx-ort", path, (data,) if data.is_file() else ()),)


def _manifest(ctx: ExportContext, rec: StageRecord) -> Made:
    cfg, out = ctx.cfg, ctx.out_dir
    for role in ("weights", "weights-config"):
        ctx.add(role, ctx.path(role))
    names = ctx.inputs.names
    manifest = manifest_mod.build_manifest(
        name=ctx.name,
        vit=ctx.loaded.config.to_dict(),
        source=ctx.effective.model_record(cfg),
        labels=ctx.loaded.labels,
        preprocess=ctx.spec.to_dict(),
        input_name=INPUT_NAME,
        output=ctx.output,
        output_width=ctx.loaded.config.pooled_width if ctx.output.is_embedding else len(ctx.loaded.labels),
        patch_shape=(ctx.loaded.config.num_patches, ctx.loaded.config.width),
        chw=ctx.chw,
        batch=cfg.export.batch.model_dump(),
        artifacts=ctx.entries,
        validation=ctx.validation,
        stages=[s.to_dict() for s in ctx.stages if s.name != "manifest"],
        extra={
            "preprocess_origins": ctx.effective.origins,
            "preprocess_reference": ctx.effective.preprocess_reference(),
            "export": ctx.extra,
            **_image_sizes(ctx),
            **({"zero_shot": ctx.zero_shot} if ctx.zero_shot is not None else {}),
            "validation_inputs": {
                "count": len(names),
                "images": ctx.inputs.image_count,
                "batch_sizes": list(ctx.sizes),
            },
        },
    )
    path = manifest_mod.write_manifest(out, manifest)
    manifest_mod.read_back(out)  # never "ok" for an export its own runtime would refuse
    if ctx.refused:
        ctx.write_report()  # what was refused and why, beside a manifest without it
    else:
        (out / EXPORT_REPORT_NAME).unlink(missing_ok=True)
    rec.outputs = [path]
    return ()


def _image_sizes(ctx: ExportContext) -> dict[str, Any]:
    """The manifest's ``image_sizes``: the sides the export answers at and each one's preprocessing."""
    if not ctx.image_sizes:
        return {}
    recipes = {str(s): ctx.spec.at_size(s).to_dict() for s in ctx.image_sizes}
    return {"image_sizes": {"sizes": list(ctx.image_sizes), "preprocess": recipes}}


MODEL = Stage("model", _model)
ONNX = Stage("onnx", _onnx, roles=("onnx",), gate=ort_gate("validate-onnx", "fp32", "ort"))
REFERENCE = Stage("reference", _reference)
ORT_OPTIMIZE = Stage(
    "ort-optimize",
    _ort_optimize,
    roles=("onnx-ort",),
    skip=lambda ctx: None if ctx.cfg.export.optimize else "export.optimize is false",
    gate=ort_gate("validate-ort-optimized", "fp32", "ort"),
    refused_on=(StageUnavailableError,),  # no memory for it here (export/memory_budget.py): the rest ships, exit 4
    refusal_hint="export.optimize: false exports without it",
)
MANIFEST = Stage("manifest", _manifest)
