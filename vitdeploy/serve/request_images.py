"""A request's images as a replica reads them: the body within ``serve.max_request_mb`` (inflated per
Content-Encoding, the limit applied to the bytes read and to the inflated bytes), then one encoded image (the body
itself) or one per file of a multipart form.

Every refusal is a typed RequestError with one line (415 for another content type, 413 beyond the byte limit or
``serve.max_images_per_request`` files); a client that went away mid-upload is :class:`ClientGone` (nothing to
answer). Used by the deployment's routes (ray_app.py); imports Starlette (FastAPI's) when called.
"""

from __future__ import annotations

from typing import Any

from ..base.errors import BodyTooLargeError, EmptyRequestError, RequestError, TooManyImagesError, UnsupportedMediaError
from . import content_encoding, protocol

#: content types sent as one encoded image (the body itself)
RAW_TYPES = ("image/", "application/octet-stream")


class ClientGone(Exception):
    """The client disconnected before its body arrived: nothing to answer, nothing worth a traceback."""


def _replayed(request: Any, body: bytes) -> Any:
    """``request`` whose body is ``body`` (already read and size-checked), for Starlette's form parser."""
    from starlette.requests import Request

    sent = False

    async def receive() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return {"type": "http.disconnect"}

    return Request(request.scope, receive)


def _check_length(request: Any, limit: int) -> None:
    """413 when the declared Content-Length is over ``limit`` (serve.max_request_mb)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise BodyTooLargeError(
            f"request body of {int(declared)} bytes is over the limit of {limit} bytes (serve.max_request_mb)"
        )


async def body_of(request: Any, limit: int) -> bytes:
    """The body, inflated per Content-Encoding (gzip / deflate, as Triton accepts them), the byte limit
    applied to the bytes actually read and to the inflated bytes (the proxy's guard has usually read it)."""
    from starlette.requests import ClientDisconnect

    _check_length(request, limit)
    try:
        return await content_encoding.read_body(request.stream(), request.headers.get("content-encoding"), limit)
    except ClientDisconnect:
        raise ClientGone() from None


async def images_of(request: Any, max_bytes: int, max_images: int) -> list[tuple[str, bytes]]:
    """(name, encoded bytes) of each image ``POST /predict`` sent: the body itself (``"body"``), or each file of a
    multipart form (its filename)."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype == "multipart/form-data":
        return await _multipart(request, max_bytes, max_images)
    if ctype and not ctype.startswith(RAW_TYPES):
        raise UnsupportedMediaError(
            f"content type {ctype!r} is not accepted; send the image itself (Content-Type: image/jpeg, image/png, "
            f"application/octet-stream) or multipart/form-data with one file per image"
        )
    body = await body_of(request, max_bytes)
    if not body:
        raise EmptyRequestError("empty request body; send an encoded image (JPEG, PNG, ...)")
    return [("body", body)]


async def _multipart(request: Any, max_bytes: int, limit: int) -> list[tuple[str, bytes]]:
    from starlette.datastructures import UploadFile
    from starlette.exceptions import HTTPException

    body = await body_of(request, max_bytes)  # the bytes actually read are capped before the form is parsed
    try:
        form = await _replayed(request, body).form(max_files=limit + 1, max_fields=limit + 1)
    except HTTPException as exc:
        if "too many" in str(exc.detail).lower():
            raise TooManyImagesError(
                f"too many files in one request, the limit is {limit}; split the request"
            ) from None
        raise RequestError(f"malformed multipart body: {exc.detail}") from None
    try:
        files = [(v.filename or k, v) for k, v in form.multi_items() if isinstance(v, UploadFile)]
        protocol.check_image_count(len(files), limit)
        return [(name, await f.read()) for name, f in files]
    finally:
        await form.close()


__all__ = ["RAW_TYPES", "ClientGone", "body_of", "images_of"]
