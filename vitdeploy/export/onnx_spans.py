"""An ONNX file's weights read where they lie, one at a time, and a graph written the same way.

``onnx.load`` of a graph whose weights are inline reads the whole file and parses every weight (a
transient second copy of them too); a step of the INT8 autopilot needs a few of its source's weights
and the rest of a graph as small as its nodes. :func:`scan` reads the file's protobuf framing instead
(the wire format, base/onnx_wire.py) and keeps each initializer's place in the file, parsing
everything else (nodes, inputs, value infos: kilobytes); a weight is read when asked for
(:meth:`Scanned.raw`, :meth:`Scanned.tensor`).

:func:`write` writes a model whose initializers are such byte ranges (or messages) one at a time: the
fields of a message are serialized in field-number order, so the model's bytes are its fields before
the graph, the graph's before its initializers, each initializer, the graph's after them and the
model's after the graph: the same file ``onnx.save_model`` writes (tested), holding one weight at a
time instead of the serialized model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Iterable

from ..base._deps import require
from ..base.onnx_wire import GRAPH, INITIALIZER, NAME, encode_varint, fields, read_model, tag


@dataclass(frozen=True)
class Span:
    name: str
    offset: int  # the TensorProto's bytes in the file
    length: int


@dataclass
class Scanned:
    """A model file's everything but its initializers (``model``: parsed; its graph has no initializer)
    and each initializer's place in the file, in order."""

    path: Path
    model: Any
    spans: list[Span] = field(default_factory=list)

    def raw(self, span: Span) -> bytes:
        with open(self.path, "rb") as f:
            f.seek(span.offset)
            return f.read(span.length)

    def tensor(self, span: Span) -> Any:
        onnx = require("onnx", "reading ONNX")
        return onnx.TensorProto.FromString(self.raw(span))


def _name(f: BinaryIO, start: int, length: int) -> str:
    """A TensorProto's name: its fields read up to it (the name precedes the raw data)."""
    f.seek(start)
    for number, wire, at, size in fields(f, start + length):
        if number == NAME and wire == 2:
            f.seek(at)
            return f.read(size).decode("utf-8")
    return ""


def scan(path: Path) -> Scanned:
    """``path``'s model without reading its initializers' bytes (see the module docstring)."""
    spans: list[Span] = []

    def place(f: BinaryIO, at: int, length: int) -> None:  # kept as a place in the file, left out of the model
        spans.append(Span(_name(f, at, length), at, length))

    return Scanned(path, read_model(path, place), spans)


def _repeated(desc: Any) -> bool:
    flag = getattr(desc, "is_repeated", None)  # protobuf >= 6; ``label`` before it
    return bool(flag) if flag is not None else desc.label == desc.LABEL_REPEATED


def _split(message: Any, at: int) -> tuple[bytes, bytes]:
    """``message``'s serialized fields numbered below ``at`` and above it."""
    low, high = type(message)(), type(message)()
    for desc, value in message.ListFields():
        target = low if desc.number < at else high
        if desc.number == at:
            continue
        if _repeated(desc):
            getattr(target, desc.name).extend(value)
        elif desc.message_type is not None:
            getattr(target, desc.name).CopyFrom(value)
        else:
            setattr(target, desc.name, value)
    return low.SerializeToString(), high.SerializeToString()


def write(model: Any, initializers: Iterable[tuple[int, Any]], path: Path) -> None:
    """Write ``model`` (its graph without initializers) with ``initializers`` as its graph's initializers,
    in order: each (its serialized length, a callable returning its serialized bytes), one at a time."""
    items = list(initializers)
    graph_low, graph_high = _split(model.graph, INITIALIZER)
    entry = tag(INITIALIZER, 2)
    graph_len = len(graph_low) + len(graph_high) + sum(len(entry) + len(encode_varint(n)) + n for n, _ in items)
    model_low, model_high = _split(model, GRAPH)
    with open(path, "wb") as out:
        out.write(model_low + tag(GRAPH, 2) + encode_varint(graph_len) + graph_low)
        for length, read in items:
            data = read()
            if len(data) != length:
                raise ValueError("an initializer changed size while it was written")
            out.write(entry + encode_varint(length) + data)
        out.write(graph_high + model_high)


__all__ = ["Scanned", "Span", "scan", "write"]
