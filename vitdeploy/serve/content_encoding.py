"""Compressed request bodies (``Content-Encoding: gzip`` / ``deflate``), as Triton accepts them.

``tritonclient`` compresses a request with ``request_compression_algorithm="gzip"`` (gzip format)
or ``"deflate"`` (zlib format; a raw deflate stream is accepted too). The body is inflated while it
streams in, and the server's byte limit (``serve.max_request_mb``) applies to the body on the wire
*and* to the inflated bytes: a small "zip bomb" is refused with 413 as soon as the inflated size
passes the limit, never inflated in full. Standard library only.
"""

from __future__ import annotations

import zlib
from typing import AsyncIterator

from ..base.errors import BodyTooLargeError, RequestError, UnsupportedMediaError

#: Content-Encoding -> zlib window bits: 16+ for the gzip wrapper, 32+ auto-detects zlib or gzip.
ENCODINGS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": 32 + zlib.MAX_WBITS}
IDENTITY = ("", "identity")


def _too_large(limit: int, what: str) -> BodyTooLargeError:
    return BodyTooLargeError(f"request body is over the limit of {limit} bytes {what}(serve.max_request_mb)")


def check_encoding(encoding: str | None) -> str:
    """The lower-case encoding; RequestError 415 for one this server cannot inflate."""
    enc = (encoding or "").strip().lower()
    if enc in IDENTITY or enc in ENCODINGS:
        return enc
    raise UnsupportedMediaError(
        f"Content-Encoding {encoding!r} is not accepted; send the body uncompressed, gzip or deflate"
    )


class _Inflater:
    def __init__(self, encoding: str, limit: int) -> None:
        self.encoding, self.limit = encoding, limit
        self.wbits = ENCODINGS[encoding]
        self.d = zlib.decompressobj(self.wbits)
        self.parts: list[bytes] = []
        self.size = 0
        self.raw_tried = False

    def feed(self, data: bytes) -> None:
        while data:
            try:
                out = self.d.decompress(data, self.limit + 1 - self.size)
            except zlib.error as exc:
                if self.encoding == "deflate" and not self.raw_tried and self.size == 0:
                    self.raw_tried = True  # "deflate" as a raw stream (no zlib header), as some clients send it
                    self.d = zlib.decompressobj(-zlib.MAX_WBITS)
                    continue
                raise RequestError(f"the {self.encoding} request body is corrupt ({exc})") from None
            self.parts.append(out)
            self.size += len(out)
            if self.size > self.limit:
                raise _too_large(self.limit, "once inflated ")
            data = self.d.unconsumed_tail
            if self.d.eof:
                break

    def finish(self) -> bytes:
        if not self.d.eof:
            raise RequestError(f"the {self.encoding} request body is truncated")
        return b"".join(self.parts)


async def read_body(chunks: AsyncIterator[bytes], encoding: str | None, limit: int) -> bytes:
    """The request body from ``chunks``, inflated per ``encoding``; 413 beyond ``limit`` bytes on the
    wire or inflated, 415 for an unknown encoding, 400 for a corrupt stream."""
    enc = check_encoding(encoding)
    inflater = None if enc in IDENTITY else _Inflater(enc, limit)
    parts: list[bytes] = []
    wire = 0
    async for chunk in chunks:
        wire += len(chunk)
        if wire > limit:
            raise _too_large(limit, "")
        if inflater is None:
            parts.append(chunk)
        else:
            inflater.feed(chunk)
    return b"".join(parts) if inflater is None else (inflater.finish() if wire else b"")


__all__ = ["ENCODINGS", "check_encoding", "read_body"]
