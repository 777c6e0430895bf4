"""One error hierarchy. Every message says what failed, which file or key, expected vs actual,
and how to fix it. The CLI maps each class to one line on stderr and an exit code."""

from __future__ import annotations


def first_line(value: BaseException | str, limit: int | None = None) -> str:
    """The first non-empty line of an error's message (or of ``str(value)``), cut to ``limit``
    characters when given: the one helper behind every one-line report (the CLI's ``error:`` line,
    an HTTP error body, a stage's reason). An exception with an empty message gives its type name."""
    text = next((line.strip() for line in str(value).splitlines() if line.strip()), "")
    if not text and isinstance(value, BaseException):
        text = type(value).__name__
    if limit is not None and len(text) > limit:
        text = text[: limit - 1] + "…"
    return text


def remote_reason(value: BaseException | str) -> str:
    """The one line that says why remote work failed (a Serve replica, a Ray task): Ray's message, or error,
    carries the remote traceback, whose line naming our error type (else the line of an ``Error: ``, else its
    last line) says why."""
    text = str(value)
    for marker in ("vitdeploy.base.errors.", "Error: "):
        for line in text.splitlines():
            if marker in line:
                return line.strip()
    if text.strip():
        return text.strip().splitlines()[-1]
    return type(value).__name__ if isinstance(value, BaseException) else "no reason given"


class VitDeployError(Exception):
    """Base of every error vitdeploy raises on purpose."""

    exit_code = 1


class ConfigError(VitDeployError):
    """pipeline.yaml (or an argument) is invalid."""

    exit_code = 2


class CheckpointError(VitDeployError):
    """A checkpoint cannot be read, recognised or loaded strictly."""

    exit_code = 2


class HubError(CheckpointError):
    """A checkpoint named on the Hugging Face Hub cannot be had: no such repo (or no access), a revision that
    does not exist, offline and not cached, no weights vitdeploy reads, a download cut off. One line naming the
    repo and what to do; never the token."""


class InputError(VitDeployError):
    """An input (image, array, path) given by the user cannot be used."""

    exit_code = 2


class ExportError(VitDeployError):
    """An export stage failed."""

    exit_code = 1


class StageUnavailableError(ExportError):
    """A requested export stage cannot pay off on this machine (INT8 no faster than its source)."""

    exit_code = 4


class RefusedStagesError(VitDeployError):
    """The export was written, without what explicitly requested stages could not deliver.

    ``refusals`` holds each refused stage's error; the exit code is the first one's (3 a validation
    gate not met, 4 a stage unavailable here, 1 a stage that failed), as for the same fault elsewhere."""

    def __init__(self, message: str, refusals: "list[VitDeployError]", result: object = None) -> None:
        super().__init__(message)
        self.refusals = list(refusals)
        self.result = result  # what was written (export.pipeline.ExportResult), for the CLI to list

    @property
    def exit_code(self) -> int:  # type: ignore[override]
        return self.refusals[0].exit_code if self.refusals else 1


class WriteError(VitDeployError):
    """A file could not be written for a reason of the machine, not of the input: the disk is full, the
    file is over the size limit, the file system is read-only. Names the file and the cause."""

    exit_code = 1
    #: the errnos that are the disk's fault (ENOSPC, EFBIG, EDQUOT, EROFS, EIO)
    ERRNOS = frozenset({28, 27, 122, 30, 5})

    @classmethod
    def from_os(cls, exc: OSError, path: object = None) -> "WriteError":
        """``cannot write <file>: <cause>`` from an OSError (``path`` when the error names no file)."""
        where = path if path is not None else (exc.filename or "a file")
        return cls(f"cannot write {where}: {exc.strerror or exc}")


class ValidationError(VitDeployError):
    """An artifact's output drifted beyond the thresholds."""

    exit_code = 3


class OtherExportError(ValidationError):
    """A server says it runs another export than the one named (`validate --url`): its answers are not
    certified."""


class ServerUnreachableError(VitDeployError):
    """A server named by URL does not answer (refused, reset, timed out, no such host)."""

    exit_code = 4


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


class SignatureError(ArtifactIntegrityError):
    """An export refused by its signature, when one was asked for (``runtime.verify``, ``--verify-key``): unsigned
    (no model.sig), signed by another key, or a file the signature covers changed or gone since it was signed.
    One line naming the file; exit 2; a server does not start."""


class ArtifactMismatchError(ArtifactError):
    """An intact artifact that this machine cannot run: a TensorRT engine built for another
    TensorRT version or GPU. The one artifact fault that lets backend "auto" try the next backend;
    every other ArtifactError stops it."""


# ------------------------------------------------------------------ inputs, typed where the fault is found
# Each class names one fault; `vitdeploy serve` maps each to an HTTP status in one table
# (vitdeploy/serve/http_errors.py), the CLI to exit code 2 (InputError). ``kind`` is a stable
# short name for logs and clients.


class RequestError(InputError):
    """An input refused: a served request, or an image (its subclasses). ``str(error)`` is one line
    for a server's ``{"error": ...}`` body."""

    kind = "bad_request"


class ImageError(RequestError):
    """Encoded image bytes cannot be decoded (truncated or corrupt)."""

    kind = "corrupt"


class EmptyImageError(ImageError):
    """The image holds no bytes."""

    kind = "empty"


class NotAnImageError(ImageError):
    """The bytes are not in any supported image format."""

    kind = "not_image"


class ImageTooLargeError(ImageError):
    """The image's header claims more pixels than allowed (refused before decoding)."""

    kind = "too_large"


class EmptyRequestError(RequestError):
    """A request that holds no image at all."""

    kind = "empty"


class TooManyImagesError(RequestError):
    kind = "too_many"


class BatchTooLargeError(RequestError):
    """More images in one v2 inference request than the model's max batch: 400, as Triton answers
    ("batch-size must be <= N"); POST /predict says 413 (TooManyImagesError) for the same count."""

    kind = "too_many"


class BodyTooLargeError(RequestError):
    """More bytes were sent (declared or actually read) than the server accepts."""

    kind = "body_too_large"


class UnsupportedMediaError(RequestError):
    """A content type or content encoding the route does not accept."""

    kind = "content_type"


class NotFoundError(RequestError):
    """An unknown route, model or model version."""

    kind = "not_found"


class MethodNotAllowedError(RequestError):
    kind = "method"


class RequestTimeoutError(RequestError):
    """The client did not send its body within the deadline (slow or stalled upload)."""

    kind = "timeout"


class UnauthorizedError(RequestError):
    """A model route called without the serve token, or with another one (serve/auth.py)."""

    kind = "unauthorized"


class UnavailableError(RequestError):
    """The model cannot take the request now (queue full, starting, draining): retry later."""

    kind = "unavailable"
