"""The shape of the package: imports run one way, and no module grows past 500 lines.

    cli  ->  serve / batch / evaluate / export  ->  runtime  ->  model (network only)  ->  base

"base" is the preprocessing contract, the vocabularies, config, errors and the small helpers
(every module at the package root but cli.py, and demo/). ``evaluate`` may reuse ``export``'s
comparator and library versions; ``serve`` imports neither ``export`` nor ``evaluate``. Inside
``runtime`` only the torch backend touches ``model``, and only the network (``model.vit``).
Every import is read with ``ast``, those inside functions too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "vitdeploy"
MAX_LINES = 500

ROOMS = ("model", "runtime", "export", "evaluate", "serve", "batch")
MAY_IMPORT = {
    "base": {"base"},
    "model": {"base", "model"},
    "runtime": {"base", "runtime"},
    "export": {"base", "model", "runtime", "export"},
    "evaluate": {"base", "runtime", "export", "evaluate"},
    "serve": {"base", "runtime", "serve"},
    "batch": {"base", "runtime", "batch"},
    "cli": {"base", "model", "runtime", "export", "evaluate", "serve", "batch", "cli"},
}
#: (importing module, imported module) pairs allowed beyond MAY_IMPORT.
EXCEPTIONS = {("vitdeploy.runtime.backends.torch_backend", "vitdeploy.model.vit")}  # the network, to run it


def room(module: str) -> str:
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in ROOMS:
        return parts[1]
    return "cli" if module in ("vitdeploy.cli", "vitdeploy.__main__") else "base"


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imported_modules(module: str, source: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, absolute module name) of every vitdeploy module that ``source`` imports."""
    package = module if is_package else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "vitdeploy"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "vitdeploy":
                continue
            subs = [f"{target}.{a.name}" for a in node.names if _is_module(f"{target}.{a.name}")]
            out += [(node.lineno, t) for t in subs or [target]]
    return out


def violations(module: str, source: str, is_package: bool = False) -> list[str]:
    here = room(module)
    bad = []
    for line, target in imported_modules(module, source, is_package):
        if room(target) in MAY_IMPORT[here] or (module, target) in EXCEPTIONS:
            continue
        bad.append(f"{module} (line {line}) imports {target}: {here} may import only "
                   f"{', '.join(sorted(MAY_IMPORT[here]))}")
    return bad


def package_modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_imports_run_one_way():
    bad = []
    for path in package_modules():
        bad += violations(module_name(path), path.read_text(encoding="utf-8"), path.name == "__init__.py")
    assert not bad, "imports against the architecture (README, Architecture):\n" + "\n".join(bad)


@pytest.mark.parametrize("module, source, offending", [
    ("vitdeploy.runtime.predictor", "from ..evaluate.drift import run_drift", "vitdeploy.evaluate.drift"),
    ("vitdeploy.runtime.backends.ort", "def f():\n    from ...export import onnx", "vitdeploy.export.onnx"),
    ("vitdeploy.model.vit", "import vitdeploy.runtime.preprocess", "vitdeploy.runtime.preprocess"),
    ("vitdeploy.runtime.preprocess", "from ..model.checkpoints import load_checkpoint", "vitdeploy.model.checkpoints"),
    ("vitdeploy.serve.app", "from ..evaluate.bench import run_bench", "vitdeploy.evaluate.bench"),
    ("vitdeploy.config", "from .runtime.backends import BackendOptions", "vitdeploy.runtime.backends"),
    ("vitdeploy.export.pipeline", "from ..evaluate import drift", "vitdeploy.evaluate.drift"),
    ("vitdeploy.batch.job", "from ..serve.runner import run_server", "vitdeploy.serve.runner"),
    ("vitdeploy.runtime.predictor", "from ..batch.job import run_batch", "vitdeploy.batch.job"),
])
def test_the_checker_names_the_offending_import(module, source, offending):
    (message,) = violations(module, source)
    assert message.startswith(f"{module} (line ") and f"imports {offending}:" in message


def test_the_checker_allows_the_documented_directions():
    assert not violations("vitdeploy.runtime.backends.torch_backend", "from ...model.vit import ViTConfig")
    assert not violations("vitdeploy.evaluate.drift", "from ..export.compare import compare\nfrom ..vocab import BACKENDS")
    assert not violations("vitdeploy.model", "from .checkpoints import load_checkpoint\nfrom .. import errors", True)
    assert not violations("vitdeploy.cli", "from .serve import app\nfrom .evaluate.bench import run_bench")


def test_no_module_over_500_lines():
    sizes = {str(p.relative_to(PACKAGE.parent)): len(p.read_text(encoding="utf-8").splitlines())
             for p in package_modules()}
    over = {name: n for name, n in sizes.items() if n > MAX_LINES}
    assert not over, f"modules over {MAX_LINES} lines (split them by job): {over}"
