"""pipeline.yaml's sections for making and judging an export: ``export`` (its batch profile, FP16, INT8),
``validation`` (the tolerances each precision is judged by) and ``tensorrt`` (the engine builder).

Part of the config (``config.PipelineConfig`` holds them); typed, frozen, unknown keys refused like every section.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import Field, model_validator

from ._schema import BatchSize, FiniteFloat, StrictSection
from .vit_schema import MAX_SIDE as MAX_IMAGE_SIDE


class BatchProfile(StrictSection):
    """Batch sizes of the dynamic-batch profile, 1..MAX_BATCH (4096): past that a ViT's input alone
    is gigabytes, and TensorRT profiles stop well before."""

    min: BatchSize = 1
    opt: BatchSize = 8
    max: BatchSize = 32

    @model_validator(mode="after")
    def _ordered(self) -> "BatchProfile":
        if not self.min <= self.opt <= self.max:
            raise ValueError(
                f"batch sizes must satisfy min <= opt <= max, got min={self.min}, opt={self.opt}, max={self.max}"
            )
        return self


class Fp16Section(StrictSection):
    enabled: bool = Field(True, description="write and validate model.fp16.onnx (the graph TensorRT compiles)")
    keep_fp32_ops: tuple[str, ...] = Field(
        ("LayerNormalization",), description="op types kept float32 in the FP16 graph"
    )
    max_abs_activation: FiniteFloat = Field(
        4096.0,
        gt=0,
        description="nodes whose outputs exceed this on calibration images stay float32 (FP16 max is 65504)",
    )
    autopilot: bool = Field(
        True,
        description="when validation.fp16 fails with only keep_fp32_ops and the hot nodes in "
        "float32, return Softmax-like ops, the head, then block by block to float32 "
        "until it passes (every step recorded in the manifest)",
    )


class Int8Section(StrictSection):
    """``model.int8.onnx``: INT8 quantization of the fused graph (export/quantize.py)."""

    enabled: Union[Literal["auto"], bool] = Field(
        "auto",
        description="auto = build it and go on without it when it cannot be built or fails validation.int8; "
        "true = required (a failure is refused: the export is written without it and exits non-zero); false = skip",
    )
    mode: Literal["static", "dynamic"] = Field(
        "static",
        description="static: calibrated QDQ, an image's answer does not depend on its batch; dynamic: "
        "activation ranges per batch (no calibration, but batch-dependent answers)",
    )
    calibration_method: Literal["minmax", "entropy", "percentile"] = Field(
        "minmax", description="ONNX Runtime's calibrator for the static INT8 graph"
    )
    calibration_images: int = Field(64, ge=1, description="real validation images used to calibrate (at most)")
    min_calibration_images: int = Field(16, ge=1, description="fewer real validation images than this: no static INT8")
    autopilot: bool = Field(
        True,
        description="when validation.int8 fails, return Gemm, then block by block MatMuls to float, within "
        "what min_speedup allows: refused at once when the largest such step fails on the inputs the fully "
        "quantized graph failed on, else the fewest in float that pass (every step judged in the manifest)",
    )
    min_speedup: float = Field(
        1.3,
        ge=0,
        description="model.int8.onnx is shipped only when it runs at least this many "
        "times as fast as model.ort.onnx here (the fully quantized graph is timed on the calibration "
        "batch before any accuracy work, the graph that passed validation again after); 0 = always ship",
    )
    tensorrt: Union[Literal["auto"], bool] = Field(
        "auto",
        description="model.int8.trt.onnx (S8 symmetric Q/DQ from model.onnx) and the INT8 TensorRT engine "
        "model.int8.engine built from it: auto = when the engine stage runs (TensorRT and a CUDA GPU "
        "here), going on without them on failure; true = always write and validate the graph (a "
        "failure is refused: written without it, exit non-zero), and build the engine where TensorRT "
        "exists; false = never",
    )


class ExportSection(StrictSection):
    output_dir: Path = Field(Path("artifacts"), description="where the artifacts go (`export -o` overrides)")
    opset: int = Field(18, ge=17, le=23, description="ONNX opset (17-23; 18 keeps LayerNorm one node)")
    batch: BatchProfile = BatchProfile()
    fp16: Fp16Section = Fp16Section()
    int8: Int8Section = Int8Section()
    external_data_threshold_mb: int = Field(
        1536, ge=0, description="write weights as external data above this size (protobuf limit: 2 GB; 0 = always)"
    )
    optimize: bool = Field(True, description="save ONNX Runtime's transformer-fused graph when the drift checks pass")
    image_sizes: Optional[list[Annotated[int, Field(gt=0, le=MAX_IMAGE_SIDE)]]] = Field(
        None,
        min_length=1,
        max_length=32,
        description="square image sizes one export answers at (e.g. [224, 336, 448, 518]), each a multiple of the "
        "patch, each validated against eager PyTorch at that size: for checkpoints whose library runs them at any "
        "size (DINOv2, transformers ViT / DeiT, timm); absent = one fixed size",
    )

    @model_validator(mode="after")
    def _sorted_sizes(self) -> "ExportSection":
        if self.image_sizes is not None:
            object.__setattr__(self, "image_sizes", sorted(set(self.image_sizes)))
        return self


class Tolerance(StrictSection):
    max_abs_diff: FiniteFloat = Field(..., ge=0, description="largest |logit difference| against eager FP32 PyTorch")
    mean_abs_diff: FiniteFloat = Field(..., ge=0, description="mean |logit difference| against eager FP32 PyTorch")
    min_cosine: FiniteFloat = Field(..., ge=-1, le=1, description="lowest cosine similarity of a row of logits")
    min_top1_agreement: FiniteFloat = Field(
        ..., ge=0, le=1, description="share of inputs whose top-1 class is eager's"
    )
    min_top5_overlap: FiniteFloat = Field(..., ge=0, le=1, description="mean share of eager's top-5 in the top-5")
    min_recall_at_k: FiniteFloat = Field(
        1.0,
        ge=0,
        le=1,
        description="embedding models: mean share of each input's k nearest neighbours (cosine, among the "
        "validation inputs) under eager PyTorch that are among its k nearest under the artifact (recall@k)",
    )
    neighbours: int = Field(10, ge=1, le=1000, description="embedding models: k of min_recall_at_k")
    min_patch_cosine: Optional[FiniteFloat] = Field(
        None,
        ge=-1,
        le=1,
        description="embedding models with model.patch_tokens: lowest cosine of a patch token to eager's, over "
        "every token of every input; absent = min_cosine",
    )

    @model_validator(mode="before")
    @classmethod
    def _patch_cosine_defaults_to_min_cosine(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("min_patch_cosine") is None and "min_cosine" in data:
            return {**data, "min_patch_cosine": data["min_cosine"]}
        return data


class ValidationSection(StrictSection):
    images: Optional[Path] = Field(None, description="folder of real images; absent = the demo images")
    max_images: int = Field(64, ge=1, description="validation images used (at most)")
    noise_samples: int = Field(8, ge=0, description="seeded noise inputs added to the real images")
    seed: int = Field(0, description="seed of the noise inputs")
    fp32: Tolerance = Tolerance(
        max_abs_diff=1e-3, mean_abs_diff=1e-4, min_cosine=0.99999, min_top1_agreement=1.0, min_top5_overlap=1.0
    )
    fp16: Tolerance = Tolerance(
        max_abs_diff=0.1,
        mean_abs_diff=0.02,
        min_cosine=0.999,
        min_top1_agreement=0.98,
        min_top5_overlap=0.9,
        min_recall_at_k=0.95,
    )
    int8: Tolerance = Tolerance(
        max_abs_diff=1.0,
        mean_abs_diff=0.1,
        min_cosine=0.99,
        min_top1_agreement=0.98,
        min_top5_overlap=0.9,
        min_recall_at_k=0.9,
    )
    bf16: Tolerance = Tolerance(  # openvino-bf16: model.onnx in BF16 (8 bits of mantissa, FP16 has 11)
        max_abs_diff=0.5,
        mean_abs_diff=0.05,
        min_cosine=0.999,
        min_top1_agreement=0.98,
        min_top5_overlap=0.9,
        min_recall_at_k=0.95,
    )


class TensorRTSection(StrictSection):
    workspace_mb: int = Field(4096, ge=16, description="TensorRT builder workspace limit (MiB)")
    optimization_level: int = Field(3, ge=0, le=5, description="TensorRT builder optimisation level (0-5)")
    timing_cache: Optional[Path] = Field(None, description="absent = <output_dir>/timing.cache")
