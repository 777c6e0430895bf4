"""The shape of the package: imports run one way, modules and functions stay small, each idea is
defined once.

    cli  ->  tune  ->  client  ->  serve / batch / evaluate / export  ->  runtime  ->  model (network only)  ->  base

``vitdeploy/base/`` is the base layer (config, errors, vocabularies, the preprocessing contract, the
ViT's fields, small helpers); nothing else lives at the package root. ``evaluate`` may reuse
``export``'s comparator and library versions; ``serve`` and ``batch`` import neither ``export`` nor
``evaluate`` (nor each other). ``client`` (what talks to a running server: loadtest, validate --url, the
rollout's driver) stands on ``serve``'s wire protocol and ``evaluate``'s judgement; ``tune`` measures with it.
Inside ``runtime`` only the torch backend touches ``model``, and only the network (``model.vit``); the package
root names the Python API (``vitdeploy.export``, ``vitdeploy.Predictor``), imported on first use. Every import
is read with ``ast``, those inside functions too.

The tests mirror the package: ``tests/<room>/test_<module>[_<aspect>].py``, ``<module>`` a module or
subpackage of ``vitdeploy/<room>/``; tests/ itself holds this file and the tests of what
``vitdeploy/__init__.py`` defines; helpers live in ``tests/helpers/``. Test file names are unique, no test
module imports another, and every marker used is registered in pyproject.toml.
"""

from __future__ import annotations

import ast
import bisect
import io
import math
import re
import tokenize
from collections import defaultdict
from pathlib import Path

import pytest

from vitdeploy.base import vocab

PACKAGE = Path(__file__).resolve().parents[1] / "vitdeploy"
# A module's size is its physical lines (what `wc -l` counts: code, docstrings, comments and blank lines alike,
# as a reader scrolls them); a function's is its logical lines (a statement is one line however the formatter,
# ruff format at line length 119, wraps its arguments), so that rule measures code, not line breaks.
MAX_LINES = 500
MAX_FUNCTION_LINES = 80

ROOMS = ("base", "model", "runtime", "export", "evaluate", "serve", "batch", "client", "tune", "cli")
MAY_IMPORT = {
    "base": {"base"},
    "model": {"base", "model"},
    "runtime": {"base", "runtime"},
    "export": {"base", "model", "runtime", "export"},
    "evaluate": {"base", "runtime", "export", "evaluate"},
    "serve": {"base", "runtime", "serve"},
    "batch": {"base", "runtime", "batch"},
    "client": {"base", "runtime", "export", "evaluate", "serve", "client"},
    "tune": {"base", "runtime", "evaluate", "serve", "client", "tune"},
    "cli": {"base", "model", "runtime", "export", "evaluate", "serve", "batch", "client", "tune", "cli"},
}
#: (importing module, imported module) pairs allowed beyond MAY_IMPORT.
EXCEPTIONS = {
    ("vitdeploy.runtime.backends.torch_backend", "vitdeploy.model.vit"),  # the network, to run it
    # the Python API, which the package root names and imports on first use (module __getattr__): docs/api.md
    ("vitdeploy", "vitdeploy.export"),
    ("vitdeploy", "vitdeploy.runtime.predictor"),
}
#: Public top-level names several modules define on purpose: each backend module's opener functions
#: (one interface, looked up by name in runtime/backends/__init__.py's registry).
SHARED_INTERFACE = {"open_from_artifacts", "open_fp16_from_artifacts", "open_int8_from_artifacts"}
#: Strings that name an idea the vocabulary defines: spelled in base/vocab.py only, imported elsewhere.
VOCABULARY_WORDS = {
    vocab.ORT_FP16,
    vocab.ORT_INT8,
    vocab.TRT_INT8,
    vocab.TORCH_FP16,
    vocab.TIMING_CACHE_NAME,
    vocab.EXPORT_REPORT_NAME,
    vocab.DRIFT_REPORT_NAME,
    vocab.TUNE_REPORT_NAME,
    vocab.LOADTEST_REPORT_NAME,
    vocab.MANIFEST_NAME,
    vocab.REPORT_NAME,
    vocab.BENCH_REPORT_NAME,
    vocab.TRT_EP_CACHE,
    vocab.SIGNATURE_NAME,
}


def room(module: str) -> str:
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in ROOMS:
        return parts[1]
    return "base"  # vitdeploy/__init__.py and the demo data package


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
        bad.append(
            f"{module} (line {line}) imports {target}: {here} may import only {', '.join(sorted(MAY_IMPORT[here]))}"
        )
    return bad


