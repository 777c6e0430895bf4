"""One error hierarchy. Every message says what failed, which file or key, expected vs actual,
and how to fix it. The CLI maps each class to one line on stderr and an exit code."""

from __future__ import annotations


class VitDeployError(Exception):
    """Base of every error vitdeploy raises on purpose."""

    exit_code = 1


class ConfigError(VitDeployError):
    """pipeline.yaml (or an argument) is invalid."""

    exit_code = 2


class CheckpointError(VitDeployError):
    """A checkpoint cannot be read, recognised or loaded strictly."""

    exit_code = 2


class InputError(VitDeployError):
    """An input (image, array, path) given by the user cannot be used."""

    exit_code = 2


class ExportError(VitDeployError):
    """An export stage failed."""

    exit_code = 1


class ValidationError(VitDeployError):
    """An artifact's output drifted beyond the thresholds."""

    exit_code = 3


class MissingDependencyError(VitDeployError):
    """An optional dependency (onnxruntime, tensorrt, torch, CUDA) is not available."""

    exit_code = 4


class BackendError(VitDeployError):
    """A runtime backend cannot be opened or run."""

    exit_code = 1


class ArtifactError(VitDeployError):
    """An artifact or the manifest is missing, tampered with or does not match this machine."""

    exit_code = 2


class ArtifactIntegrityError(ArtifactError):
    """A listed artifact fails its sha256 or size, contradicts the manifest (another class count,
    input size or tensor name), or points outside its folder (a path or ONNX external data via '..'
    or a symlink). The whole directory is refused: a tampered export is a security event, never a
    reason to fall back to another backend."""


class ArtifactMismatchError(ArtifactError):
    """An intact artifact that this machine cannot run: a TensorRT engine built for another
    TensorRT version or GPU. The one artifact fault that lets backend "auto" try the next backend;
    every other ArtifactError stops it."""
