"""The words vitdeploy spells in more than one place, each defined once, as data.

Backend names (with the artifact files, precision and device each needs), artifact file names
and interpolation names live here; ``config.py``'s ``Literal`` types, the preprocessing contract,
the backend registry, the export stages and ``evaluate/`` import them. Standard library only, so
every layer may import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal, Mapping

# ------------------------------------------------------------------------------------------------
# preprocessing

PREPROCESS_STYLES: tuple[str, ...] = ("hf", "timm", "torchvision")
#: timm's crop modes: centre crop, squash (resize to the crop, aspect not kept), border (pad).
CROP_MODES: tuple[str, ...] = ("center", "squash", "border")
#: Pillow's resampling filters, by the lowercase names timm / transformers configs use.
INTERPOLATIONS: tuple[str, ...] = ("nearest", "bilinear", "bicubic", "lanczos", "box", "hamming")
PreprocessStyle = Literal[PREPROCESS_STYLES]  # type: ignore[valid-type]
Interpolation = Literal[INTERPOLATIONS]  # type: ignore[valid-type]
CropMode = Literal[CROP_MODES]  # type: ignore[valid-type]

#: the MLP activation of a ViT block: exact GELU (erf), its tanh approximation, or QuickGELU x * sigmoid(1.702 x)
#: (OpenAI CLIP's: transformers hidden_act "quick_gelu", timm act_layer "quick_gelu", open_clip quick_gelu).
ACTIVATIONS: tuple[str, ...] = ("gelu", "gelu_tanh", "quick_gelu")
Activation = Literal[ACTIVATIONS]  # type: ignore[valid-type]
#: the MLP of a ViT block: "gelu" fc1 -> GELU (``act``'s flavour) -> fc2; "swiglu" fc1 packs two halves,
#: SiLU(first) * second -> fc2 (DINOv2 giant: transformers use_swiglu_ffn, timm SwiGLUPacked).
MLPS: tuple[str, ...] = ("gelu", "swiglu")
MlpKind = Literal[MLPS]  # type: ignore[valid-type]
#: ViT poolings: the class token; the mean of the patch tokens (prefix tokens left out); or both side by side,
#: the class token then the mean patch token (transformers' DINOv2 classifiers: a head over 2 x width); or "map",
#: attention pooling over the patch tokens by a learned probe, then its norm and MLP (SigLIP: timm global_pool='map',
#: transformers' SiglipMultiheadAttentionPoolingHead).
POOLS: tuple[str, ...] = ("token", "avg", "token_avg", "map")
Pool = Literal[POOLS]  # type: ignore[valid-type]
#: how a ViT's learned position table follows an input of another size, as its library does it: "none" (the
#: input must be the model's image size), "bicubic" (transformers' ViT / DeiT with interpolate_pos_encoding,
#: DINOv2), "bicubic_antialias" (timm dynamic_img_size, transformers' DINOv2 with registers).
POS_RESAMPLES: tuple[str, ...] = ("none", "bicubic", "bicubic_antialias")
PosResample = Literal[POS_RESAMPLES]  # type: ignore[valid-type]
#: what an export's network returns: class logits (a classifier), or the pooled feature vector (an embedding
#: model: a backbone without a head, or any checkpoint with ``model.output: embedding``).
OUTPUT_KINDS: tuple[str, ...] = ("logits", "embedding")
OutputKind = Literal[OUTPUT_KINDS]  # type: ignore[valid-type]
#: how a classifier's logits become its scores (top-k, served TOPK_SCORES): "softmax" (one distribution over the
#: classes: a trained head, CLIP's zero-shot) or "sigmoid" (each class on its own: SigLIP's zero-shot)
SCORE_FUNCTIONS: tuple[str, ...] = ("softmax", "sigmoid")
ScoreFunction = Literal[SCORE_FUNCTIONS]  # type: ignore[valid-type]
#: the graph's output tensor (and the served KServe v2 output) of each kind
OUTPUT_TENSORS: Mapping[str, str] = MappingProxyType({"logits": "logits", "embedding": "EMBEDDINGS"})
#: an embedding export's second output when ``model.patch_tokens`` is on (graph and served KServe v2 output):
#: the final-normed tokens of the image patches, FP32 [batch, patches, width]; no class token, no registers
PATCH_TOKENS = "PATCH_TOKENS"
#: how batch-predict stores an embedding's values (Arrow/Parquet float32, or float16: half the bytes)
EMBEDDING_DTYPES: tuple[str, ...] = ("float32", "float16")
EmbeddingDtype = Literal[EMBEDDING_DTYPES]  # type: ignore[valid-type]

# ------------------------------------------------------------------------------------------------
# artifact files: what `vitdeploy export` writes, by manifest role

MANIFEST_NAME = "manifest.json"
DRIFT_REPORT_NAME = "drift-report.json"
TUNE_REPORT_NAME = "tune-report.json"  # `vitdeploy tune`'s trials, beside the export (the report's serving section)
#: `vitdeploy loadtest -a EXPORT`'s levels, beside the export (the report's serving section: where the time goes)
LOADTEST_REPORT_NAME = "loadtest-report.json"
EXPORT_REPORT_NAME = "export-report.json"  # what a failed export leaves (stages and validations so far)
TIMING_CACHE_NAME = "timing.cache"  # TensorRT's timing cache, reused across builds (tensorrt.timing_cache)
REPORT_NAME = "report.html"  # `vitdeploy report`'s page, beside the export
#: `vitdeploy bench -a`'s figures, beside the export (the report reads them; auto too, when taken on this machine)
BENCH_REPORT_NAME = "bench-report.json"
TRT_EP_CACHE = "ort-trt-cache"  # beside the export: ONNX Runtime's TensorRT EP engines and timing cache
#: `vitdeploy sign`'s signature of an export folder (an OpenSSF Model Signing / Sigstore bundle), beside it
SIGNATURE_NAME = "model.sig"
#: vitdeploy's own checkpoint format; an export directory is one (the torch backend reads it).
CHECKPOINT_WEIGHTS, CHECKPOINT_CONFIG = "model.safetensors", "model.json"
ARTIFACT_FILES: Mapping[str, str] = MappingProxyType(
    {
        "weights": CHECKPOINT_WEIGHTS,
        "weights-config": CHECKPOINT_CONFIG,
        "onnx": "model.onnx",
        "onnx-ort": "model.ort.onnx",  # ONNX Runtime-only fused FP32 graph (export/optimize.py)
        "onnx-fp16": "model.fp16.onnx",
        "onnx-int8": "model.int8.onnx",  # INT8 QDQ graph quantized from model.ort.onnx (export/quantize.py)
        # INT8 QDQ graph for TensorRT, quantized from model.onnx (export/quantize.py)
        "onnx-int8-trt": "model.int8.trt.onnx",
        "engine": "model.engine",
        "engine-meta": "model.engine.json",
        "engine-int8": "model.int8.engine",  # TensorRT INT8 engine built from model.int8.trt.onnx
        "engine-int8-meta": "model.int8.engine.json",
    }
)

#: What a server states about the export it runs (serve's v2 metadata and model configuration, the generated
#: Triton ensemble's config parameters; serve/protocol.py publishes them, `validate --url` reads them): the
#: sha256 of the export's manifest.json, and the backend whose answers it gives (a name of BACKENDS below).
EXPORT_SHA256 = "vitdeploy_export_sha256"
EXPORT_BACKEND = "vitdeploy_backend"
#: ... and, for an export for several sizes (export.image_sizes), the square sides it answers at ("28,42,56").
EXPORT_IMAGE_SIZES = "vitdeploy_image_sizes"
#: The request parameter that asks an export for several sizes for one of them: KServe v2 ``"parameters":
#: {"image_size": N}`` (HTTP JSON or binary, gRPC), ``POST /predict?image_size=N``, the Triton repository's.
IMAGE_SIZE_PARAM = "image_size"

#: The stages a request passes in a replica, in order (the ``Server-Timing`` header's metric names; what each
#: measures: serve/stage_timing.py), and the replica's whole time for it; `loadtest` and the report read them.
SERVER_STAGES: tuple[str, ...] = ("read", "decode", "queue", "model", "post")
SERVER_TOTAL = "total"

# ------------------------------------------------------------------------------------------------
# backends


@dataclass(frozen=True)
class BackendKind:
    """One backend a user can name, and what it needs."""

    name: str  # what users type: `predict -b`, `validate -b`, `bench -b`
    runs: str  # the runtime backend that runs it ("torch" for torch-fp16)
    roles: tuple[str, ...]  # the manifest artifact roles it reads, the main one first
    precision: str  # "fp32" | "fp16" | "int8" | "bf16": also the validation threshold set it is judged by
    device: str  # "any": the configured device; "cuda": needs a CUDA GPU; "cpu": the CPU, whatever is configured
    libraries: tuple[str, ...]  # the modules it imports
    #: roles it reads when the manifest lists them (ort: the fused model.ort.onnx, else model.onnx);
    #: whatever ships a folder for this backend (serve's replicas, batch workers) ships them too.
    optional_roles: tuple[str, ...] = ()
    #: the manifest's ``validation`` entry that must have passed for ``auto`` to choose it, when its artifact
    #: being listed is not its gate (openvino-bf16 runs model.onnx in another precision: ``validate-bf16``)
    gate: str | None = None


#: The backend names, each spelled once (imported wherever a backend is named in code).
TORCH, ORT, ORT_FP16, ORT_INT8, TORCH_FP16, TRT, TRT_INT8 = (
    "torch",
    "ort",
    "ort-fp16",
    "ort-int8",
    "torch-fp16",
    "trt",
    "trt-int8",
)
#: OpenVINO on the CPU (the ``openvino`` extra): model.onnx in FP32, model.int8.onnx, model.onnx in BF16.
OPENVINO, OPENVINO_INT8, OPENVINO_BF16 = ("openvino", "openvino-int8", "openvino-bf16")
#: The manifest's validation entry of openvino-bf16: model.onnx run in BF16 by OpenVINO, judged by validation.bf16
VALIDATE_BF16 = "validate-bf16"

#: Every backend, in report order (validate / bench tables).
BACKENDS: tuple[BackendKind, ...] = (
    BackendKind(TORCH, TORCH, ("weights", "weights-config"), "fp32", "any", ("torch", "safetensors")),
    BackendKind(ORT, ORT, ("onnx",), "fp32", "any", ("onnxruntime",), optional_roles=("onnx-ort",)),
    BackendKind(ORT_FP16, ORT_FP16, ("onnx-fp16",), "fp16", "any", ("onnxruntime",)),
    BackendKind(ORT_INT8, ORT_INT8, ("onnx-int8",), "int8", "any", ("onnxruntime",)),
    BackendKind(TORCH_FP16, TORCH, ("weights", "weights-config"), "fp16", "cuda", ("torch", "safetensors")),
    BackendKind(TRT, TRT, ("engine", "engine-meta"), "fp16", "cuda", ("tensorrt",)),
    BackendKind(TRT_INT8, TRT_INT8, ("engine-int8", "engine-int8-meta"), "int8", "cuda", ("tensorrt",)),
    BackendKind(OPENVINO, OPENVINO, ("onnx",), "fp32", "cpu", ("openvino",)),
    BackendKind(OPENVINO_INT8, OPENVINO_INT8, ("onnx-int8",), "int8", "cpu", ("openvino",)),
    BackendKind(OPENVINO_BF16, OPENVINO_BF16, ("onnx",), "bf16", "cpu", ("openvino",), gate=VALIDATE_BF16),
)
BACKEND_KINDS: Mapping[str, BackendKind] = MappingProxyType({kind.name: kind for kind in BACKENDS})
#: The backends ``validate`` and ``bench`` know ("torch-fp16" is the torch backend in half precision).
EVALUATED_BACKENDS: tuple[str, ...] = tuple(kind.name for kind in BACKENDS)
#: The runtime backends (one module each under runtime/backends/): what ``predict -b`` accepts.
RUNTIME_BACKENDS: tuple[str, ...] = tuple(kind.name for kind in BACKENDS if kind.runs == kind.name)
#: The threshold sets of ``validation`` (pipeline.yaml), one per precision a backend runs in.
PRECISIONS: tuple[str, ...] = ("fp32", "fp16", "int8", "bf16")
AUTO = "auto"
#: What ``auto`` measured on this machine (which backend is fastest here), beside the export: runtime/auto_choice.py
AUTO_CHOICE_NAME = "auto-backend.json"
BackendName = Literal[RUNTIME_BACKENDS]  # type: ignore[valid-type]
BackendChoice = Literal[(AUTO, *RUNTIME_BACKENDS)]  # type: ignore[valid-type]

#: TensorRT comes as one extra per CUDA major; the trt backend's buffers and streams come from torch,
#: whose CUDA major must be TensorRT's. PyPI's torch 2.13.0 (Linux) is a CUDA 13 build; a CUDA 12
#: build of the same version comes from PyTorch's own index. Per major: (torch to install, extra index
#: or None): the README's install lines and the mismatch check's fixing commands are built from this.
TENSORRT_TORCH: Mapping[int, tuple[str, str | None]] = MappingProxyType(
    {12: ("2.13.0+cu128", "https://download.pytorch.org/whl/cu128"), 13: ("2.13.0", None)}
)


def tensorrt_install_command(cuda_major: int) -> str:
    """The one command that installs TensorRT for CUDA ``cuda_major`` with a torch of the same major."""
    torch, index = TENSORRT_TORCH[cuda_major]
    if index is None:
        return f'pip install "vitdeploy[tensorrt-cu{cuda_major}]"'
    return f'pip install "vitdeploy[tensorrt-cu{cuda_major}]" "torch=={torch}" --extra-index-url {index}'


def torch_fix_command(cuda_major: int) -> str:
    """The one command that replaces the installed torch by the build TensorRT for CUDA ``cuda_major`` needs."""
    torch, index = TENSORRT_TORCH[cuda_major]
    if index is None:  # from PyPI; --force-reinstall because an installed 2.13.0+cu12x also satisfies ==2.13.0
        return f'pip install --force-reinstall "torch=={torch}" --index-url https://pypi.org/simple'
    return f'pip install "torch=={torch}" --extra-index-url {index}'


__all__ = [
    "ORT",
    "ORT_FP16",
    "ORT_INT8",
    "OPENVINO",
    "OPENVINO_BF16",
    "OPENVINO_INT8",
    "VALIDATE_BF16",
    "AUTO_CHOICE_NAME",
    "TORCH",
    "TORCH_FP16",
    "TRT",
    "TRT_INT8",
    "EXPORT_BACKEND",
    "EXPORT_IMAGE_SIZES",
    "EXPORT_REPORT_NAME",
    "EXPORT_SHA256",
    "IMAGE_SIZE_PARAM",
    "TIMING_CACHE_NAME",
    "REPORT_NAME",
    "BENCH_REPORT_NAME",
    "TRT_EP_CACHE",
    "SIGNATURE_NAME",
    "ACTIVATIONS",
    "Activation",
    "MLPS",
    "MlpKind",
    "POOLS",
    "Pool",
    "OUTPUT_KINDS",
    "OUTPUT_TENSORS",
    "SCORE_FUNCTIONS",
    "ScoreFunction",
    "PATCH_TOKENS",
    "EMBEDDING_DTYPES",
    "EmbeddingDtype",
    "OutputKind",
    "ARTIFACT_FILES",
    "AUTO",
    "BACKENDS",
    "BACKEND_KINDS",
    "BackendChoice",
    "BackendKind",
    "BackendName",
    "CHECKPOINT_CONFIG",
    "CHECKPOINT_WEIGHTS",
    "CROP_MODES",
    "CropMode",
    "DRIFT_REPORT_NAME",
    "TUNE_REPORT_NAME",
    "LOADTEST_REPORT_NAME",
    "SERVER_STAGES",
    "SERVER_TOTAL",
    "EVALUATED_BACKENDS",
    "INTERPOLATIONS",
    "Interpolation",
    "MANIFEST_NAME",
    "POS_RESAMPLES",
    "PRECISIONS",
    "PREPROCESS_STYLES",
    "PreprocessStyle",
    "RUNTIME_BACKENDS",
    "TENSORRT_TORCH",
    "tensorrt_install_command",
    "torch_fix_command",
]
