"""Every TensorRT name our code uses exists in the TensorRT versions we support (10.13 and 11.4).

TensorRT cannot be installed where these tests run, so the code that calls it cannot be run
here. The next best evidence: tests/data/tensorrt/python-api-names-{10.13,11.4}.txt list every
identifier string in the compiled ``tensorrt`` Python bindings of those releases (see the
README there). This test reads our TensorRT modules with ``ast``, collects every attribute,
method, keyword-argument and overridden-method name used on the tensorrt module and on objects
derived from it, and fails on any name a supported version lacks. A name used only inside a
version-guarded branch (``if major >= 11:``, ``getattr(obj, "NAME", default)``, ``hasattr``)
needs to exist in one list; every other name in both. The lists check names, not signatures.

Two documented gaps of the lists are handled explicitly and narrowly:
- TAIL_MERGED: a short name the linker stored as the tail of a longer string ("Builder" lives
  inside "IExprBuilder"), so it never appears as a line of its own. Accepted only if listed here
  AND it is the tail of a plain identifier line in that version's list.
- PYTHON_LEVEL: attributes the tensorrt package sets in Python, outside the compiled bindings.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "tensorrt"
LIST_FILES = {"10.13": DATA / "python-api-names-10.13.txt", "11.4": DATA / "python-api-names-11.4.txt"}
OUR_TRT_MODULES = [
    ROOT / "vitdeploy" / "export" / "tensorrt.py",
    *sorted((ROOT / "vitdeploy" / "runtime" / "backends" / "trt").glob("*.py")),
]

# Variables with these names (or attributes ending in them, e.g. self._engine) hold TensorRT
# objects in our code; their attribute names are checked even where data flow is not tracked.
SEED_NAMES = frozenset({"builder", "network", "config", "parser", "runtime", "engine", "context", "ctx", "profile"})
VERSION_WORDS = ("major", "version")

# name -> where NVIDIA documents it (exists in 10.x and 11.x); see the module docstring.
TAIL_MERGED = {
    "Builder": "https://docs.nvidia.com/deeplearning/tensorrt/latest/_static/python-api/infer/Core/Builder.html",
    "Runtime": "https://docs.nvidia.com/deeplearning/tensorrt/latest/_static/python-api/infer/Core/Runtime.html",
    "DataType": "https://docs.nvidia.com/deeplearning/tensorrt/latest/_static/python-api/infer/FoundationalTypes/DataType.html",
    "INPUT": "TensorIOMode.INPUT: https://docs.nvidia.com/deeplearning/tensorrt/latest/_static/python-api/infer/Core/Engine.html",
    "OUTPUT": "TensorIOMode.OUTPUT: same page as INPUT",
    "serialize": "ITimingCache.serialize(): https://docs.nvidia.com/deeplearning/tensorrt/latest/_static/python-api/infer/Core/TimingCache.html",
    "num_errors": "OnnxParser.num_errors: https://docs.nvidia.com/deeplearning/tensorrt/latest/_static/python-api/parsers/Onnx/pyOnnx.html",
}
PYTHON_LEVEL = {
    "__version__": "set by the tensorrt package in Python (10.x bindings lack the string); "
    "the install guide verifies installs with `python3 -c 'import tensorrt; print(tensorrt.__version__)'`"
}


@dataclass(frozen=True)
class NameList:
    version: str
    exact: frozenset[str]
    plain_lines: tuple[str, ...]  # lines that are not C++ mangled symbols

    @classmethod
    def load(cls, version: str, path: Path) -> "NameList":
        lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        return cls(version, frozenset(lines), tuple(line for line in lines if not line.startswith("_Z")))

    def is_tail(self, name: str) -> bool:
        return any(line.endswith(name) and line != name for line in self.plain_lines)

    def has(self, name: str) -> bool:
        if name in self.exact or name in PYTHON_LEVEL:
            return True
        return name in TAIL_MERGED and self.is_tail(name)


@pytest.fixture(scope="module")
def name_lists() -> dict[str, NameList]:
    return {version: NameList.load(version, path) for version, path in LIST_FILES.items()}


# --------------------------------------------------------------------------------------------
# the collector


@dataclass(frozen=True)
class Use:
    name: str
    line: int
    guarded: bool  # inside a version check / getattr-with-default / hasattr


def _dotted(expr: ast.AST) -> str | None:
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        base = _dotted(expr.value)
        return f"{base}.{expr.attr}" if base else None
    return None


class TrtNameCollector:
    """Finds the names used on the tensorrt module and on objects derived from it.

    Roots: ``import tensorrt [as x]``, a variable assigned from any call given the string
    "tensorrt" (``require("tensorrt", ...)``), and every function parameter named ``trt``.
    Derived (flow-insensitive, per module): targets assigned from an expression rooted at a root
    or derived name, plus SEED_NAMES. Uses: attribute names read or written on those, string
    names given to getattr/hasattr on them, keyword names in calls to them, and method names
    defined in classes that subclass them.
    """

    def __init__(self, source: str, filename: str = "<snippet>") -> None:
        self.filename = filename
        self.tree = ast.parse(source, filename)
        self.roots: set[str] = set()
        self.derived: set[str] = set()
        self._find_roots()
        self._propagate()
        self.uses: list[Use] = []
        self._visit(self.tree, guarded=False)

    # -- what is a TensorRT object -------------------------------------------------------------

    def is_derived(self, expr: ast.AST | None) -> bool:
        if expr is None:
            return False
        if isinstance(expr, ast.Name):
            return expr.id in self.roots or expr.id in self.derived or expr.id in SEED_NAMES
        if isinstance(expr, ast.Attribute):
            dotted = _dotted(expr)
            if dotted is not None and (dotted in self.derived or expr.attr.lstrip("_") in SEED_NAMES):
                return True
            return self.is_derived(expr.value)
        if isinstance(expr, ast.Call):
            return self.is_derived(expr.func)
        if isinstance(expr, ast.Subscript):
            return self.is_derived(expr.value)
        if isinstance(expr, ast.IfExp):
            return self.is_derived(expr.body) or self.is_derived(expr.orelse)
        if isinstance(expr, ast.BoolOp):
            return any(self.is_derived(v) for v in expr.values)
        if isinstance(expr, ast.NamedExpr):
            return self.is_derived(expr.value)
        return False

    def _find_roots(self) -> None:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == "tensorrt":
                        self.roots.add(alias.asname or "tensorrt")
            elif isinstance(node, ast.ImportFrom) and node.module == "tensorrt":
                for alias in node.names:
                    self.derived.add(alias.asname or alias.name)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                a = node.args
                for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs]:
                    if arg.arg == "trt":
                        self.roots.add("trt")
            elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                imports_trt = any(
                    isinstance(sub, ast.Call)
                    and any(isinstance(a, ast.Constant) and a.value == "tensorrt" for a in sub.args)
                    for sub in ast.walk(node.value)
                )
                if imports_trt:
                    for target in self._targets(node):
                        name = _dotted(target)
                        if name:
                            self.roots.add(name)

    @staticmethod
    def _targets(node: ast.AST) -> list[ast.AST]:
        if isinstance(node, ast.Assign):
            raw = node.targets
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.NamedExpr)):
            raw = [node.target]
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            raw = [node.target]
        else:
            raw = []
        out: list[ast.AST] = []
        for target in raw:
            out.extend(target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target])
        return out

    def _propagate(self) -> None:
        changed = True
        while changed:
            changed = False
            for node in ast.walk(self.tree):
                pairs: list[tuple[ast.AST, ast.AST | None]] = []
                if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.NamedExpr)):
                    pairs = [(t, node.value) for t in self._targets(node)]
                elif isinstance(node, (ast.For, ast.AsyncFor)):
                    pairs = [(t, node.iter) for t in self._targets(node)]
                elif isinstance(node, (ast.With, ast.AsyncWith)):
                    pairs = [
                        (item.optional_vars, item.context_expr)
                        for item in node.items
                        if item.optional_vars is not None
                    ]
                for target, value in pairs:
                    name = _dotted(target)
                    if name and name not in self.derived and name not in self.roots and self.is_derived(value):
                        self.derived.add(name)
                        changed = True

    # -- uses --------------------------------------------------------------------------------

    def _is_version_test(self, test: ast.AST) -> bool:
        for sub in ast.walk(test):
            word = sub.id if isinstance(sub, ast.Name) else sub.attr if isinstance(sub, ast.Attribute) else None
            if word and any(w in word.lower() for w in VERSION_WORDS):
                return True
            if (
                isinstance(sub, ast.Call)
                and isinstance(sub.func, ast.Name)
                and sub.func.id in ("hasattr", "getattr")
                and sub.args
                and self.is_derived(sub.args[0])
            ):
                return True
        return False

    def _record(self, name: str, node: ast.AST, guarded: bool) -> None:
        self.uses.append(Use(name, getattr(node, "lineno", 0), guarded))

    def _visit(self, node: ast.AST, guarded: bool) -> None:
        if isinstance(node, (ast.If, ast.IfExp, ast.While)):
            inner = guarded or self._is_version_test(node.test)
            self._visit(node.test, guarded)
            body = node.body if isinstance(node.body, list) else [node.body]
            orelse = node.orelse if isinstance(node.orelse, list) else [node.orelse]
            for child in [*body, *orelse]:
                self._visit(child, inner)
            return
        if isinstance(node, ast.Attribute) and self.is_derived(node.value):
            self._record(node.attr, node, guarded)
        if isinstance(node, ast.Call):
            func = node.func
            if (
                isinstance(func, ast.Name)
                and func.id in ("getattr", "hasattr", "setattr", "delattr")
                and len(node.args) >= 2
                and self.is_derived(node.args[0])
                and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)
            ):
                safe = func.id == "hasattr" or (func.id == "getattr" and len(node.args) >= 3)
                self._record(node.args[1].value, node, guarded or safe)
            if self.is_derived(func):
                for keyword in node.keywords:
                    if keyword.arg:
                        self._record(keyword.arg, node, guarded)
        if isinstance(node, ast.ClassDef) and any(self.is_derived(base) for base in node.bases):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and not (
                    item.name.startswith("__") and item.name.endswith("__")
                ):
                    self._record(item.name, item, guarded)
        for child in ast.iter_child_nodes(node):
            self._visit(child, guarded)


def problems(source: str, lists: dict[str, NameList], filename: str = "<snippet>") -> list[str]:
    """One line per used name that a supported TensorRT version lacks."""
    found = []
    for use in TrtNameCollector(source, filename).uses:
        present = [v for v, names in lists.items() if names.has(use.name)]
        missing = [v for v in lists if v not in present]
        if (use.guarded and not present) or (not use.guarded and missing):
            where = "version-guarded, in no list" if use.guarded else f"missing in TensorRT {', '.join(missing)}"
            found.append(f"{filename}:{use.line}: '{use.name}' ({where})")
    return found


def used_names(source: str) -> set[str]:
    return {use.name for use in TrtNameCollector(source).uses}


# --------------------------------------------------------------------------------------------
# the checker catches wrong names (self-tests)


def test_flags_builder_flag_fp16_as_missing_in_11_4(name_lists):
    snippet = "import tensorrt as trt\nconfig.set_flag(trt.BuilderFlag.FP16)\n"
    found = problems(snippet, name_lists)
    assert found == ["<snippet>:2: 'FP16' (missing in TensorRT 11.4)"]


def test_flags_removed_names_on_objects_derived_from_trt(name_lists):
    snippet = (
        "def run(trt, data, logger):\n"
        "    rt = trt.Runtime(logger)\n"
        "    eng = rt.deserialize_cuda_engine(data)\n"
        "    shape = eng.get_binding_shape(0)\n"  # removed in 10.0: tracked through rt -> eng
        "    context.execute_async_v2([], 0)\n"  # removed in 10.0: a context variable
        "    builder.platform_has_fast_fp16\n"  # removed in 11.0
    )
    found = problems(snippet, name_lists)
    assert "<snippet>:4: 'get_binding_shape' (missing in TensorRT 10.13, 11.4)" in found
    assert "<snippet>:5: 'execute_async_v2' (missing in TensorRT 10.13, 11.4)" in found
    assert "<snippet>:6: 'platform_has_fast_fp16' (missing in TensorRT 11.4)" in found
    assert len(found) == 3


def test_flags_wrong_keyword_getattr_string_and_subclass_method(name_lists):
    snippet = (
        "import tensorrt as trt\n"
        "config.set_timing_cache(cache, ignore_mismatched=False)\n"
        "x = getattr(trt.BuilderFlag, 'NO_SUCH_FLAG_X', None)\n"
        "class L(trt.ILogger):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "    def log_message(self, severity, msg):\n"
        "        pass\n"
    )
    found = problems(snippet, name_lists)
    assert any("'ignore_mismatched'" in line for line in found)
    assert any("'NO_SUCH_FLAG_X' (version-guarded, in no list)" in line for line in found)
    assert any("'log_message'" in line for line in found)
    assert len(found) == 3


def test_version_guarded_names_need_one_list_only(name_lists):
    guarded = (
        "import tensorrt as trt\n"
        "if major < 11:\n"
        "    flags = 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)\n"
        "fp16 = getattr(trt.BuilderFlag, 'FP16', None)\n"
    )
    assert problems(guarded, name_lists) == []
    unguarded = "import tensorrt as trt\nflags = 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)\n"
    assert problems(unguarded, name_lists) == ["<snippet>:2: 'EXPLICIT_BATCH' (missing in TensorRT 11.4)"]


def test_torch_and_python_objects_are_not_checked(name_lists):
    snippet = (
        "import tensorrt as trt\n"
        "import torch\n"
        "stream = torch.cuda.Stream(device=0)\n"
        "x = torch.empty((2, 3), dtype=torch.float16, device='cuda')\n"
        "ptr = x.data_ptr()\n"
        "handle = stream.cuda_stream\n"
        "text = str(trt.__version__).split('.')\n"
        "meta = {'a': 1}.items()\n"
    )
    assert used_names(snippet) == {"__version__"}
    assert problems(snippet, name_lists) == []


def test_tail_merged_names_are_tails_not_lines_in_both_lists(name_lists):
    for name in TAIL_MERGED:
        for names in name_lists.values():
            assert name not in names.exact, f"{name} is a line of {names.version}: drop it from TAIL_MERGED"
            assert names.is_tail(name), f"{name} has no evidence in the {names.version} list"


def test_removed_names_are_not_rescued_by_the_tail_rule(name_lists):
    v11 = name_lists["11.4"]
    for removed in ("FP16", "EXPLICIT_BATCH", "platform_has_fast_fp16"):
        assert not v11.has(removed)
    assert not name_lists["10.13"].has("execute_async_v2")


# --------------------------------------------------------------------------------------------
# our modules


@pytest.mark.parametrize("path", OUR_TRT_MODULES, ids=lambda p: p.name)
def test_our_tensorrt_names_exist_in_10_13_and_11_4(path, name_lists):
    found = problems(path.read_text(encoding="utf-8"), name_lists, str(path.relative_to(ROOT)))
    assert not found, "TensorRT names a supported version lacks:\n" + "\n".join(found)


def test_collector_sees_our_tensorrt_calls():
    """Guards against a vacuous pass: the collector must see the calls we know are there."""
    build = used_names(OUR_TRT_MODULES[0].read_text(encoding="utf-8"))
    run = set().union(*(used_names(p.read_text(encoding="utf-8")) for p in OUR_TRT_MODULES[1:]))
    assert {
        "OnnxParser",
        "IProgressMonitor",
        "progress_monitor",
        "phase_start",
        "step_complete",
        "phase_finish",
        "parse_from_file",
        "get_error",
        "num_errors",
        "STRONGLY_TYPED",
        "MemoryPoolType",
        "WORKSPACE",
        "set_memory_pool_limit",
        "builder_optimization_level",
        "set_shape",
        "add_optimization_profile",
        "create_timing_cache",
        "set_timing_cache",
        "ignore_mismatch",
        "get_timing_cache",
        "serialize",
        "build_serialized_network",
        "__version__",
        "set_preview_feature",
        "PreviewFeature",
        "RUNTIME_ACTIVATION_RESIZE_10_10",
    } <= build
    assert {
        "Builder",
        "Runtime",
        "get_tensor_profile_shape",
        "deserialize_cuda_engine",
        "num_io_tensors",
        "get_tensor_name",
        "get_tensor_mode",
        "TensorIOMode",
        "get_tensor_dtype",
        "create_execution_context",
        "set_input_shape",
        "set_tensor_address",
        "get_tensor_shape",
        "execute_async_v3",
        "ILogger",
        "log",
        "ExecutionContextAllocationStrategy",
        "USER_MANAGED",
        "update_device_memory_size_for_shapes",
        "set_device_memory",
    } <= run
    assert "FP16" not in build | run, "FP16 precision must come from the ONNX graph, never from BuilderFlag.FP16"
    assert not {"INT8", "set_flag", "int8_calibrator"} & (build | run), (
        "INT8 comes from the graph's Q/DQ (explicit quantization)"
    )