def package_modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_imports_run_one_way():
    bad = []
    for path in package_modules():
        bad += violations(module_name(path), path.read_text(encoding="utf-8"), path.name == "__init__.py")
    assert not bad, "imports against the architecture (README, Architecture):\n" + "\n".join(bad)


@pytest.mark.parametrize(
    "module, source, offending",
    [
        ("vitdeploy.runtime.predictor", "from ..evaluate.drift import run_drift", "vitdeploy.evaluate.drift"),
        ("vitdeploy.runtime.backends.ort", "def f():\n    from ...export import onnx", "vitdeploy.export.onnx"),
        ("vitdeploy.model.vit", "import vitdeploy.runtime.preprocess", "vitdeploy.runtime.preprocess"),
        (
            "vitdeploy.runtime.preprocess",
            "from ..model.checkpoints import load_checkpoint",
            "vitdeploy.model.checkpoints",
        ),
        ("vitdeploy.serve.app", "from ..evaluate.bench import run_bench", "vitdeploy.evaluate.bench"),
        ("vitdeploy.base.config", "from ..runtime.backends import BackendOptions", "vitdeploy.runtime.backends"),
        ("vitdeploy.batch.pipeline", "from ..serve.protocol import decode_image", "vitdeploy.serve.protocol"),
        ("vitdeploy.serve.runner", "from ..batch import run", "vitdeploy.batch"),
        ("vitdeploy.export.pipeline", "from ..evaluate import drift", "vitdeploy.evaluate.drift"),
        ("vitdeploy.batch.job", "from ..serve.runner import run_server", "vitdeploy.serve.runner"),
        ("vitdeploy.runtime.predictor", "from ..batch.job import run_batch", "vitdeploy.batch.job"),
        ("vitdeploy.serve.runner", "from ..client.protocols import Target", "vitdeploy.client.protocols"),
        ("vitdeploy.evaluate.drift", "from ..client.served_check import ask", "vitdeploy.client.served_check"),
        ("vitdeploy.client.loadtest", "from ..tune.search import search_serve", "vitdeploy.tune.search"),
        ("vitdeploy.client.rollout.driver", "from ...tune import tuner", "vitdeploy.tune.tuner"),
        ("vitdeploy.client.served_check", "from ..batch.job import run_batch", "vitdeploy.batch.job"),
        (
            "vitdeploy.serve.rollout.shadow",
            "from ...client.rollout.gate import judge_shadow",
            "vitdeploy.client.rollout.gate",
        ),
    ],
)
def test_the_checker_names_the_offending_import(module, source, offending):
    (message,) = violations(module, source)
    assert message.startswith(f"{module} (line ") and f"imports {offending}:" in message


def test_the_checker_allows_the_documented_directions():
    assert not violations("vitdeploy.runtime.backends.torch_backend", "from ...model.vit import ViTConfig")
    assert not violations(
        "vitdeploy.evaluate.drift", "from ..export.compare import compare\nfrom ..base.vocab import BACKENDS"
    )
    assert not violations(
        "vitdeploy.model", "from .checkpoints import load_checkpoint\nfrom ..base import errors", True
    )
    assert not violations("vitdeploy.cli", "from ..serve import app\nfrom ..evaluate.bench import run_bench", True)
    assert not violations(
        "vitdeploy.client.rollout.driver",
        "from ...serve.rollout.routes import version_app\nfrom ...evaluate.drift import judge_backend\n"
        "from ...export.compare import compare\nfrom .gate import judge_shadow",
    )
    assert not violations("vitdeploy.tune.measure", "from ..client.loadgen import closed_loop")


def import_graph() -> dict[str, set[str]]:
    """Module -> the vitdeploy modules it imports (at the top, inside functions or for type checking)."""
    graph = {}
    for path in package_modules():
        module = module_name(path)
        found = imported_modules(module, path.read_text(encoding="utf-8"), path.name == "__init__.py")
        graph[module] = {target for _, target in found if target != module}
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or around a circle (strongly connected
    components of more than one module), each sorted; iterative Tarjan."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next((c for c in children if c in graph), None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    circles.append(sorted(group))
    return circles


def test_no_import_circle_between_modules():
    """Two modules that need each other are one idea split in two, or two ideas tangled: either way a
    reader cannot understand one without the other (a TYPE_CHECKING or in-function import counts)."""
    circles = import_circles(import_graph())
    assert not circles, "modules that import each other (merge them, or move what both need):\n" + "\n".join(
        " <-> ".join(c) for c in circles
    )


