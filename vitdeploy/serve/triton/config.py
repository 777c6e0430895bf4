"""The ``config.pbtxt`` of each model in the generated Triton repository, as protobuf text.

Pure functions of a :class:`ModelFacts` (what the manifest says about the model) and the
``triton:`` settings; no Triton or protobuf import (tests parse the text into Triton's own
``ModelConfig``). Model names and the tensor names between the steps of the ensemble are
defined here, once.

    <name>              ensemble: IMAGES (bytes) -> LOGITS, TOPK_LABELS, TOPK_SCORES
    <name>_preprocess   python: IMAGES -> PIXEL_VALUES (the runtime's preprocessing)
    <name>_onnx         onnxruntime_onnx: <input> -> <output> over a validated graph: model.onnx (FP32, CUDA EP)
                        or model.fp16.onnx (TensorRT EP building the types it declares; engine cache)
    <name>_trt          tensorrt_plan: the same, from model.engine (only when one was built)
    <name>_ort_python   python + ONNX Runtime: the same, for Triton builds without the onnxruntime backend
    <name>_openvino     openvino: model.onnx on Triton's OpenVINO backend, on the CPU (only with --inference openvino)
    <name>_postprocess  python: LOGITS -> TOPK_LABELS, TOPK_SCORES (softmax + top-k of the runtime)

An embedding export (``ModelFacts.embedding``) has no postprocess model and no labels: the ensemble's one
output, EMBEDDINGS FP32 [-1, D], is the inference model's own (the graph's output has that name).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from ...base.serving_sections import TritonSection
from ...base.vocab import OPENVINO_BF16, ORT, ORT_FP16, TRT
from ..protocol import (
    CONFIG_TYPES,
    EMBEDDINGS,
    IMAGE_SIZE_PARAM,
    INPUT,
    LOGITS,
    PATCH_TOKENS,
    TOPK_LABELS,
    TOPK_SCORES,
    export_parameters,
    output_tensors,
)

#: Inference models the ensemble can call, by their suffix.
INFERENCE_KINDS = ("onnx", "trt", "ort_python", "openvino")
PIXELS = "PIXEL_VALUES"  # preprocess output, inside the ensemble
LABELS_FILE = "labels.txt"
ENGINE_FILE = "model.engine"
#: The _onnx model's graph per precision (Settings.onnx_precision) and the TensorRT EP's cache folder.
ONNX_FILES = {"fp32": "model.onnx", "fp16": "model.fp16.onnx"}
TRT_CACHE_DIR = "trt_cache"
#: the preprocessing model's parameter holding the export's recipe (PreprocessSpec as JSON): what it runs
PREPROCESS_PARAM = "preprocess"
#: ... and, for an export for several sizes, each listed size's recipe ({"336": PreprocessSpec as a dict, ...} as
#: JSON): a request's ``parameters.image_size`` picks one (protocol.IMAGE_SIZE_PARAM)
PREPROCESS_SIZES_PARAM = "preprocess_at_size"
#: Every model but the ensemble loads each version folder it has: a new export's version (`triton-repo
#: --new-version`) loads beside the live one while the ensemble still calls the live one; a version is
#: retired by removing its folder and loading the model again.
VERSION_POLICY = "version_policy: { all { } }"


@dataclass(frozen=True)
class ModelFacts:
    """What the manifest (and model.engine.json) says about the model."""

    name: str  # the served model name (protocol.model_name of the manifest's name)
    input_name: str
    output_name: str
    chw: tuple[int, int, int]
    num_classes: int  # values per output row: the classes, or an embedding's dimension
    batch: Mapping[str, int]  # {"min", "opt", "max"} of the export's batch profile
    engine_max_batch: int | None = None  # the TensorRT profile's max batch; None without an engine
    embedding: bool = False  # the manifest's output.kind is embedding: vectors out, no labels, no postprocess
    patch_shape: tuple[int, int] | None = None  # (P, D) of an embedding's PATCH_TOKENS output; None: not exported
    export_sha256: str = ""  # the sha256 of the export's manifest.json: published in the ensemble's parameters
    image_sizes: tuple[int, ...] = ()  # an export for several sizes (manifest image_sizes): height, width dynamic
    scores: str = "softmax"  # the manifest's output.scores: how the postprocess model turns logits into TOPK_SCORES

    @property
    def pixel_dims(self) -> tuple[int, ...]:
        """The inference model's input dims: C, H, W; H and W -1 for an export for several sizes."""
        return (self.chw[0], -1, -1) if self.image_sizes else self.chw

    @property
    def patch_dims(self) -> tuple[int, int] | None:
        """(P, D) of PATCH_TOKENS; P is -1 (the size's grid) for an export for several sizes."""
        if self.patch_shape is None:
            return None
        return (-1, self.patch_shape[1]) if self.image_sizes else self.patch_shape


