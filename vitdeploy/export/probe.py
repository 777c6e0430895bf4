"""Statistics of a graph's values over calibration images, reduced inside ONNX Runtime.

What the FP16 floor (the hottest activations, export/precision.py) and INT8 calibration (each
quantized tensor's range, export/quantize.py) need of a graph's values is a few numbers per value and
image. Asking ONNX Runtime for the values themselves (every one a graph output) holds every activation
of a run at once: one image of ViT-H is ~1 GB of them, and ONNX Runtime's calibrator holds several
copies of the model besides (its augmented graph serialized, reloaded and run with the weights
prepacked: 1.6 GB for ViT-B/16's 330 MB). Here each value is reduced to scalars by nodes placed right
after the node that writes it, the nodes run in that order with no memory pattern (which plans one
block for every value of a run), so each value is freed once reduced; the weights are read once, where
they lie (without prepacking unless asked). Graph optimizations are off: every node is seen, as written.
"""

from __future__ import annotations

import gc
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from ..base import memory
from ..base._deps import require
from ..base.errors import ExportError
from ..base.onnx_wire import in_place_model


def _min(helper: Any, x: str, out: str) -> list[Any]:
    return [helper.make_node("ReduceMin", [x], [out], keepdims=0)]


def _max(helper: Any, x: str, out: str) -> list[Any]:
    return [helper.make_node("ReduceMax", [x], [out], keepdims=0)]


def _sum(helper: Any, x: str, out: str) -> list[Any]:
    """Not finite when some element is NaN or infinite (or the values are so large that their sum
    overflows): ReduceMin and ReduceMax skip NaN, a sum does not. One read of the value, nothing
    written: an ``Abs`` or ``x - x`` first writes a copy of it (on ViT-B/16's 400 MB of activations an
    image, min + max + sum cost two thirds of abs-max + a sum of ``x - x``)."""
    return [helper.make_node("ReduceSum", [x], [out], keepdims=0)]


#: images a run of INT8 calibration (prepacked weights, the fused graph): its stage's CPU seconds on ViT-B/16 went
#: down ~15% from runs of one image, its ranges the same (min and max do not depend on how the images are
#: grouped), its peak held + 2.8x the weights
BATCH = 8
#: images a run of the FP16 probe (the unfused graph, its weights not prepacked): one. Its stage's peak is the
#: probe's, at the memory bound (ViT-B/16: held + 3.95x the weights; 4.09x at 4 images a run, 4.10x at 8) and
#: more a run saved no wall time there
FP16_BATCH = 1

#: statistic -> the nodes that reduce a value ``x`` to it (a scalar named ``out``)
STATS: dict[str, Callable[[Any, str, str], list[Any]]] = {"min": _min, "max": _max, "sum": _sum}


def float_values(model: Any) -> dict[str, int]:
    """Every value of ``model`` (weights left out) with a known float element type -> that type, as ONNX's
    shape inference types it (on the graph without its weights: no copy of them)."""
    onnx = require("onnx", "probing a graph")
    from .onnx import without_weights

    inferred = onnx.shape_inference.infer_shapes(without_weights(model))
    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)
    infos = [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]
    return {v.name: v.type.tensor_type.elem_type for v in infos if v.type.tensor_type.elem_type in floats}


def reduce_values(
    onnx_path: Path,
    calibration: np.ndarray,
    input_name: str,
    wanted: Mapping[str, Sequence[str]],
    *,
    batch: int = 1,
    model: Any = None,
    prepack: bool = False,
) -> Iterator[dict[str, dict[str, float]]]:
    """For each run of ``batch`` images of ``calibration``: value -> statistic (:data:`STATS`) -> its
    number over the run's images, for every value and statistic of ``wanted``.

    ``model``: ``onnx_path`` already read, its weights external (base/onnx_wire.py ``in_place_model``: where
    they lie in ``onnx_path`` itself; or not loaded from its data file) or inline (it is changed and dropped).
    ``prepack``: let ONNX Runtime prepack the weights, as its own sessions do (a second copy of them,
    and the bits of a MatMul's result as those sessions have them: ONNX Runtime's calibrator runs so).
    ExportError when ONNX Runtime cannot run the probe."""
    onnx = require("onnx", "probing a graph")
    ort = require("onnxruntime", "probing a graph")
    model = model if model is not None else in_place_model(onnx_path)
    outputs: dict[tuple[str, str], str] = {}

    def reductions(value: str) -> list[Any]:
        made = []
        for stat in wanted.get(value, ()):
            outputs[(value, stat)] = name = f"{value}/vitdeploy.{stat}"
            made += STATS[stat](onnx.helper, value, name)
        return made

    nodes = [n for i in model.graph.input for n in reductions(i.name)]
    for node in model.graph.node:
        nodes.append(node)
        nodes += [n for out in node.output for n in reductions(out)]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    del nodes, model.graph.output[:]
    model.graph.output.extend(onnx.helper.make_empty_tensor_value_info(name) for name in outputs.values())
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # every node, as written
    opts.execution_order = ort.ExecutionOrder.PRIORITY_BASED  # the order above: a value freed once reduced
    opts.enable_mem_pattern = False
    if not prepack:
        opts.add_session_config_entry("session.disable_prepacking", "1")  # no second copy of the weights
    # Beside the source, so that weights it keeps in external data are read where they lie (not copied).
    fd, name = tempfile.mkstemp(prefix=".probe-", suffix=".onnx", dir=onnx_path.parent)
    os.close(fd)
    probe = Path(name)
    try:
        if any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer):
            onnx.save_model(model, str(probe))  # the references to the source's bytes (or its data file) stay
        else:  # weights inline: written once beside the probe (works past protobuf's 2 GB)
            onnx.save_model(model, str(probe), save_as_external_data=True, location=probe.name + ".data")
        del model
        memory.give_back()  # the graph's bytes, before ONNX Runtime maps the weights
        try:
            session = ort.InferenceSession(str(probe), opts, providers=["CPUExecutionProvider"])
            names = [o.name for o in session.get_outputs()]
            keys = {name: key for key, name in outputs.items()}
            for start in range(0, len(calibration), batch):
                got = session.run(names, {input_name: calibration[start : start + batch]})
                stats: dict[str, dict[str, float]] = {}
                for out, number in zip(names, got):
                    value, stat = keys[out]
                    stats.setdefault(value, {})[stat] = float(number)
                yield stats
        except Exception as exc:  # noqa: BLE001 - ONNX Runtime raises its own types
            raise ExportError(f"probing {onnx_path.name} in ONNX Runtime failed: {exc}") from exc
        finally:
            session = None
            gc.collect()
    finally:
        probe.unlink(missing_ok=True)
        probe.with_name(probe.name + ".data").unlink(missing_ok=True)


__all__ = ["STATS", "float_values", "reduce_values"]
