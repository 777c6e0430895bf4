"""An ONNX file read through its protobuf framing (the wire format: a tag, a length, the bytes), and the
graph without its weight matrices read that way.

``onnx.load`` of a graph whose weights are inline reads the whole file and parses every weight (330 MB
for ViT-B/16, ~0.3 s each time; an export asked it a dozen times for nodes, inputs or external data
entries alone). :func:`light_model` walks the framing instead and keeps each weight matrix's header
(name, dims, type, where its data lies) without its values: what ``export/onnx.py``'s ``without_weights``
makes of a loaded model, without loading it. export/onnx_spans.py builds on the same readers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator

from ._deps import require

GRAPH, INITIALIZER, NAME = 7, 5, 8  # ModelProto.graph, GraphProto.initializer, TensorProto.name
_DIMS = 1
#: TensorProto's value fields: float_data, int32_data, string_data, int64_data, raw_data, double_data, uint64_data
_VALUES = frozenset({4, 5, 6, 7, 9, 10, 11})


def varint(data: bytes, pos: int) -> tuple[int, int]:
    """The varint of ``data`` at ``pos``, and where it ends."""
    value, shift = 0, 0
    while True:
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        if byte < 0x80:
            return value, pos
        shift += 7


def encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def read_varint(f: BinaryIO) -> int | None:
    value, shift = 0, 0
    while True:
        byte = f.read(1)
        if not byte:
            if shift:
                raise ValueError("truncated varint")
            return None
        value |= (byte[0] & 0x7F) << shift
        if byte[0] < 0x80:
            return value
        shift += 7


def fields(f: BinaryIO, end: int) -> Iterator[tuple[int, int, int, int]]:
    """(field number, wire type, where its value starts, how many bytes it has) of each field of the
    message that runs from ``f``'s position to ``end``; ``f`` is left after the field's tag. ValueError
    when a field runs past ``end`` (a truncated file)."""
    while f.tell() < end:
        tag = read_varint(f)
        if tag is None:
            return
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            start = f.tell()
            read_varint(f)
            length = f.tell() - start
            f.seek(start)
        elif wire == 2:
            length = read_varint(f) or 0
        elif wire in (1, 5):
            length = 8 if wire == 1 else 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        start = f.tell()
        if start + length > end:
            raise ValueError("a protobuf field runs past the end of its message (truncated)")
        yield number, wire, start, length
        f.seek(start + length)


def tag(number: int, wire: int) -> bytes:
    return encode_varint(number << 3 | wire)


def field_head(number: int, wire: int, length: int) -> bytes:
    """A field's tag, and its length when it has one (wire type 2)."""
    return tag(number, wire) + (encode_varint(length) if wire == 2 else b"")


def is_weight_matrix(dims: Any) -> bool:
    """A weight matrix (2-D, more than 64 values): what a graph read for its structure leaves out."""
    return len(dims) == 2 and int(dims[0]) * int(dims[1]) > 64


def _dims(f: BinaryIO, parts: list[tuple[int, int, int, int]]) -> list[int]:
    dims: list[int] = []
    for number, wire, start, length in parts:
        if number != _DIMS:
            continue
        f.seek(start)
        data = f.read(length)
        pos = 0
        while pos < len(data):  # one varint (wire 0) or a packed run of them (wire 2)
            value, pos = varint(data, pos)
            dims.append(value)
    return dims


def _initializer(f: BinaryIO, start: int, length: int) -> bytes:
    """An initializer's serialized bytes, without its values when it is a weight matrix."""
    parts = list(fields(f, start + length))
    if not is_weight_matrix(_dims(f, parts)):
        f.seek(start)
        return f.read(length)
    body = bytearray()
    for number, wire, at, size in parts:
        if number not in _VALUES:
            f.seek(at)
            body += field_head(number, wire, size) + f.read(size)
    return bytes(body)


def read_model(path: Path, initializer: Callable[[BinaryIO, int, int], bytes | None]) -> Any:
    """The ModelProto at ``path``, each initializer (its serialized bytes at ``start``, ``length`` of the file)
    replaced by what ``initializer(f, start, length)`` returns (None: left out), every other field whole;
    nothing else is read twice. Raises what protobuf raises, or ValueError, for a file that is not a model."""
    onnx = require("onnx", "reading ONNX")
    model_bytes, graph_bytes = bytearray(), bytearray()
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        f.seek(0)
        for number, wire, start, length in fields(f, size):
            f.seek(start)
            if number != GRAPH or wire != 2:
                model_bytes += field_head(number, wire, length) + f.read(length)
                continue
            for inner, inner_wire, at, inner_len in fields(f, start + length):
                if inner == INITIALIZER and inner_wire == 2:
                    body = initializer(f, at, inner_len)
                    if body is not None:
                        graph_bytes += field_head(inner, 2, len(body)) + body
                    continue
                f.seek(at)
                graph_bytes += field_head(inner, inner_wire, inner_len) + f.read(inner_len)
            f.seek(start + length)
    model = onnx.ModelProto.FromString(bytes(model_bytes))
    model.graph.MergeFromString(bytes(graph_bytes))
    return model


#: TensorProto.raw_data, .external_data, .data_location (EXTERNAL is 1)
_RAW_DATA, _EXTERNAL_DATA, _DATA_LOCATION = 9, 13, 14


def _entry(key: str, value: str) -> bytes:
    """A StringStringEntryProto (key = 1, value = 2), serialized."""
    k, v = key.encode(), value.encode()
    return field_head(1, 2, len(k)) + k + field_head(2, 2, len(v)) + v


def in_place_model(path: Path) -> Any:
    """The ModelProto at ``path`` with each weight matrix whose values are inline (``raw_data``) turned into a
    reference to those very bytes in ``path`` (ONNX external data: location ``path``'s name, offset, length);
    every other field whole. A graph to run beside ``path`` (in its folder) without parsing or copying its
    weights: ONNX Runtime reads them where they lie, the same bytes."""

    def initializer(f: BinaryIO, start: int, length: int) -> bytes:
        parts = list(fields(f, start + length))
        raw = [(at, size) for number, wire, at, size in parts if number == _RAW_DATA and wire == 2]
        if len(raw) != 1 or not is_weight_matrix(_dims(f, parts)):
            f.seek(start)
            return f.read(length)
        body = bytearray()
        for number, wire, at, size in parts:
            if number not in _VALUES:
                f.seek(at)
                body += field_head(number, wire, size) + f.read(size)
        ((offset, size),) = raw
        for key, value in (("location", path.name), ("offset", str(offset)), ("length", str(size))):
            entry = _entry(key, value)
            body += field_head(_EXTERNAL_DATA, 2, len(entry)) + entry
        return bytes(body + tag(_DATA_LOCATION, 0) + encode_varint(1))

    return read_model(path, initializer)


def light_model(path: Path) -> Any:
    """The ModelProto at ``path`` with every weight matrix (:func:`is_weight_matrix`) a header without its
    values; every other field whole. What structure-only readers need (nodes, inputs and outputs, metadata,
    shapes for inference, external data entries), at the cost of its kilobytes, not its weights."""
    return read_model(path, _initializer)


__all__ = [
    "GRAPH",
    "INITIALIZER",
    "NAME",
    "encode_varint",
    "field_head",
    "fields",
    "in_place_model",
    "is_weight_matrix",
    "light_model",
    "read_model",
    "read_varint",
    "tag",
    "varint",
]
