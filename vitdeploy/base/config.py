"""pipeline.yaml parsed into typed, frozen objects, validated before any heavy work.

Every key has a default, so ``model: {checkpoint: path/to/vit}`` is a complete pipeline, and an
empty file runs the embedded demo model. Unknown keys are rejected; every error names the key,
the value and what is allowed. Relative paths resolve against the YAML file's folder.

This module holds the whole (``PipelineConfig``), its sections ``model``, ``preprocess``, ``runtime`` and
``batch``, and the reading of the file; the export's sections live in ``export_sections.py``, the servers'
in ``serving_sections.py``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping, Optional, Union

from pydantic import BaseModel, Field, ValidationError, model_validator

from ._schema import BatchSize, FiniteFloat, StrictSection, format_validation_error
from .errors import ConfigError
from .export_sections import ExportSection, TensorRTSection, ValidationSection
from .hub_name import HUB_PREFIX, HubName, checkpoint_ref
from .limits import clip
from .preprocess_spec import overrides_model
from .serving_sections import ServeSection, TritonSection
from .vocab import Activation, BackendChoice, EmbeddingDtype, OutputKind, Pool
from .zero_shot_spec import ZeroShotSection

DEFAULT_CONFIG_NAME = "pipeline.yaml"
PositiveFloat = Annotated[FiniteFloat, Field(gt=0)]


_Section = StrictSection  # the one strict base (_schema.StrictSection); this name kept for existing imports


class ModelSection(_Section):
    checkpoint: Optional[str] = Field(
        None,
        description="a checkpoint file or folder (relative to this file; a path that exists always wins), or a "
        "Hugging Face Hub name: org/name, org/name@revision (a branch, tag or commit), hf-hub:timm/<model>.<tag>; "
        "absent = the embedded demo model",
    )
    revision: Optional[str] = Field(
        None,
        description="the Hub revision of model.checkpoint (a branch, tag or commit; same as org/name@revision); "
        "absent = the repo's default branch, resolved once to a commit that the manifest records",
    )
    variant: Optional[str] = Field(
        None, description="named variant (e.g. vit_base_patch16_224) when shapes are ambiguous"
    )
    image_size: Optional[int] = Field(None, gt=0, description="resample position embeddings to this size")
    name: Optional[str] = Field(None, description="model name in the manifest (default: the checkpoint's)")
    # What a bare state dict (timm / torchvision .safetensors or .pth) cannot say; checked against
    # checkpoints that store it (Hugging Face config.json, timm hub config.json, vitdeploy model.json).
    num_heads: Optional[int] = Field(None, gt=0, description="attention heads (bare state dicts do not store them)")
    activation: Optional[Activation] = Field(
        None,
        description="MLP activation: gelu (exact, erf), gelu_tanh (timm gelu_tanh / HF gelu_pytorch_tanh) or "
        "quick_gelu (OpenAI CLIP's x * sigmoid(1.702 x))",
    )
    layer_norm_eps: Optional[PositiveFloat] = Field(None, description="LayerNorm epsilon (timm/torchvision: 1e-6)")
    pool: Optional[Pool] = Field(
        None,
        description="pooling: token (class token), avg (mean patch token; timm global_pool='avg' without fc_norm "
        "cannot be told from the weights), token_avg (both side by side: transformers' DINOv2 "
        "classifiers, whose config states it) or map (SigLIP's attention pooling, read from the weights)",
    )
    output: Union[Literal["auto"], OutputKind] = Field(
        "auto",
        description="what the export returns: logits (a classifier: labels, top-k), embedding (the pooled feature "
        "vector as the checkpoint's library pools it: no labels, judged by cosine and neighbour agreement); auto = "
        "embedding for a checkpoint without a classification head, logits otherwise",
    )
    normalize: bool = Field(
        False, description="embedding only: L2-normalise each vector inside the graph (recorded in the manifest)"
    )
    patch_tokens: bool = Field(
        False,
        description="embedding only: a second output PATCH_TOKENS [batch, patches, width], the image patches' "
        "tokens after the final norm as the library gives them (no class token, no registers, not L2-normalised); "
        "served and written only when a client or job asks",
    )
    zero_shot: Optional[ZeroShotSection] = Field(
        None,
        description="{labels, templates}: a zero-shot classifier from a CLIP / SigLIP checkpoint with its text tower "
        "(transformers CLIPModel, SiglipModel): the class names' prompt embeddings, computed once at export time, "
        "and the logit scale (SigLIP: its bias, sigmoid scores) are baked into the image-only graph "
        "(docs/zero-shot.md); `vitdeploy export --labels FILE`",
    )

    @model_validator(mode="after")
    def _normalize_embeddings_only(self) -> "ModelSection":
        for key in ("normalize", "patch_tokens"):
            if getattr(self, key) and self.output == "logits":
                raise ValueError(f"model.{key} applies to embeddings; it cannot be set with model.output: logits")
        if self.zero_shot is not None:
            for key in ("normalize", "patch_tokens"):
                if getattr(self, key):
                    raise ValueError(f"model.{key} applies to embeddings; model.zero_shot exports a classifier")
            if self.output == "embedding":
                raise ValueError("model.zero_shot exports a classifier (logits); output: embedding contradicts it")
        return self


PreprocessSection = overrides_model(
    _Section,
    doc="Overrides of the preprocessing the checkpoint carries; None keeps the checkpoint's (or, when it "
    "carries none, its library's convention). The fields are PreprocessSpec's (preprocess_spec.py).",
)


class VerifySection(_Section):
    """Signed exports only: the export's signature (model.sig, `vitdeploy sign`) is checked before it is used."""

    public_key: Path = Field(
        ...,
        description="PEM elliptic-curve public key (relative to this file): predict, serve, batch-predict, rollout "
        "and triton-repo refuse an export it did not sign, or changed since (exit 2; --verify-key sets it)",
    )


