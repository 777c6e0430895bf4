"""The Ray APIs Ray does not promise to keep (vitdeploy/base/ray_private.py): each one is still there in the
installed Ray - a Ray upgrade that drops one fails here, naming it and why vitdeploy needs it - and no other module
of vitdeploy names one."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from vitdeploy.base import ray_private
from vitdeploy.base.ray_private import APIS, RayApi, missing

PACKAGE = Path(ray_private.__file__).resolve().parents[1]


@pytest.mark.parametrize("api", APIS, ids=lambda api: api.dotted)
def test_the_installed_ray_still_has_it(api):
    pytest.importorskip("ray.serve", reason="vitdeploy serve needs ray[serve] (pip install 'vitdeploy[serve]')")
    assert missing(api) is None, missing(api)


@pytest.mark.parametrize(
    "api, says",
    [
        (RayApi("ray.serve", "delete", "_gone_parameter", why="a test"), "takes no _gone_parameter"),
        (RayApi("ray.serve", "no_such_function", why="a test"), "no_such_function is not there"),
        (RayApi("ray.serve._private.no_such_module", "x", why="a test"), "module ray.serve._private.no_such_module"),
        (RayApi("ray", "init", "_no_such_private_keyword", why="a test"), "takes no _no_such_private_keyword"),
        (RayApi("ray._private.ray_constants", "RAY_WORKER_NICENESS", value="RAY_other"), "not 'RAY_other'"),
    ],
)
def test_a_lost_api_is_named_with_why_we_need_it(api, says):
    pytest.importorskip("ray.serve", reason="vitdeploy serve needs ray[serve] (pip install 'vitdeploy[serve]')")
    message = missing(api)
    assert message is not None and message.startswith("Ray ") and api.dotted in message and says in message


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _ray_private(module: str) -> bool:
    """A Ray module Ray keeps private: one of its parts starts with an underscore (``ray._raylet``,
    ``ray.serve._private.x``)."""
    parts = module.split(".")
    return parts[0] == "ray" and any(_private(part) for part in parts)


def _private_uses(path: Path) -> list[str]:
    """What ``path`` names of Ray's private side in code (docstrings and messages aside): an import of a private
    module or of a private name from a Ray module, ``serve._x`` / ``ray._x``, a keyword or a string that is one of
    ray_private's parameters, variables, private modules or private names."""
    keywords = {api.parameter for api in APIS if api.parameter.startswith("_")}
    strings = {api.parameter or api.variable for api in APIS}
    strings |= {api.module for api in APIS if _ray_private(api.module)}
    strings |= {part for api in APIS for part in api.name.split(".") if _private(part)}
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and not node.level and _ray_private(node.module or ""):
            found.append(f"{node.lineno}: from {node.module} import")
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "ray":
            found += [f"{node.lineno}: from {node.module} import {a.name}" for a in node.names if _private(a.name)]
        elif isinstance(node, ast.Import):
            found += [f"{node.lineno}: import {a.name}" for a in node.names if _ray_private(a.name)]
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            if isinstance(node.value, ast.Name) and node.value.id in ("ray", "serve"):
                found.append(f"{node.lineno}: {node.value.id}.{node.attr}")
        elif isinstance(node, ast.keyword) and node.arg in keywords:
            found.append(f"{node.value.lineno}: {node.arg}=")
        elif isinstance(node, ast.Constant) and node.value in strings:
            found.append(f"{node.lineno}: {node.value!r}")
    return sorted(found, key=lambda use: int(use.split(":")[0]))


def test_no_other_module_names_a_private_ray_api():
    found = {
        str(path.relative_to(PACKAGE.parent)): uses
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "ray_private.py" and (uses := _private_uses(path))
    }
    assert not found, f"private Ray APIs outside vitdeploy/base/ray_private.py (list them there): {found}"


def test_the_scan_sees_each_kind_of_use(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        "from ray.serve._private.tracing_utils import is_tracing_enabled\n"
        "serve._run(app, name='x')\n"
        "serve.delete(app, _blocking=False)\n"
        "env = {'RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH': 'x'}\n"
        "getattr(server, 'service_handler_factory')\n"
        '"""a docstring may say serve._run"""\n'
        "from ray._raylet import GcsClient\n"
        "from ray.experimental.internal_kv import _internal_kv_get, _internal_kv_put\n"
        "importlib.import_module('ray._raylet')\n"
        "from ray.experimental import internal_kv\n"
    )
    assert _private_uses(source) == [
        "1: from ray.serve._private.tracing_utils import",
        "2: serve._run",
        "3: _blocking=",
        "4: 'RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH'",
        "5: 'service_handler_factory'",
        "7: from ray._raylet import",
        "8: from ray.experimental.internal_kv import _internal_kv_get",
        "8: from ray.experimental.internal_kv import _internal_kv_put",
        "9: 'ray._raylet'",
    ]