@dataclass(frozen=True)
class Settings:
    """How the repository serves the model: pipeline.yaml's ``triton:`` section (CLI flags applied) and
    the values other sections decide."""

    triton: TritonSection = TritonSection()
    inference: str = "onnx"  # which INFERENCE_KINDS model the ensemble calls (resolved from triton.inference)
    onnx_precision: str = "fp32"  # the _onnx model's graph, a key of ONNX_FILES (resolved from triton.onnx_precision)
    top_k: int = 5  # serve.top_k
    max_image_pixels: int = 89_478_485  # runtime.max_image_pixels
    workspace_mb: int = 4096  # tensorrt.workspace_mb, for the TensorRT EP
    verify_key: Path | None = None  # runtime.verify.public_key: only an export that key signed is written out


def model_names(name: str) -> dict[str, str]:
    """Role -> model name in the repository."""
    return {
        "ensemble": name,
        "preprocess": f"{name}_preprocess",
        "postprocess": f"{name}_postprocess",
        **{kind: f"{name}_{kind}" for kind in INFERENCE_KINDS},
    }


# ------------------------------------------------------------------------------------------ text


def _q(value: Any) -> str:
    """A protobuf text-format string literal."""
    text = str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{text}"'


def _dims(dims: Iterable[int]) -> str:
    return "[ " + ", ".join(str(int(d)) for d in dims) + " ]"


def _tensor(name: str, dtype: str, dims: Iterable[int], extra: str = "") -> str:
    return f"  {{\n    name: {_q(name)}\n    data_type: {dtype}\n    dims: {_dims(dims)}{extra}\n  }}"


def _tensors(key: str, items: Sequence[str]) -> str:
    return f"{key} [\n" + ",\n".join(items) + "\n]"


def _parameters(params: Mapping[str, Any]) -> list[str]:
    return [f"parameters {{ key: {_q(k)} value: {{ string_value: {_q(v)} }} }}" for k, v in params.items()]


def _dynamic_batching(facts: ModelFacts, settings: Settings, max_batch: int, queue: bool) -> str:
    preferred = sorted({b for b in (facts.batch.get("opt", max_batch), max_batch) if 1 < b <= max_batch})
    lines = ["dynamic_batching {"]
    if preferred:
        lines.append(f"  preferred_batch_size: {_dims(preferred)}")
    lines.append(f"  max_queue_delay_microseconds: {int(settings.triton.max_queue_delay_us)}")
    if queue and settings.triton.max_queue_size > 0:
        # Requests beyond the queue are refused at once (HTTP 503 / gRPC UNAVAILABLE), never left to hang.
        lines.append(f"  default_queue_policy {{ max_queue_size: {int(settings.triton.max_queue_size)} }}")
    lines.append("}")
    return "\n".join(lines)


def _instance_group(kind: str, count: int, gpus: Sequence[int] = ()) -> str:
    body = [f"count: {int(count)}"]
    if kind == "gpu":
        body.append("kind: KIND_GPU")
        if gpus:
            body.append(f"gpus: {_dims(gpus)}")
    elif kind == "cpu":
        body.append("kind: KIND_CPU")
    # "auto": no kind: Triton places the instances on every available GPU, else on the CPU.
    return "instance_group [ { " + " ".join(body) + " } ]"