class RuntimeSection(_Section):
    backend: BackendChoice = Field(
        "auto",
        description="auto = trt if usable, else ort-fp16 on CUDA, else the fastest CPU backend here that passed "
        "its gate (measured at the first load, kept per CPU in auto-backend.json), else torch; "
        "auto skips a backend that cannot run here, never a refused artifact",
    )
    device: str = Field("cpu", pattern=r"^(cpu|cuda(:\d+)?)$", description="cpu, cuda or cuda:N")
    providers: tuple[Union[str, tuple[str, dict[str, Union[str, int, float, bool]]]], ...] = Field(
        ("CPUExecutionProvider",), description="ONNX Runtime providers: a name, or [name, {option: value}]"
    )
    allow_cpu_fallback: bool = Field(False, description="accept an ONNX Runtime session that fell back to the CPU")
    threads: Optional[int] = Field(None, ge=1, description="intra-op threads (default: the library's)")
    ort_allow_spinning: Union[Literal["auto"], bool] = Field(
        "auto", description="ONNX Runtime idle threads busy-wait; auto = only when they leave a core free"
    )
    batch_size: BatchSize = 32
    trt_contexts: int = Field(
        2, ge=1, description="trt backend: execution contexts (GPU memory each) shared by all threads"
    )
    top_k: int = Field(5, ge=1, description="K of predict's top-k")
    max_image_pixels: int = Field(
        89_478_485, ge=1, description="images whose header claims more pixels are refused before decoding"
    )
    verify: Optional[VerifySection] = Field(
        None,
        description="{public_key: PATH}: use only exports signed by that key (docs/serving.md, Signed exports); "
        "absent: a signature is not looked for",
    )


# batch/job.py's BatchSettings is this section and what the job adds (one definition of these fields).
class BatchSection(_Section):
    """`vitdeploy batch-predict` (Ray Data): the worker pool and the output (CLI flags override)."""

    workers: Union[Literal["auto"], Annotated[int, Field(ge=1)]] = Field(
        "auto",
        description="inference actors (one Predictor each); auto: on a Ray this job starts, one per cpus_per_worker "
        "of the machine's cores (decoding gets its own logical CPUs), else 1",
    )
    cpus_per_worker: float = Field(
        1.0,
        ge=0,
        description="Ray CPUs per inference actor; also its intra-op threads (whole CPUs; runtime.threads is a "
        "predictor's, used only for a fraction)",
    )
    gpus_per_worker: float = Field(0.0, ge=0, description="Ray GPUs per inference actor (e.g. 1, or 0.5 to share one)")
    decode_cpus: float = Field(
        1.0, gt=0, description="Ray CPUs per reading or decoding task (Ray runs as many as fit)"
    )
    batch_size: Optional[BatchSize] = Field(
        None, description="images per model call; absent = the export's batch profile opt (export.batch.opt)"
    )
    rows_per_file: int = Field(10_000, ge=1, description="output rows per Parquet part file (and per flush)")
    embedding_dtype: EmbeddingDtype = Field(
        "float32",
        description="an embedding export's vectors in the output: float32 (as the model returns them) or float16 "
        "(half the bytes); a classifier's rows have no vectors",
    )
    patch_tokens: bool = Field(
        False,
        description="an export with model.patch_tokens: a patch_tokens column beside each vector (fixed-size list of "
        "P fixed-size lists of D, in embedding_dtype; P times the vector's size); `batch-predict --patch-tokens`",
    )
    flush_seconds: float = Field(
        30.0,
        gt=0,
        description="rows are written at least this often, so a killed job loses at most this much work (--resume)",
    )
    cache_dir: Optional[Path] = Field(
        None,
        description="per-node cache of the artifacts shipped to workers; absent = "
        "$VITDEPLOY_ARTIFACT_CACHE, else ~/.cache/vitdeploy/artifacts",
    )


