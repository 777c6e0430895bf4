"""A refusal is final: backend "auto" moves on only when a backend cannot run here.

A failed integrity or safety check (external data outside the folder, a sha256 mismatch, a
manifest that breaks its schema, an empty ``artifacts`` map) stops ``predict``, ``validate``,
``bench``, ``serve`` and the Python API alike: exit 2, one ``error:`` line, no prediction.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers.bad_input import GOOD_IMAGES, assert_one_error_line, copy_export, edit_manifest, flip_byte, rehash

from vitdeploy.base.errors import ArtifactError, ArtifactIntegrityError
from vitdeploy.cli import main
from vitdeploy.runtime.predictor import Predictor

pytestmark = pytest.mark.integration


def _external_data_at(onnx_path: Path, location: str) -> None:
    """Store the graph's first initializer as external data at ``location`` (sha256 then updated)."""
    import onnx
    from onnx import TensorProto

    model = onnx.load(str(onnx_path))
    tensor = model.graph.initializer[0]
    tensor.data_location = TensorProto.EXTERNAL
    del tensor.external_data[:]
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", location
    tensor.ClearField("raw_data")
    onnx.save(model, str(onnx_path))


def escaping_external_data(d: Path, *, keep_ort_graph: bool) -> None:
    _external_data_at(d / "model.onnx", "../../../../etc/passwd")
    rehash(d, "onnx")  # a careful attacker makes the manifest vouch for the file
    if not keep_ort_graph:  # then the ort backend itself opens model.onnx
        edit_manifest(d, lambda m: m["artifacts"].pop("onnx-ort"))
        (d / "model.ort.onnx").unlink()


def sha256_mismatch(d: Path) -> None:
    flip_byte(d / "model.ort.onnx")


def schema_break(d: Path) -> None:
    edit_manifest(d, lambda m: m["artifacts"]["onnx"].update(bytes="many"))


def empty_artifacts(d: Path) -> None:
    edit_manifest(d, lambda m: m.update(artifacts={}))


CASES = {
    "external data outside the folder (ort opens model.onnx)": (
        lambda d: escaping_external_data(d, keep_ort_graph=False),
        ArtifactIntegrityError,
        "outside the artifact directory",
    ),
    "external data outside the folder (in a graph no CPU backend opens)": (
        lambda d: escaping_external_data(d, keep_ort_graph=True),
        ArtifactIntegrityError,
        "outside the artifact directory",
    ),
    "sha256 mismatch": (sha256_mismatch, ArtifactIntegrityError, "sha256 expected"),
    "manifest breaks its schema": (schema_break, ArtifactError, "'artifacts.onnx.bytes' = 'many'"),
    "empty artifacts map": (empty_artifacts, ArtifactError, "lists no artifact"),
}

COMMANDS = {
    "predict": lambda a: ["predict", str(GOOD_IMAGES[0]), "-a", str(a), "--json"],
    "validate": lambda a: ["validate", "-a", str(a), "--json"],
    "bench": lambda a: ["bench", "-a", str(a), "--batch-sizes", "1", "--iterations", "1", "--warmup", "0", "--json"],
    # refused before Ray starts or a port is bound (--allow-unauthenticated: the tests' Ray has no token auth)
    "serve": lambda a: ["serve", "-a", str(a), "--port", "1", "--allow-unauthenticated"],
}


@pytest.fixture(scope="module")
def refused_exports(demo_artifacts, tmp_path_factory):
    """One tampered copy of the demo export per case, made once for the module."""
    made = {}
    for name, (tamper, _, _) in CASES.items():
        d = copy_export(demo_artifacts, tmp_path_factory.mktemp("refused") / "art")
        tamper(d)
        made[name] = d
    return made


@pytest.mark.parametrize("case", list(CASES))
def test_the_api_refuses_and_auto_never_falls_back(refused_exports, case):
    _, error, needle = CASES[case]
    for backend in ("auto", "torch"):
        with pytest.raises(error) as info:
            Predictor.from_artifacts(refused_exports[case], backend=backend)
        assert needle in str(info.value)


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("case", list(CASES))
def test_every_command_exits_2_with_one_line(refused_exports, case, command):
    _, _, needle = CASES[case]
    res = CliRunner().invoke(main, COMMANDS[command](refused_exports[case]), catch_exceptions=False)
    assert res.exit_code == 2, (res.exit_code, res.stdout[-500:], res.stderr[-500:])
    assert res.stdout == "", "nothing may be predicted, validated or timed"
    assert_one_error_line(res.stderr, needle)


def test_a_backend_that_cannot_run_here_is_still_skipped(demo_artifacts):
    """The other side of the rule: a missing library or GPU is not a refusal (auto goes on)."""
    with Predictor.from_artifacts(demo_artifacts, backend="auto") as p:
        assert p.backend_name == "ort"
        assert "trt unavailable" in p.why and "ort-fp16 needs CUDA" in p.why
