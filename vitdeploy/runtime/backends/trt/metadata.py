"""model.engine.json and this machine: was an engine built for this TensorRT, this GPU and this graph?

A serialized TensorRT engine only runs with the TensorRT version it was built with and on GPUs of
the compute capability it was built for; the trt backend and the export's engine stage read and
check the metadata written beside the engine here.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ....base.errors import ArtifactError, ArtifactMismatchError
from ...cuda import gpu_identity

log = logging.getLogger("vitdeploy.runtime.backends.trt")  # messages belong to the trt backend

_UNKNOWN = "unknown"

# --------------------------------------------------------------------------------------------
# model.engine.json


@dataclass(frozen=True)
class EngineMetadata:
    """Contents of model.engine.json: what the engine was built from, with what, and where."""

    tensorrt_version: str
    gpu_name: str
    compute_capability: str
    profile: dict[str, int]  # {"min", "opt", "max"} batch sizes of the optimisation profile
    input: str
    chw: tuple[int, int, int]
    precision: str
    onnx_sha256: str
    workspace_mb: int
    optimization_level: int
    built: str  # ISO 8601

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["chw"] = list(self.chw)
        data["profile"] = {k: int(self.profile[k]) for k in ("min", "opt", "max")}
        return data

    @classmethod
    def from_dict(cls, data: Any, source: str = "model.engine.json") -> "EngineMetadata":
        """Parse and check ``data``; ArtifactError naming ``source`` and the key otherwise."""
        if not isinstance(data, dict):
            raise ArtifactError(
                f"{source}: expected a JSON object, got {type(data).__name__}; rebuild the engine with `vitdeploy "
                "export`"
            )
        missing = [f for f in cls.__dataclass_fields__ if f not in data]
        if missing:
            raise ArtifactError(
                f"{source}: missing key(s) {missing}; it was not written by this vitdeploy version: rebuild the "
                "engine with `vitdeploy export`"
            )

        def bad(key: str, expected: str) -> ArtifactError:
            return ArtifactError(
                f"{source}: key '{key}' must be {expected}, got {data[key]!r}; rebuild the engine with `vitdeploy "
                "export`"
            )

        for key in (
            "tensorrt_version",
            "gpu_name",
            "compute_capability",
            "input",
            "precision",
            "onnx_sha256",
            "built",
        ):
            if not isinstance(data[key], str) or not data[key]:
                raise bad(key, "a non-empty string")
        for key in ("workspace_mb", "optimization_level"):
            if not isinstance(data[key], int) or isinstance(data[key], bool):
                raise bad(key, "an integer")
        chw = data["chw"]
        if (
            not isinstance(chw, list)
            or len(chw) != 3
            or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in chw)
        ):
            raise bad("chw", "a list of 3 positive integers [C, H, W]")
        batches = data["profile"]
        if (
            not isinstance(batches, dict)
            or set(batches) != {"min", "opt", "max"}
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in batches.values())
        ):
            raise bad("profile", 'an object {"min": int, "opt": int, "max": int}')
        if not 1 <= batches["min"] <= batches["opt"] <= batches["max"]:
            raise bad("profile", "batch sizes with 1 <= min <= opt <= max")
        values = {k: data[k] for k in cls.__dataclass_fields__}
        values["chw"] = tuple(chw)
        values["profile"] = dict(batches)
        return cls(**values)

    @classmethod
    def load(cls, path: str | Path) -> "EngineMetadata":
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ArtifactError(
                f"{path} is missing: the TensorRT engine cannot be checked against this machine without it; rebuild "
                "the engine with `vitdeploy export`"
            ) from None
        except OSError as exc:
            raise ArtifactError(f"cannot read {path}: {exc}") from exc
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ArtifactError(
                f"{path} is not valid JSON ({exc}); rebuild the engine with `vitdeploy export`"
            ) from exc
        return cls.from_dict(data, source=str(path))

    @property
    def target(self) -> MachineIdentity:
        """The TensorRT version and GPU the engine was built for."""
        return MachineIdentity(self.tensorrt_version, self.gpu_name, self.compute_capability)


@dataclass(frozen=True)
class MachineIdentity:
    """The facts of a machine an engine must match (this one, or the one it was built on)."""

    tensorrt_version: str
    gpu_name: str
    compute_capability: str

    def describe(self) -> str:
        return f"TensorRT {self.tensorrt_version} on {self.gpu_name} (compute capability {self.compute_capability})"


def probe_machine(trt: Any, device: str | int | None = None) -> MachineIdentity:
    """TensorRT version (``trt.__version__``) and the GPU at ``device``; MissingDependencyError without CUDA."""
    gpu = gpu_identity(device)
    return MachineIdentity(str(trt.__version__), gpu.name, gpu.compute_capability)


def check_engine_matches(meta: EngineMetadata, here: MachineIdentity, engine_path: str | Path) -> None:
    """ArtifactError unless ``meta`` was built with this TensorRT version for this compute capability.

    The TensorRT version must match exactly (engines are not portable across versions) and so must
    the compute capability; a different GPU model name with the same compute capability (e.g.
    H100 SXM vs H100 PCIe) is accepted with a warning.
    """
    built = meta.target
    differs = []
    for key in ("tensorrt_version", "compute_capability"):
        then, now = getattr(built, key), getattr(here, key)
        if then == _UNKNOWN:
            log.warning(
                "%s.json does not record %s; cannot check the engine against this machine's %s", engine_path, key, now
            )
        elif then != now:
            differs.append(key)
    if differs:
        raise ArtifactMismatchError(
            f"{engine_path} was built for {built.describe()}, but this machine has {here.describe()} "
            f"(differs in {', '.join(differs)}). A TensorRT engine only runs with the TensorRT version and GPU "
            "compute capability it was built for: rebuild it with `vitdeploy export` on this machine "
            "(or use the 'ort' / 'ort-fp16' backend)."
        )
    if built.gpu_name not in (_UNKNOWN, here.gpu_name):
        log.warning(
            "%s was built on %s and runs here on %s (same compute capability %s): TensorRT accepts it but it "
            "may run slower than an engine built here; rebuild with `vitdeploy export` on this machine for best speed",
            engine_path,
            built.gpu_name,
            here.gpu_name,
            here.compute_capability,
        )


def check_engine_source(
    meta: EngineMetadata, onnx_sha256: str | None, engine_path: str | Path, onnx_what: str
) -> None:
    """ArtifactError unless the engine was built from the ONNX graph with sha256 ``onnx_sha256``.

    ``onnx_sha256`` None (not known, e.g. no manifest yet) skips the check.
    """
    if not onnx_sha256:
        return
    if meta.onnx_sha256 == _UNKNOWN:
        log.warning(
            "%s.json does not record the ONNX graph it was built from; cannot check it against %s",
            engine_path,
            onnx_what,
        )
        return
    if meta.onnx_sha256.lower() != str(onnx_sha256).lower():
        raise ArtifactError(
            f"{engine_path} was built from an ONNX graph with sha256 {meta.onnx_sha256} (its .json), but {onnx_what} "
            f"has sha256 {onnx_sha256}: the engine was built from another graph and would not compute this model. "
            "Rebuild it with `vitdeploy export` (or use the 'ort' / 'ort-fp16' backend)."
        )
