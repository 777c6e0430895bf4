"""`vitdeploy validate --url --image-size N` of an export for several sizes (``sized_artifacts``: a tiny DINOv2 with
registers at 28, 42 and 56 px): every request asks the server for N (``/predict?image_size=N``, v2
``parameters.image_size``) and its answers are judged against eager PyTorch at N; a server that answers at another
size fails; a size the export does not list is refused before any request. The server is one whose every answer
the test decides (helpers/scripted_server.py); a real `vitdeploy serve` checked at a size, over every protocol:
tests/serve/test_ray_app_image_sizes.py.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from click.testing import CliRunner
from helpers.scripted_server import ScriptedServer

from vitdeploy.base.errors import InputError
from vitdeploy.cli import main
from vitdeploy.client.protocols import PREDICT, V2_HTTP
from vitdeploy.client.served_check import check_served
from vitdeploy.runtime.artifacts import sha256_file
from vitdeploy.serve.auth import TOKEN_ENV
from vitdeploy.serve.protocol import config_parameters, export_parameters

pytestmark = pytest.mark.integration

BASE = 56


@pytest.fixture(scope="module")
def sized(sized_artifacts, tmp_path_factory) -> dict:
    """Three images and eager PyTorch's embedding of each at every size."""
    from PIL import Image

    from vitdeploy.runtime.predictor import Predictor

    folder = tmp_path_factory.mktemp("served_sized_images")
    rng = np.random.default_rng(3)
    blobs = []
    for i in range(3):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (44 + 6 * i, 60, 3), dtype=np.uint8)).save(buf, format="PNG")
        (folder / f"im{i}.png").write_bytes(buf.getvalue())
        blobs.append(buf.getvalue())
    with Predictor.from_artifacts(sized_artifacts, backend="torch") as eager:
        vectors = {s: {b: eager.at_size(s).embed([b])[0] for b in blobs} for s in (28, 42, BASE)}
    return {"export": sized_artifacts, "images": folder, "vectors": vectors}


def _asked(path: str, body: bytes) -> int | None:
    """The size a request asks: ``?image_size=N`` on /predict, the v2 JSON header's parameters.image_size."""
    if path.endswith("/predict") or "/predict?" in path:
        return int(path.split("image_size=")[1]) if "image_size=" in path else None
    header, _ = json.JSONDecoder().raw_decode(body.decode("latin-1"))
    return (header.get("parameters") or {}).get("image_size")


def _server(sized: dict, honours_size: bool = True) -> ScriptedServer:
    """A server of the sized export answering each image's embedding at the size asked (``honours_size`` False:
    always at the base size); ``server.asked`` lists the size each request asked."""
    sha = sha256_file(sized["export"] / "manifest.json")
    config = {"name": "m", "parameters": config_parameters(export_parameters(sha, "ort"))}
    asked: list[int | None] = []

    def answer(method: str, path: str, body: bytes):
        if method == "GET":
            return 200, config
        size = _asked(path, body)
        asked.append(size)
        vectors = sized["vectors"][(size or BASE) if honours_size else BASE]
        vector = next(v for blob, v in vectors.items() if body.endswith(blob)).tolist()
        if "/predict" in path:
            return 200, [{"path": "body", "embedding": vector}]
        return 200, {
            "outputs": [{"name": "EMBEDDINGS", "datatype": "FP32", "shape": [1, len(vector)], "data": vector}]
        }

    server = ScriptedServer(answer=answer)
    server.asked = asked
    return server


def _check(sized: dict, server: ScriptedServer, protocol: str = PREDICT, **kwargs):
    return check_served(
        sized["export"], server.url, protocol=protocol, model="m", images=sized["images"], write_report=False, **kwargs
    )


@pytest.mark.parametrize("protocol", [PREDICT, V2_HTTP])
def test_each_request_asks_the_size_and_is_judged_against_eager_at_it(sized, protocol):
    with _server(sized) as server:
        check = _check(sized, server, protocol, image_size=42)
        assert server.asked == [42, 42, 42]
    assert check.passed, check.row.failures
    assert check.row.image_size == 42 and check.drift.image_sizes == [42]
    assert check.to_dict()["image_size"] == 42
    with _server(sized) as server:
        base = _check(sized, server, protocol)
        assert server.asked == [None, None, None]  # no --image-size: nothing asked, the base size judged
    assert base.passed and base.row.image_size == BASE


def test_a_server_answering_at_another_size_fails(sized):
    with _server(sized, honours_size=False) as server:
        check = _check(sized, server, image_size=28)
    assert check.status == "failed" and check.row.failures


def test_a_size_the_export_does_not_list_is_refused_before_any_request(sized):
    with _server(sized) as server:
        with pytest.raises(InputError, match="sizes that work: 28, 42, 56"):
            _check(sized, server, image_size=35)
        res = CliRunner().invoke(
            main,
            ["validate", "-a", str(sized["export"]), "--url", server.url, "--image-size", "35"],
            env={TOKEN_ENV: None},
        )
        assert server.asked == []
    assert res.exit_code == 2 and "sizes that work: 28, 42, 56" in res.output