def test_the_circle_checker_names_every_module_of_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"a"}, "f": {"f"}}
    assert import_circles(graph) == [["a", "b", "c"]]
    assert import_circles({"x": {"y"}, "y": {"x"}, "z": {"y"}}) == [["x", "y"]]
    assert import_circles({"x": {"y"}, "y": set()}) == []
    typed = imported_modules(
        "vitdeploy.evaluate.reliability", "if TYPE_CHECKING:\n    from .bench import BenchResult", False
    )
    assert [t for _, t in typed] == ["vitdeploy.evaluate.bench"]  # a type-only import is an edge too


FORMATS_PACKAGE = PACKAGE / "model" / "formats"
#: What every checkpoint format shares; everything else in model/formats/ belongs to one format.
FORMATS_SHARED = {"__init__.py", "base.py", "resolve.py", "shared.py"}


def test_a_checkpoint_format_lives_in_one_place_and_is_registered_once():
    """Each format is one module or one package named after it under model/formats/ (its reader:
    detection, config, labels, preprocessing; in a package, ``convert.py`` beside it for the pure key
    conversion, and ``convert_<family>.py`` for a family's share of it, e.g. hf's CLIP tower), registered by one
    line of READERS; nothing format-specific elsewhere in model/."""
    from vitdeploy.model.formats import FORMATS, READERS

    places = {p.stem if p.is_file() else p.name for p in FORMATS_PACKAGE.iterdir() if p.name != "__pycache__"}
    places -= {Path(n).stem for n in FORMATS_SHARED}
    assert places == set(FORMATS), f"model/formats/ holds {sorted(places)}; READERS registers {sorted(FORMATS)}"
    for fmt, reader in READERS.items():
        assert type(reader).__module__ == f"vitdeploy.model.formats.{fmt}", (fmt, type(reader).__module__)
        folder = FORMATS_PACKAGE / fmt
        if folder.is_dir():
            files = {p.name for p in folder.glob("*.py")}
            others = {f for f in files - {"__init__.py", "convert.py"} if not f.startswith("convert_")}
            assert not others, f"model/formats/{fmt}/ holds {sorted(files)}"
    registry = (FORMATS_PACKAGE / "__init__.py").read_text(encoding="utf-8")
    for reader in READERS.values():
        assert registry.count(f"{type(reader).__name__}()") == 1, f"{type(reader).__name__} registered twice"
    elsewhere = sorted(
        str(p.relative_to(PACKAGE))
        for p in (PACKAGE / "model").rglob("*.py")
        if FORMATS_PACKAGE not in p.parents and any(f in p.stem for f in (*FORMATS, "convert", "reader"))
    )
    assert not elsewhere, f"format-specific modules outside model/formats/: {elsewhere}"


def logical_line_starts(source: str) -> list[int]:
    """The physical line of each logical line (a statement, a docstring or a comment counting one), in order."""
    return [
        tok.start[0]
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type in (tokenize.NEWLINE, tokenize.COMMENT)
    ]


def logical_lines(source: str | list[int], first: int = 1, last: int | None = None) -> int:
    """Logical lines between physical lines ``first`` and ``last``; ``source`` may be its `logical_line_starts`
    (a module tokenized once for all its functions)."""
    starts = logical_line_starts(source) if isinstance(source, str) else source
    return bisect.bisect_right(starts, last if last is not None else math.inf) - bisect.bisect_left(starts, first)


def physical_lines(source: str) -> int:
    """The lines of a file, as `wc -l` counts them."""
    return len(source.splitlines())


def test_no_module_over_500_lines():
    sizes = {
        str(p.relative_to(PACKAGE.parent)): physical_lines(p.read_text(encoding="utf-8")) for p in package_modules()
    }
    over = {name: n for name, n in sizes.items() if n > MAX_LINES}
    assert not over, f"modules over {MAX_LINES} lines (split them by job): {over}"


def test_a_module_is_measured_in_physical_lines_and_a_function_in_logical_lines():
    wrapped = 'def f():\n    """Doc."""\n    return g(\n        1,\n        2,\n    )\n\n\n# a comment\n'
    assert physical_lines(wrapped) == 9  # wc -l: every line, the blank ones too
    assert logical_lines(wrapped, 1, 6) == 3  # the def, the docstring, the one return statement


def test_the_base_layer_is_one_package():
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert not loose, f"modules at the package root (the base layer lives in vitdeploy/base/): {loose}"