def _warmup(facts: ModelFacts, input_name: str, max_batch: int) -> str:
    """``model_warmup``: zero batches at 1, the profile's opt and max, run before the model is READY,
    so the first request never pays for an engine build or a first allocation."""
    sizes = sorted({b for b in (1, int(facts.batch.get("opt", 1)), max_batch) if 1 <= b <= max_batch})
    items = [
        f"  {{\n    name: {_q(f'zeros_batch_{b}')}\n    batch_size: {b}\n    inputs {{\n      key: {_q(input_name)}\n"
        f"      value: {{ data_type: TYPE_FP32 dims: {_dims(facts.chw)} zero_data: true }}\n    }}\n  }}"
        for b in sizes
    ]
    return "model_warmup [\n" + ",\n".join(items) + "\n]"


def _join(*blocks: str | None) -> str:
    return "\n".join(b for b in blocks if b) + "\n"


def _header(model: str, role: str) -> str:
    return f"# {model}: {role}. Generated by `vitdeploy triton-repo`; regenerate rather than edit."


# ------------------------------------------------------------------------------------------ models


def preprocess_config(
    facts: ModelFacts,
    settings: Settings,
    preprocess: Mapping[str, Any],
    version: str,
    at_size: Mapping[str, Any] | None = None,
) -> str:
    """``at_size``: each listed size's recipe, for an export for several sizes (manifest image_sizes.preprocess)."""
    names = model_names(facts.name)
    b = int(facts.batch["max"])
    sized = {PREPROCESS_SIZES_PARAM: json.dumps(dict(at_size), sort_keys=True)} if at_size else {}
    return _join(
        _header(names["preprocess"], "encoded images -> float32 NCHW, the runtime's preprocessing"),
        f"name: {_q(names['preprocess'])}",
        'backend: "python"',
        f"max_batch_size: {b}",
        VERSION_POLICY,
        _tensors("input", [_tensor(INPUT, "TYPE_STRING", [1])]),
        _tensors("output", [_tensor(PIXELS, "TYPE_FP32", facts.pixel_dims)]),
        _dynamic_batching(facts, settings, b, queue=True),
        _instance_group("cpu", settings.triton.preprocess_instances),
        *_parameters(
            {
                PREPROCESS_PARAM: json.dumps(dict(preprocess), sort_keys=True),
                **sized,
                "max_image_pixels": int(settings.max_image_pixels),
                "decode_threads": int(settings.triton.decode_threads),
                "vitdeploy_version": version,
            }
        ),
    )


def postprocess_config(facts: ModelFacts, settings: Settings, version: str) -> str:
    names = model_names(facts.name)
    b = int(facts.batch["max"])
    k = top_k_of(facts, settings)
    return _join(
        _header(names["postprocess"], f"logits -> the logits and the {facts.scores} top-k labels and scores"),
        f"name: {_q(names['postprocess'])}",
        'backend: "python"',
        f"max_batch_size: {b}",
        VERSION_POLICY,
        _tensors("input", [_tensor(LOGITS, "TYPE_FP32", [facts.num_classes])]),
        _tensors(
            "output",
            [
                _tensor(LOGITS, "TYPE_FP32", [facts.num_classes]),
                _tensor(TOPK_LABELS, "TYPE_STRING", [k]),
                _tensor(TOPK_SCORES, "TYPE_FP32", [k]),
            ],
        ),
        _dynamic_batching(facts, settings, b, queue=False),
        _instance_group("cpu", 1),
        *_parameters({"top_k": k, "labels_file": LABELS_FILE, "scores": facts.scores, "vitdeploy_version": version}),
    )


