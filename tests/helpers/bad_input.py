"""Helpers shared by the bad-input tests (issue 10): a copy of an export to tamper with, a
manifest rewritten with matching hashes, toy ONNX graphs, and running the CLI without the
root-only permission bypass (so a mode-000 file really is unreadable)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[2]
IMAGES = REPO / "vitdeploy" / "demo" / "images"
GOOD_IMAGES = [IMAGES / "digit0_0276.png", IMAGES / "digit3_0339.jpg"]


def copy_export(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def read_manifest(d: Path) -> dict[str, Any]:
    return json.loads((d / "manifest.json").read_text())


def write_manifest(d: Path, data: dict[str, Any]) -> None:
    (d / "manifest.json").write_text(json.dumps(data, indent=1))


def edit_manifest(d: Path, edit: Callable[[dict[str, Any]], Any]) -> None:
    data = read_manifest(d)
    edit(data)
    write_manifest(d, data)


def rehash(d: Path, role: str) -> None:
    """Make the manifest vouch for the file now under ``role`` (what a careful attacker does)."""
    data = read_manifest(d)
    path = d / data["artifacts"][role]["path"]
    blob = path.read_bytes()
    data["artifacts"][role].update(sha256=hashlib.sha256(blob).hexdigest(), bytes=len(blob))
    write_manifest(d, data)


def flip_byte(path: Path, at: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2 if at is None else at] ^= 0x01
    path.write_bytes(bytes(data))


def toy_classifier(
    path: Path,
    *,
    classes: int = 10,
    side: int = 32,
    input_name: str = "pixel_values",
    output_name: str = "logits",
    extra_output: bool = False,
) -> Path:
    """A valid ONNX classifier [batch, 3, side, side] -> [batch, classes] (pool, flatten, matmul)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((3, classes), np.float32), "w")
    nodes = [
        helper.make_node("GlobalAveragePool", [input_name], ["pooled"]),
        helper.make_node("Flatten", ["pooled"], ["flat"], axis=1),
        helper.make_node("MatMul", ["flat", "w"], [output_name]),
    ]
    outputs = [helper.make_tensor_value_info(output_name, TensorProto.FLOAT, ["batch", classes])]
    if extra_output:
        outputs.append(helper.make_tensor_value_info("flat", TensorProto.FLOAT, ["batch", 3]))
    graph = helper.make_graph(
        nodes,
        "toy",
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, ["batch", 3, side, side])],
        outputs,
        initializer=[w],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), str(path))
    return path


def cli_env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    env.pop("VITDEPLOY_DEBUG", None)
    return env


def without_root_bypass() -> list[str]:
    """A command prefix under which mode-000 files are unreadable even for root: drop the two
    capabilities that let root ignore file permissions (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH).
    Empty when not root (permissions already apply)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        import pytest

        pytest.skip("running as root without setpriv: root reads mode-000 files, so unreadable input cannot be made")
    caps = "-dac_override,-dac_read_search"
    return [setpriv, f"--bounding-set={caps}", f"--inh-caps={caps}"]


def run_cli(*args: str, unprivileged: bool = False, cwd: Path | None = None) -> subprocess.CompletedProcess:
    prefix = without_root_bypass() if unprivileged else []
    return subprocess.run(
        [*prefix, sys.executable, "-W", "default", "-m", "vitdeploy.cli", *args],
        capture_output=True,
        text=True,
        env=cli_env(),
        cwd=cwd,
        timeout=300,
    )


def run_python(code: str, *, unprivileged: bool = False) -> subprocess.CompletedProcess:
    prefix = without_root_bypass() if unprivileged else []
    return subprocess.run(
        [*prefix, sys.executable, "-W", "default", "-c", code],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=300,
    )


def assert_one_error_line(stderr: str, *needles: str) -> str:
    """stderr holds exactly one `error:` line (no traceback) containing every needle; returns it."""
    assert "Traceback" not in stderr, stderr
    errors = [ln for ln in stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1, stderr
    for needle in needles:
        assert needle in errors[0], (needle, errors[0])
    return errors[0]
