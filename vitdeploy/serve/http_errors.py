"""Errors -> HTTP statuses, in one place, and the one body every refusal carries: ``{"error": "<one line>"}``.

Errors are typed where the fault is found (:mod:`vitdeploy.base.errors`: a corrupt image in the runtime's
decoder, a body over the limit in the server...); this table alone chooses the status. The Ray Serve
replica (:mod:`.ray_app`) and the proxy's middleware (:mod:`.proxy_guard`) both answer through
:func:`error_body` / :func:`status_of`. No Ray, no FastAPI here.
"""

from __future__ import annotations

import json

from ..base.errors import (
    BodyTooLargeError,
    ImageTooLargeError,
    InputError,
    MethodNotAllowedError,
    NotFoundError,
    RequestTimeoutError,
    TooManyImagesError,
    UnauthorizedError,
    UnavailableError,
    UnsupportedMediaError,
    VitDeployError,
    first_line,
)

#: Most specific first: the first class the error is an instance of gives the status.
STATUSES: tuple[tuple[type[BaseException], int], ...] = (
    (ImageTooLargeError, 400),  # a decompression bomb is a bad image (Triton answers 400), not a large body
    (UnauthorizedError, 401),
    (NotFoundError, 404),
    (MethodNotAllowedError, 405),
    (RequestTimeoutError, 408),
    (BodyTooLargeError, 413),
    (TooManyImagesError, 413),
    (UnsupportedMediaError, 415),
    (UnavailableError, 503),
    (InputError, 400),
    (VitDeployError, 500),
)

MAX_REASON = 400  # characters of an HTTP error body's one line


def status_of(exc: BaseException) -> int:
    """The HTTP status of ``exc``: 4xx for a client's fault, 503 to retry, 500 for anything else."""
    for cls, status in STATUSES:
        if isinstance(exc, cls):
            return status
    return 500


def error_body(exc: BaseException | str) -> bytes:
    """``{"error": "<one line>"}`` as bytes; an unexpected error's text is not shown (no internals)."""
    if isinstance(exc, BaseException) and not isinstance(exc, VitDeployError):
        text = f"internal server error ({type(exc).__name__}); see the server's log"
    else:
        text = first_line(exc, MAX_REASON) or "request refused"
    return json.dumps({"error": text}).encode("utf-8")


__all__ = ["MAX_REASON", "STATUSES", "error_body", "status_of"]