class PipelineConfig(_Section):
    model: ModelSection = ModelSection()
    preprocess: PreprocessSection = PreprocessSection()
    export: ExportSection = ExportSection()
    validation: ValidationSection = ValidationSection()
    tensorrt: TensorRTSection = TensorRTSection()
    triton: TritonSection = TritonSection()
    runtime: RuntimeSection = RuntimeSection()
    serve: ServeSection = ServeSection()
    batch: BatchSection = BatchSection()
    source: Optional[Path] = Field(None, exclude=True, description="the YAML this came from")

    @property
    def base_dir(self) -> Path:
        return self.source.parent if self.source else Path.cwd()

    def resolve(self, path: Optional[Path]) -> Optional[Path]:
        if path is None:
            return None
        path = Path(path).expanduser()
        return path if path.is_absolute() else (self.base_dir / path).resolve()

    @property
    def checkpoint_ref(self) -> "Path | HubName | None":
        """What model.checkpoint names: an existing path, a Hub name (base/hub_name.py), or None (the demo)."""
        return checkpoint_ref(self.model.checkpoint, self.base_dir, self.model.revision)

    def with_checkpoint(self, model: Optional[str], revision: Optional[str]) -> "PipelineConfig":
        """This config with ``model`` (``vitdeploy export MODEL``, relative to the current directory) in place
        of model.checkpoint and ``revision`` (``--revision``) in place of model.revision; checked as the file's."""
        if model is None and revision is None:
            return self
        if model is None:  # --revision alone: the config's checkpoint at that revision
            value, base = self.model.checkpoint, self.base_dir
        else:  # the command line's MODEL: a path is the shell's (the current directory), else a Hub name
            path, base = Path(model).expanduser(), Path.cwd()
            value = str(path.resolve()) if not model.startswith(HUB_PREFIX) and path.exists() else model
        key = "MODEL" if model is not None else "model.checkpoint"
        ref = checkpoint_ref(value, base, revision if model is not None else revision or self.model.revision, key=key)
        if isinstance(ref, HubName):
            value, revision = HUB_PREFIX + ref.repo_id, ref.revision
        section = self.model.model_copy(update={"checkpoint": value, "revision": revision})
        cfg = self.model_copy(update={"model": section})
        return cfg

    def with_zero_shot(self, labels: Optional[Path], templates: tuple[str, ...] = ()) -> "PipelineConfig":
        """This config with ``--labels FILE`` (relative to the current directory) as model.zero_shot.labels and
        ``--template`` (repeatable) as its templates; checked as the file's."""
        if labels is None and not templates:
            return self
        current = self.model.zero_shot
        if labels is None and current is None:
            raise ConfigError("--template needs class names: --labels FILE, or model.zero_shot.labels in the config")
        data = current.model_dump() if current is not None else {}
        if labels is not None:
            data["labels"] = Path(labels).expanduser().resolve()
        if templates:
            data["templates"] = tuple(templates)
        label = "--labels / --template"
        try:
            section = ZeroShotSection.model_validate(data)
        except ValidationError as exc:
            raise ConfigError(format_validation_error(exc, label, prefix=("model", "zero_shot"))) from None
        try:
            model = ModelSection.model_validate({**self.model.model_dump(), "zero_shot": section})
        except ValidationError as exc:
            raise ConfigError(format_validation_error(exc, label, prefix=("model",))) from None
        return self.model_copy(update={"model": model})

    @property
    def verify_key(self) -> Optional[Path]:
        """runtime.verify.public_key, resolved; None: exports are used without looking for a signature."""
        return self.resolve(self.runtime.verify.public_key) if self.runtime.verify else None

    def with_verify_key(self, path: Optional[Path]) -> "PipelineConfig":
        """This config with ``--verify-key`` (relative to the current directory) as runtime.verify.public_key."""
        if path is None:
            return self
        verify = VerifySection(public_key=Path(path).expanduser().resolve())
        return self.model_copy(update={"runtime": self.runtime.model_copy(update={"verify": verify})})

    @property
    def output_dir(self) -> Path:
        return self.resolve(self.export.output_dir)  # type: ignore[return-value]