def _classifier(
    facts: ModelFacts,
    settings: Settings,
    role: str,
    what: str,
    runner: str,
    max_batch: int,
    group: str,
    *extra: str | None,
) -> str:
    """An inference model: the manifest's input -> logits (with labels.txt; an embedding: its vectors, no
    labels), dynamic batching."""
    name = model_names(facts.name)[role]
    label = "" if facts.embedding else f"\n    label_filename: {_q(LABELS_FILE)}"
    return _join(
        _header(name, what),
        f"name: {_q(name)}",
        runner,
        f"max_batch_size: {max_batch}",
        VERSION_POLICY,
        _tensors("input", [_tensor(facts.input_name, "TYPE_FP32", facts.pixel_dims)]),
        _tensors(
            "output", [_tensor(facts.output_name, "TYPE_FP32", [facts.num_classes], label), *_patch_tensor(facts)]
        ),
        _dynamic_batching(facts, settings, max_batch, queue=True),
        group,
        _warmup(facts, facts.input_name, max_batch),
        *extra,
    )


def _patch_tensor(facts: ModelFacts) -> list[str]:
    """The inference model's second output, PATCH_TOKENS FP32 [P, D], where the export has it."""
    return [_tensor(PATCH_TOKENS, "TYPE_FP32", facts.patch_dims)] if facts.patch_dims else []


def _profile_shapes(facts: ModelFacts, batch: int, side: int | None = None) -> str:
    """The TensorRT EP's profile shape at ``batch`` (and ``side``, of an export for several sizes; None: the base)."""
    c, h, w = facts.chw
    return f"{facts.input_name}:{batch}x{c}x{side or h}x{side or w}"


def onnx_config(facts: ModelFacts, settings: Settings) -> str:
    """``<name>_onnx`` over the graph the export validated for ``settings.onnx_precision``: FP32
    ``model.onnx`` on ONNX Runtime's default GPU provider (CUDA EP; CPU EP on a CPU), or
    ``model.fp16.onnx`` (FP16 inside, its keep-float nodes float32) on the TensorRT EP with
    ``precision_mode`` FP32, i.e. without TensorRT's FP16 flag: TensorRT builds the types the graph
    declares and never re-casts the float32 nodes. Engines are cached under the model's folder."""
    if settings.onnx_precision not in ONNX_FILES:
        raise ValueError(f"onnx_precision must be one of {tuple(ONNX_FILES)}, got {settings.onnx_precision!r}")
    b = int(facts.batch["max"])
    name = model_names(facts.name)["onnx"]
    accel = None
    if settings.onnx_precision == "fp16":
        params = {
            "precision_mode": "FP32",  # no FP16 flag: the FP16 graph already says which nodes are FP16
            "max_workspace_size_bytes": str(int(settings.workspace_mb) * (1 << 20)),
            "trt_engine_cache_enable": "1",
            "trt_engine_cache_path": f"{settings.triton.repository_mount.rstrip('/')}/{name}/{TRT_CACHE_DIR}",
            # One engine for the whole batch range, built once (and cached) instead of per new shape.
            "trt_profile_min_shapes": _profile_shapes(
                facts, int(facts.batch["min"]), min(facts.image_sizes, default=0)
            ),
            "trt_profile_opt_shapes": _profile_shapes(facts, int(facts.batch["opt"])),
            "trt_profile_max_shapes": _profile_shapes(facts, b, max(facts.image_sizes, default=0)),
        }
        body = "\n".join(f"        parameters {{ key: {_q(k)} value: {_q(v)} }}" for k, v in params.items())
        accel = (
            "# On a GPU, ONNX Runtime's TensorRT EP builds model.fp16.onnx as validated (FP16 where the graph is\n"
            "# FP16, float32 on its keep-float nodes) and caches its engine beside this file (ignored on a CPU).\n"
            "optimization {\n  execution_accelerators {\n    gpu_execution_accelerator: [\n      {\n"
            f'        name: "tensorrt"\n{body}\n      }}\n    ]\n  }}\n}}'
        )
    t = settings.triton
    what = (
        "model.fp16.onnx (validated FP16 graph) on ONNX Runtime"
        if settings.onnx_precision == "fp16"
        else "model.onnx (FP32) on ONNX Runtime"
    )
    return _classifier(
        facts,
        settings,
        "onnx",
        what,
        f'platform: "onnxruntime_onnx"\ndefault_model_filename: {_q(ONNX_FILES[settings.onnx_precision])}',
        b,
        _instance_group(t.kind, t.instances, t.gpus),
        accel,
    )