def _functions(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def test_no_function_over_80_lines():
    long = []
    for p in package_modules():
        source = p.read_text(encoding="utf-8")
        starts = logical_line_starts(source)
        for fn in _functions(ast.parse(source)):
            n = logical_lines(starts, fn.lineno, fn.end_lineno)
            if n > MAX_FUNCTION_LINES:
                long.append(f"{p.relative_to(PACKAGE.parent)}:{fn.lineno} {fn.name} ({n} lines)")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (split them by step): {long}"


def test_each_public_name_is_defined_in_one_module():
    where = defaultdict(list)
    for p in package_modules():
        for node in ast.parse(p.read_text(encoding="utf-8")).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not node.name.startswith(
                "_"
            ):
                where[node.name].append(str(p.relative_to(PACKAGE.parent)))
    twice = {name: mods for name, mods in where.items() if len(mods) > 1 and name not in SHARED_INTERFACE}
    assert not twice, f"defined in more than one module (import the one definition): {twice}"


def _docstrings(tree: ast.AST) -> set[int]:
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }


def test_vocabulary_words_are_spelled_only_in_vocab():
    """A backend name or a file name of the vocabulary typed as a string elsewhere is a copy that can drift."""
    found = []
    for p in package_modules():
        if p == PACKAGE / "base" / "vocab.py":
            continue
        tree = ast.parse(p.read_text(encoding="utf-8"))
        docs = _docstrings(tree)
        found += [
            f"{p.relative_to(PACKAGE.parent)}:{n.lineno} {n.value!r}"
            for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and n.value in VOCABULARY_WORDS and id(n) not in docs
        ]
    assert not found, f"spell these through vitdeploy.base.vocab: {found}"


def test_one_strict_pydantic_base():
    """``extra="forbid"`` on a pydantic model is written once (base/_schema.py StrictSection); the dataclass
    schemas (ViTConfig, PreprocessSpec) carry their own ``__pydantic_config__``."""
    writers = [
        str(p.relative_to(PACKAGE.parent))
        for p in package_modules()
        if 'model_config = ConfigDict(extra="forbid"' in p.read_text(encoding="utf-8")
    ]
    assert writers == ["vitdeploy/base/_schema.py"], writers


# ------------------------------------------------------------------------------------------------
# the tests mirror the package: tests/<room>/test_<module>[_<aspect>].py

TESTS = PACKAGE.parent / "tests"
#: Where the modules of tests/ that are not tests live: the shared helpers, and the test data's own scripts.
NOT_TESTS = ("helpers", "data")
#: A test of tests/ itself, beside the tests of what vitdeploy/__init__.py defines: the package as a whole.
WHOLE_PACKAGE = "architecture"


def room_names() -> dict[str, set[str]]:
    """Per room, what a test file of tests/<room>/ may be named after: the room's modules and subpackages at
    any depth (runtime/backends/trt/log.py gives ``backends``, ``trt`` and ``log``); vitdeploy/demo/ is base's
    (``room()``)."""
    names: dict[str, set[str]] = {r: set() for r in ROOMS}
    for path in package_modules():
        module = module_name(path)
        parts = module.split(".")[1:]
        if parts and parts[0] == room(module):
            parts = parts[1:]
        names[room(module)].update(p for p in parts if p != "__main__")
    return names


