"""The files of an export against its manifest: model.json (the torch backend's architecture), model.engine.json
(TensorRT's), a loaded graph's inputs and outputs.

One of four modules about an export folder: ``manifest_schema`` (what a manifest may say), this one (each file
against it), ``artifacts`` (a folder on this machine, verified) and ``artifact_transfer`` (getting a folder to
another node). Each check raises :class:`ArtifactIntegrityError`: an artifact that contradicts its manifest is
refused with the whole directory, and auto-selection never falls back past it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from ..base.errors import ArtifactIntegrityError
from ..base.limits import clip
from ..base.output_spec import ModelOutput
from .manifest_schema import FIX, Manifest


def _refuse(what: str, problems: Sequence[str], manifest_path: Path) -> None:
    if problems:
        raise ArtifactIntegrityError(
            f"{what} disagrees with {manifest_path}: {'; '.join(problems)}; the directory "
            f"mixes files of different exports or was edited; {FIX}"
        )


def check_model_config(manifest: Manifest, config: Any, config_path: Path, manifest_path: Path) -> None:
    """model.json (the torch backend's architecture) against the manifest: classes, channels, size."""
    from ..base.vit_schema import validate_vit_config

    if not isinstance(config, dict) or config.get("format") != "vitdeploy" or not isinstance(config.get("vit"), dict):
        raise ArtifactIntegrityError(
            f'{config_path} is not a vitdeploy model config (expected "format": "vitdeploy" and a "vit" object); {FIX}'
        )
    vit = validate_vit_config(config["vit"], config_path, key_prefix="vit", error=ArtifactIntegrityError)
    c, h, w = manifest.chw
    problems = []
    if manifest.is_embedding:
        from ..base.vit_schema import ViTConfig

        width = ViTConfig.from_dict(vit).pooled_width
        if width != manifest.num_classes:
            problems.append(f"pooled features of {width} values vs {manifest.num_classes} in io.output")
        if _output_of(config.get("output")) != manifest.output:
            problems.append(f"output {clip(config.get('output'))} vs {manifest.output.to_dict()} in the manifest")
        cfg = ViTConfig.from_dict(vit)
        if manifest.patch_shape is not None and manifest.patch_shape != (cfg.num_patches, cfg.width):
            got = list(manifest.patch_shape)
            problems.append(f"patch tokens [{cfg.num_patches}, {cfg.width}] vs {got} in io.patch_tokens")
    elif vit["num_classes"] != manifest.num_classes:
        problems.append(f"{vit['num_classes']} classes (vit.num_classes) vs {manifest.num_classes} in io.output")
    if vit["in_channels"] != c:
        problems.append(f"{vit['in_channels']} input channels vs {c}")
    if (vit["image_size"], vit["image_size"]) != (h, w):
        problems.append(f"image size {vit['image_size']} vs {h}x{w} in io.input")
    _refuse(str(config_path), problems, manifest_path)


def _output_of(data: Any) -> Any:
    """model.json's ``output`` as a ModelOutput (None where it is not one: never equal to the manifest's)."""
    try:
        return ModelOutput.model_validate(data)
    except ValueError:
        return None


def check_engine_meta(manifest: Manifest, meta: Any, meta_path: Path, manifest_path: Path) -> None:
    """model.engine.json against the manifest: input name and (C, H, W)."""
    if not isinstance(meta, dict):
        raise ArtifactIntegrityError(f"{meta_path}: expected a JSON object; {FIX}")
    problems = []
    if meta.get("input") != manifest.io.input.name:
        problems.append(f"input {clip(meta.get('input'))} vs {manifest.io.input.name!r} (io.input.name)")
    chw = meta.get("chw")
    if not isinstance(chw, list) or tuple(chw) != manifest.chw:
        problems.append(f"chw {clip(chw)} vs {list(manifest.chw)} (io.input.shape)")
    _refuse(str(meta_path), problems, manifest_path)


Tensor = tuple[str, str, Sequence[Any]]  # (name, dtype "float32"/"float16"/other, shape: ints, names or None)


def _chw_ok(shape: Sequence[Any], manifest: Manifest) -> bool:
    """(C, H, W) as io.input says; an export for several sizes has named (dynamic) height and width."""
    if tuple(shape[1:]) == manifest.chw:
        return True
    dynamic = all(isinstance(d, str) and d for d in shape[2:])
    return bool(manifest.sizes) and shape[1] == manifest.chw[0] and dynamic


def check_graph_io(
    manifest: Manifest,
    graph_path: Path,
    inputs: Sequence[Tensor],
    outputs: Sequence[Tensor],
    manifest_path: Path,
    *,
    fp16_io_ok: bool = False,
) -> None:
    """A loaded graph's inputs/outputs against the manifest's io spec and label count.

    Exactly one input, named and typed as io.input, shape [batch, C, H, W] with C, H, W static and
    equal; an output named io.output, shape [batch, classes] with classes static and equal to the
    number of labels; no output the manifest does not describe. ``fp16_io_ok``: float16 I/O is
    accepted where the manifest says float32 (an FP16 graph that kept half-precision I/O)."""
    io = manifest.io
    ok_dtypes = {io.input.dtype, *(("float16",) if fp16_io_ok else ())}
    problems: list[str] = []
    if len(inputs) != 1:
        problems.append(
            f"graph has {len(inputs)} inputs {clip([i[0] for i in inputs])}, expected one ({io.input.name!r})"
        )
    else:
        name, dtype, shape = inputs[0]
        if name != io.input.name:
            problems.append(f"input is named {clip(name)}, the manifest says {io.input.name!r}")
        if dtype not in ok_dtypes:
            problems.append(f"input dtype {dtype} vs {io.input.dtype}")
        if len(shape) != 4 or not _chw_ok(shape, manifest) or not _batch_dim_ok(shape[0], manifest):
            problems.append(f"input shape {clip(_dims(shape))} vs [batch, {', '.join(map(str, manifest.chw))}]")
    described = {io.output.name: io.output, **{t.name: t for t in (io.features, io.patch_tokens) if t is not None}}
    by_name = {o[0]: o for o in outputs}
    extra = [n for n in by_name if n not in described]
    if extra:
        problems.append(f"outputs {clip(extra)} are not in the manifest's io")
    logits = by_name.get(io.output.name)
    if logits is None:
        problems.append(f"no output named {io.output.name!r} (outputs: {clip(list(by_name))})")
    else:
        _, dtype, shape = logits
        if dtype not in ({io.output.dtype, "float16"} if fp16_io_ok else {io.output.dtype}):
            problems.append(f"output dtype {dtype} vs {io.output.dtype}")
        if len(shape) != 2 or shape[1] != manifest.num_classes or not _batch_dim_ok(shape[0], manifest):
            what = "embedding" if manifest.is_embedding else f"{len(manifest.labels)} labels"
            problems.append(f"output shape {clip(_dims(shape))} vs [batch, {manifest.num_classes}] ({what})")
    if io.patch_tokens is not None:
        problems += _patch_tokens_problems(manifest, by_name.get(io.patch_tokens.name), fp16_io_ok)
    _refuse(f"graph {graph_path}", problems, manifest_path)


def _patch_tokens_problems(manifest: Manifest, tensor: Tensor | None, fp16_io_ok: bool) -> list[str]:
    """The graph's patch-token output against io.patch_tokens: there, float32 (or float16 where allowed),
    [batch, patches, width]."""
    spec, (patches, width) = manifest.io.patch_tokens, manifest.patch_shape or (0, 0)
    if tensor is None:
        return [f"no output named {spec.name!r} (io.patch_tokens)"]
    _, dtype, shape = tensor
    problems = []
    if dtype not in ({spec.dtype, "float16"} if fp16_io_ok else {spec.dtype}):
        problems.append(f"{spec.name} dtype {dtype} vs {spec.dtype}")
    # an export for several sizes: the count follows the input's grid ((side / patch)^2), a dynamic axis
    grid_ok = len(shape) == 3 and (shape[1] == patches or (bool(manifest.sizes) and _batch_dim_ok(shape[1], manifest)))
    if len(shape) != 3 or not grid_ok or shape[2] != width or not _batch_dim_ok(shape[0], manifest):
        problems.append(f"{spec.name} shape {clip(_dims(shape))} vs [batch, {patches}, {width}] (io.patch_tokens)")
    return problems


def _batch_dim_ok(dim: Any, manifest: Manifest) -> bool:
    if dim is None or isinstance(dim, str):
        return True  # symbolic: dynamic batch
    return type(dim) is int and (dim == -1 or manifest.batch.min == manifest.batch.max == dim)


def _dims(shape: Sequence[Any]) -> list[Any]:
    return ["?" if d is None else d for d in shape]


def onnx_dtype_name(ort_type: str) -> str:
    """ONNX Runtime's 'tensor(float)' -> 'float32' (others pass through)."""
    return {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(double)": "float64"}.get(
        ort_type, ort_type
    )


__all__ = ["check_engine_meta", "check_graph_io", "check_model_config", "onnx_dtype_name"]