def trt_config(facts: ModelFacts, settings: Settings) -> str:
    if facts.engine_max_batch is None:
        raise ValueError("trt_config needs an engine (ModelFacts.engine_max_batch)")
    t = settings.triton
    return _classifier(
        facts,
        settings,
        "trt",
        "the FP16 TensorRT engine built by `vitdeploy export`",
        f'platform: "tensorrt_plan"\ndefault_model_filename: {_q(ENGINE_FILE)}',
        min(int(facts.batch["max"]), int(facts.engine_max_batch)),
        _instance_group("gpu", t.instances, t.gpus),
    )


def ort_python_config(facts: ModelFacts, settings: Settings, version: str) -> str:
    params: dict[str, Any] = {"vitdeploy_version": version}
    if settings.triton.ort_threads:
        params["threads"] = int(settings.triton.ort_threads)
    return _classifier(
        facts,
        settings,
        "ort_python",
        "the vitdeploy runtime's ONNX Runtime backend inside the python backend",
        'backend: "python"',
        int(facts.batch["max"]),
        _instance_group("cpu", settings.triton.instances),
        *_parameters(params),
    )


def openvino_config(facts: ModelFacts, settings: Settings) -> str:
    """``<name>_openvino``: model.onnx on Triton's OpenVINO backend, on the CPU (latency hint, one stream an
    instance). Its precision is OpenVINO's: f32 on a CPU without BF16 math, bf16 on one with it (AVX512-BF16,
    AMX): Triton's backend can ask for bf16 (HINT_BF16), never for f32, and OpenVINO's default there is bf16."""
    t = settings.triton
    return _classifier(
        facts,
        settings,
        "openvino",
        "model.onnx on OpenVINO (CPU; f32, or bf16 where the CPU has BF16 math)",
        f'backend: "openvino"\ndefault_model_filename: {_q(ONNX_FILES["fp32"])}',
        int(facts.batch["max"]),
        _instance_group("cpu", t.instances),
        *_parameters({"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": "1"}),
    )


def served_backend(settings: Settings) -> str:
    """The vocabulary's backend whose answers the ensemble gives (whose ``validation.*`` thresholds judge them):
    ``_onnx`` over model.onnx is ort, over model.fp16.onnx ort-fp16; ``_trt`` trt; ``_ort_python`` ort;
    ``_openvino`` openvino-bf16 (BF16 on a CPU that has it; its thresholds hold for f32 elsewhere too)."""
    if settings.inference == "openvino":
        return OPENVINO_BF16
    if settings.inference == "trt":
        return TRT
    if settings.inference == "onnx" and settings.onnx_precision == "fp16":
        return ORT_FP16
    return ORT


def top_k_of(facts: ModelFacts, settings: Settings) -> int:
    return max(1, min(int(settings.top_k), int(facts.num_classes)))


def ensemble_max_batch(facts: ModelFacts, settings: Settings) -> int:
    b = int(facts.batch["max"])
    if settings.inference == "trt" and facts.engine_max_batch is not None:
        b = min(b, int(facts.engine_max_batch))
    return b


