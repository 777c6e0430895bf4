"""optimize_for_ort: the ONNX Runtime-only graph (model.ort.onnx) is fused and gives the same logits."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

DEPTH, HEADS, WIDTH = 2, 4, 64


@pytest.fixture(scope="module")
def tiny_onnx(tmp_path_factory) -> Path:
    """A tiny ViT whose every parameter (biases and LayerNorms included) is random, exported to ONNX."""
    import torch

    from vitdeploy.export.onnx import export_onnx
    from vitdeploy.model import VisionTransformer, ViTConfig

    torch.manual_seed(0)
    model = VisionTransformer(
        ViTConfig(image_size=32, patch_size=8, width=WIDTH, depth=DEPTH, heads=HEADS, num_classes=7)
    ).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)  # non-zero biases: a fusion that drops or swaps one would show
    out = tmp_path_factory.mktemp("optimize") / "model.onnx"
    export_onnx(model, out, image_size=32, metadata={"vitdeploy.name": "tiny"})
    return out


def _run(path: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return sess.run(None, {"pixel_values": x})[0]


def _ops(path: Path) -> dict[tuple[str, str], int]:
    import onnx

    counts: dict[tuple[str, str], int] = {}
    for n in onnx.load(str(path)).graph.node:
        counts[(n.domain, n.op_type)] = counts.get((n.domain, n.op_type), 0) + 1
    return counts


def _meta(path: Path) -> dict:
    import json

    from vitdeploy.export.onnx import read_metadata
    from vitdeploy.export.optimize import METADATA_KEY

    return json.loads(read_metadata(path)[METADATA_KEY])


def _inputs(batch: int) -> np.ndarray:
    return np.random.default_rng(batch).standard_normal((batch, 3, 32, 32)).astype(np.float32)


@pytest.mark.parametrize("attention", ["MultiHeadAttention", "Attention"])
def test_fused_graph_has_contrib_ops_and_same_logits(tiny_onnx, tmp_path, attention):
    from vitdeploy.export.optimize import fused_op_counts, optimize_for_ort

    out = optimize_for_ort(
        tiny_onnx, tmp_path / "model.ort.onnx", num_heads=HEADS, hidden_size=WIDTH, attention=attention
    )
    assert out == tmp_path / "model.ort.onnx" and out.is_file()
    counts = fused_op_counts(out)
    assert counts.get(attention) == DEPTH
    assert counts.get("BiasGelu") == DEPTH
    assert "SkipLayerNormalization" not in counts  # opt-in: slower on ORT's CPU kernels
    ops = _ops(out)
    assert ("", "Softmax") not in ops and ("", "Erf") not in ops, "attention / GELU left unfused"
    # the last block runs for the class token only where the attention op allows it
    assert _meta(out)["last_block_class_token_only"] is (attention == "MultiHeadAttention")
    for batch in (1, 3):  # the batch axis stays dynamic
        x = _inputs(batch)
        ref, got = _run(tiny_onnx, x), _run(out, x)
        assert got.shape == ref.shape == (batch, 7)
        assert np.abs(got - ref).max() <= 1e-4, f"batch {batch}: max |diff| {np.abs(got - ref).max():.3g}"


def test_source_graph_stays_standard_onnx_and_untouched(tiny_onnx, tmp_path):
    from vitdeploy.export.optimize import METADATA_KEY, optimize_for_ort

    before = hashlib.sha256(tiny_onnx.read_bytes()).hexdigest()
    out = optimize_for_ort(tiny_onnx, tmp_path / "model.ort.onnx", num_heads=HEADS, hidden_size=WIDTH)
    assert hashlib.sha256(tiny_onnx.read_bytes()).hexdigest() == before
    assert all(domain == "" for domain, _ in _ops(tiny_onnx)), "model.onnx must hold standard ONNX ops only"
    from vitdeploy.export.onnx import read_metadata

    meta = read_metadata(out)
    assert meta["vitdeploy.name"] == "tiny"  # the exporter's metadata travels along
    assert _meta(out)["source"] == "model.onnx" and METADATA_KEY in meta
    assert not list(tmp_path.glob(".model.ort.onnx*")), "temporary files left behind"


def test_wrong_head_count_leaves_attention_unfused_but_correct(tiny_onnx, tmp_path):
    from vitdeploy.export.optimize import fused_op_counts, optimize_for_ort

    out = optimize_for_ort(tiny_onnx, tmp_path / "model.ort.onnx", num_heads=HEADS * 2, hidden_size=WIDTH)
    counts = fused_op_counts(out)
    assert "MultiHeadAttention" not in counts and "Attention" not in counts
    x = _inputs(2)
    assert np.abs(_run(out, x) - _run(tiny_onnx, x)).max() <= 1e-4


def test_class_token_pruning_refused_when_all_tokens_are_read(tiny_onnx, tmp_path):
    """A graph that also outputs every token of the last block must keep computing all of them."""
    import onnx

    from vitdeploy.export.optimize import optimize_for_ort

    proto = onnx.load(str(tiny_onnx))
    select = next(n for n in proto.graph.node if n.op_type == "Gather" and n.attribute[0].i == 1)
    proto.graph.output.append(onnx.helper.make_tensor_value_info(select.input[0], onnx.TensorProto.FLOAT, None))
    src = tmp_path / "two_outputs.onnx"
    onnx.save(proto, str(src))
    out = optimize_for_ort(src, tmp_path / "two_outputs.ort.onnx", num_heads=HEADS, hidden_size=WIDTH)
    assert _meta(out)["last_block_class_token_only"] is False
    import onnxruntime as ort

    x = _inputs(2)
    ref = ort.InferenceSession(str(src)).run(None, {"pixel_values": x})
    got = ort.InferenceSession(str(out)).run(None, {"pixel_values": x})
    assert got[1].shape == ref[1].shape == (2, 17, WIDTH)
    for r, o in zip(ref, got, strict=True):
        assert np.abs(r - o).max() <= 1e-4


def test_gelu_approximation_is_opt_in(tiny_onnx, tmp_path):
    from vitdeploy.export.optimize import fused_op_counts, optimize_for_ort

    out = optimize_for_ort(
        tiny_onnx, tmp_path / "fast.onnx", num_heads=HEADS, hidden_size=WIDTH, gelu_approximation=True
    )
    counts = fused_op_counts(out)
    assert counts.get("FastGelu") == DEPTH and "BiasGelu" not in counts


def test_skip_layer_norm_fusion_on_request(tiny_onnx, tmp_path):
    from vitdeploy.export.optimize import fused_op_counts, optimize_for_ort

    out = optimize_for_ort(tiny_onnx, tmp_path / "skip.onnx", num_heads=HEADS, hidden_size=WIDTH, skip_layer_norm=True)
    # every residual Add + LayerNorm but the first block's pre-norm (its "residual" is the embedding)
    assert fused_op_counts(out).get("SkipLayerNormalization") == 2 * DEPTH
    x = _inputs(2)
    assert np.abs(_run(out, x) - _run(tiny_onnx, x)).max() <= 1e-4


def test_refuses_to_overwrite_source_and_bad_sizes(tiny_onnx, tmp_path):
    from vitdeploy.base.errors import ExportError
    from vitdeploy.export.optimize import optimize_for_ort

    with pytest.raises(ExportError, match="overwrite its source"):
        optimize_for_ort(tiny_onnx, tiny_onnx, num_heads=HEADS, hidden_size=WIDTH)
    with pytest.raises(ExportError, match="multiple of num_heads"):
        optimize_for_ort(tiny_onnx, tmp_path / "x.onnx", num_heads=3, hidden_size=WIDTH)
    assert not (tmp_path / "x.onnx").exists()


def test_failed_write_leaves_no_file(tiny_onnx, tmp_path, monkeypatch):
    from vitdeploy.base.errors import ExportError
    from vitdeploy.export import onnx as onnx_writer
    from vitdeploy.export.optimize import optimize_for_ort

    target = tmp_path / "model.ort.onnx"
    target.write_bytes(b"previous")

    def half_then_disk_full(proto, path):  # a write that stops half way, as a full disk stops it
        path.write_bytes(proto.SerializeToString()[:100])
        raise OSError("disk full")

    monkeypatch.setattr(onnx_writer, "write_streamed", half_then_disk_full)
    with pytest.raises(ExportError, match="disk full"):
        optimize_for_ort(tiny_onnx, target, num_heads=HEADS, hidden_size=WIDTH)
    assert target.read_bytes() == b"previous", "a failed write must leave the old file as it was"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.ort.onnx"]


def test_external_data_written_beside_the_graph(tiny_onnx, tmp_path):
    from vitdeploy.export.optimize import optimize_for_ort

    out = optimize_for_ort(
        tiny_onnx, tmp_path / "model.ort.onnx", num_heads=HEADS, hidden_size=WIDTH, external_data_threshold_mb=0
    )
    data = tmp_path / "model.ort.onnx.data"
    assert data.is_file() and data.stat().st_size > out.stat().st_size
    x = _inputs(1)
    assert np.abs(_run(out, x) - _run(tiny_onnx, x)).max() <= 1e-4
    # a later, smaller export must not leave the stale data file behind
    optimize_for_ort(tiny_onnx, out, num_heads=HEADS, hidden_size=WIDTH)
    assert not data.exists()
    assert np.abs(_run(out, x) - _run(tiny_onnx, x)).max() <= 1e-4


@pytest.mark.parametrize("opset", [18, 20])
def test_tanh_gelu_is_fused_as_fast_gelu_never_as_erf_bias_gelu(tmp_path, opset):
    """Opset 18 writes the tanh formula (ORT fuses it into FastGelu); opset 20 writes Gelu(approximate=tanh),
    which ORT's BiasGelu fusion would turn into the erf GELU (seen: 8e-4 drift) unless made FastGelu first."""
    import torch

    from vitdeploy.export.onnx import export_onnx
    from vitdeploy.export.optimize import optimize_for_ort
    from vitdeploy.model import VisionTransformer, ViTConfig

    torch.manual_seed(0)
    model = VisionTransformer(
        ViTConfig(image_size=32, patch_size=8, width=WIDTH, depth=DEPTH, heads=HEADS, num_classes=7, act="gelu_tanh")
    ).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)  # wide activations: erf and tanh GELU differ visibly
    src = export_onnx(model, tmp_path / "model.onnx", image_size=32, opset=opset).path
    out = optimize_for_ort(src, tmp_path / "model.ort.onnx", num_heads=HEADS, hidden_size=WIDTH)
    ops = _ops(out)
    assert ops.get(("com.microsoft", "FastGelu")) == DEPTH and ("com.microsoft", "BiasGelu") not in ops
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    with torch.no_grad():
        ref = model(torch.from_numpy(x)).numpy()
        erf = model.eval()
        for block in erf.blocks:
            block.mlp.approximate = "none"
        erf_ref = erf(torch.from_numpy(x)).numpy()
    assert float(np.abs(_run(out, x) - ref).max()) <= 3e-5
    assert float(np.abs(erf_ref - ref).max()) > 1e-4  # the test can tell the two GELUs apart