def root_names() -> set[str]:
    """What tests/ itself may hold: a test of a public name vitdeploy/__init__.py assigns (lowercased:
    test_moved_modules.py), and this file."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text(encoding="utf-8"))
    assigned = {
        t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets if isinstance(t, ast.Name)
    }
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    return {name.lower() for name in assigned | defined if not name.startswith("_")} | {WHOLE_PACKAGE}


def layout_violations(files: list[str], names: dict[str, set[str]], top: set[str]) -> list[str]:
    """The offenders among ``files`` (paths under tests/, with ``/``): a test module outside tests/<room>/ or
    named after no module of its room, and a module that is neither a test, a conftest nor a helper."""
    bad = []
    for rel in sorted(files):
        *folders, name = rel.split("/")
        if not name.startswith("test_"):
            if name != "conftest.py" and (not folders or folders[0] not in NOT_TESTS):
                bad.append(f"tests/{rel}: not a test module (helpers live in tests/helpers/)")
            continue
        if not folders:
            allowed, of = top, "vitdeploy/__init__.py (or test_architecture.py)"
        elif len(folders) == 1 and folders[0] in names:
            allowed, of = names[folders[0]], f"vitdeploy/{folders[0]}/"
        else:
            bad.append(f"tests/{rel}: not in tests/<room>/ for a room ({', '.join(ROOMS)})")
            continue
        stem = name.removeprefix("test_").removesuffix(".py")
        if not any(stem == m or stem.startswith(m + "_") for m in allowed):
            bad.append(f"tests/{rel}: named after no module or subpackage of {of} (test_<module>[_<aspect>].py)")
    return bad


def files_under_tests() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts)


def test_the_tests_mirror_the_package():
    files = [p.relative_to(TESTS).as_posix() for p in files_under_tests()]
    bad = layout_violations(files, room_names(), root_names())
    assert not bad, "tests out of the package's layout (CONTRIBUTING, Tests):\n" + "\n".join(bad)


@pytest.mark.parametrize(
    "rel, offence",
    [
        ("unit/test_config.py", "not in tests/<room>/"),
        ("runtime/backends/test_ort.py", "not in tests/<room>/"),
        ("runtime/test_predictors.py", "named after no module or subpackage of vitdeploy/runtime/"),
        ("serve/test_checkpoints.py", "named after no module or subpackage of vitdeploy/serve/"),
        ("test_everything.py", "named after no module or subpackage of vitdeploy/__init__.py"),
        ("serve/servers.py", "not a test module"),
        ("shared.py", "not a test module"),
    ],
)
def test_the_layout_checker_names_the_offending_file(rel, offence):
    (message,) = layout_violations([rel], room_names(), root_names())
    assert message.startswith(f"tests/{rel}: {offence}"), message


def test_the_layout_checker_allows_the_documented_places():
    files = [
        "conftest.py",
        "test_architecture.py",
        "test_moved_modules.py",
        "base/test_demo_model.py",  # vitdeploy/demo/ is the base room's
        "runtime/test_trt_engine_gpu.py",  # runtime/backends/trt/
        "serve/test_triton_repo.py",
        "serve/test_ray_app_production.py",
        "evaluate/conftest.py",
        "helpers/bad_input.py",
        "data/tensorrt/extract_signatures.py",
    ]
    assert not layout_violations(files, room_names(), root_names())


def test_test_basenames_are_unique():
    """pytest imports a test module by its file name (tests/ has no __init__.py): two of one name collide."""
    where = defaultdict(list)
    for p in files_under_tests():
        if p.name.startswith("test_"):
            where[p.name].append(p.relative_to(TESTS).as_posix())
    twice = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert not twice, f"test files of one name: {twice}"


def test_no_test_module_imports_another():
    """What several test modules share is a helper (tests/helpers/), never imported from a test module."""
    found = []
    for p in files_under_tests():
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            top = {n.split(".")[0] for n in names}
            found += [
                f"tests/{p.relative_to(TESTS).as_posix()}:{node.lineno} imports {t}"
                for t in top
                if t.startswith("test_") or t == "conftest"
            ]
    assert not found, f"import it from tests/helpers/ instead: {found}"


def markers_used(source: str) -> set[str]:
    """The names of ``pytest.mark.<name>`` in ``source``."""
    return {
        node.attr
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "mark"
        and isinstance(node.value.value, ast.Name)
        and node.value.value.id == "pytest"
    }


def test_every_marker_used_is_registered(pytestconfig):
    """pyproject's markers and pytest's own (--strict-markers refuses the others when a module is collected; this
    also reads the modules an importorskip leaves uncollected)."""
    registered = {line.split(":")[0].split("(")[0].strip() for line in pytestconfig.getini("markers")}
    found = [
        f"tests/{p.relative_to(TESTS).as_posix()}: pytest.mark.{name}"
        for p in files_under_tests()
        for name in sorted(markers_used(p.read_text(encoding="utf-8")) - registered)
    ]
    assert not found, f"markers not registered in pyproject.toml ([tool.pytest.ini_options] markers): {found}"


def test_the_marker_reader_sees_every_spelling():
    source = (
        "import pytest\npytestmark = [pytest.mark.integration, pytest.mark.slow]\n"
        "@pytest.mark.parametrize('x', [pytest.param(1, marks=pytest.mark.integraton)])\ndef test(x): ...\n"
    )
    assert markers_used(source) == {"integration", "slow", "parametrize", "integraton"}


def test_the_readme_is_a_ten_minute_read_that_points_at_the_rest():
    """README.md stays <= 250 lines (issue 20); what it leaves out lives in docs/ and CONTRIBUTING.md, and every
    local file it links to exists."""
    root = PACKAGE.parent
    readme = (root / "README.md").read_text()
    assert len(readme.splitlines()) <= 250, f"README.md has {len(readme.splitlines())} lines; move detail to docs/"
    links = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", readme)
    assert "CONTRIBUTING.md" in links and any(link.startswith("docs/") for link in links)
    missing = [link for link in links if not (root / link).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"