# The top-level sections, derived from the model (never typed twice): model, preprocess, export, ...
SECTIONS: tuple[str, ...] = tuple(name for name, f in PipelineConfig.model_fields.items() if not f.exclude)


def _format_error(exc: ValidationError, source: str) -> str:
    def allowed(loc: tuple) -> str:
        parent = _section_for(loc)
        return ", ".join(sorted(parent.model_fields)) if parent else "see the README"

    return format_validation_error(exc, source, allowed)


def _section_for(loc: tuple) -> Optional[type[BaseModel]]:
    model: type[BaseModel] = PipelineConfig
    for part in loc:
        field = model.model_fields.get(str(part))
        ann = getattr(field, "annotation", None) if field else None
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return None
        model = ann
    return model


def parse_config(data: Any, source: Optional[Path] = None) -> PipelineConfig:
    label = str(source) if source else "pipeline config"
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{label}: the top level must be a mapping of sections ({', '.join(SECTIONS)}), got {type(data).__name__}"
        )
    if "source" in data:
        raise ConfigError(f"{label}: unknown key 'source' (allowed: {', '.join(SECTIONS)})")
    try:
        cfg = PipelineConfig.model_validate({**data, "source": source.resolve() if source else None})
    except ValidationError as exc:
        raise ConfigError(_format_error(exc, label)) from None
    _check_paths(cfg, label)
    return cfg


def _check_paths(cfg: PipelineConfig, label: str) -> None:
    try:
        cfg.checkpoint_ref  # an existing path or a Hub name, said before any work
    except ConfigError as exc:
        raise ConfigError(f"{label}: {exc}") from None
    verify = cfg.runtime.verify.public_key if cfg.runtime.verify else None
    for key, path in (("validation.images", cfg.validation.images), ("runtime.verify.public_key", verify)):
        resolved = cfg.resolve(path)
        if resolved is not None and not resolved.exists():
            raise ConfigError(
                f"{label}: '{key}' = {clip(str(path))}: no such file or directory ({clip(str(resolved))})"
            )


def load_config(path: Optional[Path | str] = None) -> PipelineConfig:
    """Read a pipeline YAML. ``None`` reads ./pipeline.yaml if present, else all defaults.

    The file is read with bounds (size, nesting, alias expansion: see yaml_load.py)."""
    from .yaml_load import load_yaml_file

    if path is None:
        candidate = Path.cwd() / DEFAULT_CONFIG_NAME
        if not candidate.exists():
            return parse_config({}, None)
        path = candidate
    path = Path(path)
    if path.is_dir():
        raise ConfigError(
            f"{path} is a directory; -c/--config takes a pipeline YAML file (e.g. {path / DEFAULT_CONFIG_NAME})"
        )
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    return parse_config(load_yaml_file(path), path)


def config_from(source: "PipelineConfig | Mapping[str, Any] | str | os.PathLike[str] | None") -> PipelineConfig:
    """The pipeline config a caller holds: a :class:`PipelineConfig` as it is, a mapping of sections
    (validated as a pipeline.yaml's, relative paths against the current folder), a pipeline YAML's path, or
    None (:func:`load_config`: ./pipeline.yaml where it exists, else the defaults)."""
    if isinstance(source, PipelineConfig):
        return source
    if isinstance(source, Mapping):
        return parse_config(dict(source), None)
    if source is None or isinstance(source, (str, os.PathLike)):
        return load_config(source)
    raise ConfigError(
        f"config: a pipeline.yaml path, a mapping of its sections or a PipelineConfig, got a {type(source).__name__}"
    )