def _ensemble_steps(facts: ModelFacts, settings: Settings, version: int) -> list[str]:
    """The steps, each pinned to ``version`` of its model: a new version loads beside the live one while
    the ensemble still calls the live one, and the ensemble's own reload switches every step at once."""
    names = model_names(facts.name)

    def step(model: str, inputs: Mapping[str, str], outputs: Mapping[str, str]) -> str:
        maps = [f"      input_map {{ key: {_q(a)} value: {_q(b)} }}" for a, b in inputs.items()]
        maps += [f"      output_map {{ key: {_q(a)} value: {_q(b)} }}" for a, b in outputs.items()]
        return (
            "    {\n"
            + f"      model_name: {_q(model)}\n      model_version: {int(version)}\n"
            + "\n".join(maps)
            + "\n    }"
        )

    pre = step(names["preprocess"], {INPUT: INPUT}, {PIXELS: "pixel_values"})
    if facts.embedding:  # the inference model's outputs are the ensemble's: nothing to post-process
        outputs = {facts.output_name: EMBEDDINGS, **({PATCH_TOKENS: PATCH_TOKENS} if facts.patch_shape else {})}
        return [pre, step(names[settings.inference], {facts.input_name: "pixel_values"}, outputs)]
    # Every ensemble output comes from the last step (postprocess passes the logits through): an ensemble
    # output that another step also reads made Triton answer 400 "unexpected deadlock, at least one output
    # is not set" to every request naming a subset of the outputs (TOPK_LABELS alone, say).
    return [
        pre,
        step(names[settings.inference], {facts.input_name: "pixel_values"}, {facts.output_name: "logits"}),
        step(
            names["postprocess"],
            {LOGITS: "logits"},
            {LOGITS: LOGITS, TOPK_LABELS: TOPK_LABELS, TOPK_SCORES: TOPK_SCORES},
        ),
    ]


def ensemble_config(facts: ModelFacts, settings: Settings, version: int = 1) -> str:
    """The ensemble over ``version`` of each step (the version folder the export was written to)."""
    if settings.inference not in INFERENCE_KINDS:
        raise ValueError(f"inference must be one of {INFERENCE_KINDS}, got {settings.inference!r}")
    names = model_names(facts.name)
    k = top_k_of(facts, settings)
    what = f"{EMBEDDINGS} [{facts.num_classes}]" if facts.embedding else f"logits and top-{k}"
    if facts.patch_dims:
        what += f" and {PATCH_TOKENS} [{', '.join(map(str, facts.patch_dims))}]"
    if facts.image_sizes:
        what += f" at {', '.join(map(str, facts.image_sizes))} px (parameters.{IMAGE_SIZE_PARAM})"
    outputs = output_tensors(facts.num_classes, k, facts.embedding, facts.patch_dims)
    return _join(
        _header(names["ensemble"], f"bytes in -> {what} out, over {names[settings.inference]}"),
        f"name: {_q(names['ensemble'])}",
        'platform: "ensemble"',
        f"max_batch_size: {ensemble_max_batch(facts, settings)}",
        _tensors("input", [_tensor(INPUT, "TYPE_STRING", [1])]),
        _tensors("output", [_tensor(name, CONFIG_TYPES[dtype], dims) for name, dtype, dims in outputs]),
        "ensemble_scheduling {\n  step [\n" + ",\n".join(_ensemble_steps(facts, settings, version)) + "\n  ]\n}",
        # which export the ensemble answers with, on which backend (protocol.EXPORT_SHA256: validate --url)
        *_parameters(
            export_parameters(facts.export_sha256, served_backend(settings), facts.image_sizes)
            if facts.export_sha256
            else {}
        ),
    )


__all__ = [
    "ENGINE_FILE",
    "INFERENCE_KINDS",
    "LABELS_FILE",
    "ONNX_FILES",
    "TRT_CACHE_DIR",
    "VERSION_POLICY",
    "PIXELS",
    "PREPROCESS_PARAM",
    "PREPROCESS_SIZES_PARAM",
    "ModelFacts",
    "Settings",
    "ensemble_config",
    "ensemble_max_batch",
    "model_names",
    "onnx_config",
    "openvino_config",
    "ort_python_config",
    "postprocess_config",
    "preprocess_config",
    "served_backend",
    "top_k_of",
    "trt_config",
]
