"""Extract the Python signatures and enum values of TensorRT's bindings from a checkout of
NVIDIA's public TensorRT repository (github.com/NVIDIA/TensorRT: the pybind11 sources under
python/src and the C++ headers under include/).

    python tests/data/tensorrt/extract_signatures.py /path/to/TensorRT-checkout > python-api-signatures-X.Y.json

Output (JSON): the TensorRT version of the checkout, and per Python class the keyword names of
its constructor and methods (one list per overload; ``name=`` marks a parameter with a default),
its properties (``rw`` / ``ro``), and per enum every member with its integer value as declared
in the C++ header. Only the files named in SOURCES are read. The sources themselves are never
committed; the JSON is the test data the strict fake tensorrt (tests/helpers/strict_tensorrt.py) is
built from.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

SOURCES = (
    "python/src/infer/pyCore.cpp",
    "python/src/infer/pyFoundationalTypes.cpp",
    "python/src/infer/pyGraph.cpp",
    "python/src/parsers/pyOnnx.cpp",
)
HEADERS = (
    "include/NvInfer.h",
    "include/NvInferRuntime.h",
    "include/NvInferRuntimeBase.h",
    "include/NvInferRuntimeCommon.h",
    "include/NvInferLegacyDims.h",
    "include/NvOnnxParser.h",
)


def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def balanced(text: str, start: int) -> int:
    """Index just past the bracket group that opens at ``text[start]`` ('(' '{' or '[')."""
    pairs = {"(": ")", "{": "}", "[": "]"}
    stack = []
    i = start
    in_str = False
    while i < len(text):
        ch = text[i]
        if in_str:
            if ch == "\\":
                i += 2
                continue
            if ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in pairs:
            stack.append(pairs[ch])
        elif ch in ")}]":
            stack.pop()
            if not stack:
                return i + 1
        i += 1
    raise ValueError(f"unbalanced bracket at {start}")


def statement_end(text: str, start: int) -> int:
    """Index of the ';' ending the statement that starts at ``start`` (brackets and strings skipped)."""
    i = start
    while i < len(text):
        ch = text[i]
        if ch in "({[":
            i = balanced(text, i)
            continue
        if ch == '"':
            i = text.index('"', i + 1) + 1
            continue
        if ch == ";":
            return i
        i += 1
    return len(text)


def version(root: Path) -> str:
    text = (root / "include/NvInferVersion.h").read_text(encoding="utf-8", errors="replace")
    parts = []
    for key in ("MAJOR", "MINOR", "PATCH"):
        match = re.search(rf"#define\s+(?:TRT_{key}_ENTERPRISE|NV_TENSORRT_{key})\s+(\d+)", text)
        parts.append(match.group(1) if match else "?")
    return ".".join(parts)


def cpp_enums(root: Path) -> dict[str, dict[str, int]]:
    """C++ ``enum class Name : type { kA = 0, kB, ... }`` -> {"Name": {"kA": 0, "kB": 1}}."""
    enums: dict[str, dict[str, int]] = {}
    for rel in HEADERS:
        path = root / rel
        if not path.is_file():
            continue
        text = strip_comments(path.read_text(encoding="utf-8", errors="replace"))
        for match in re.finditer(r"enum\s+class\s+(\w+)\s*(?::\s*[\w:]+\s*)?\{", text):
            body_end = balanced(text, match.end() - 1)
            body = text[match.end() : body_end - 1]
            members: dict[str, int] = {}
            value = -1
            for item in body.split(","):
                item = re.sub(r"\bTRT_DEPRECATED_ENUM\b|\bTRT_DEPRECATED\b|\[\[[^\]]*\]\]", " ", item).strip()
                if not item:
                    continue
                m = re.match(r"(\w+)\s*(?:=\s*(.+))?$", item, re.S)
                if not m:
                    continue
                if m.group(2) is not None:
                    expr = m.group(2).strip()
                    if re.fullmatch(r"-?\d+", expr):
                        value = int(expr)
                    elif re.fullmatch(r"\w+", expr) and expr in members:
                        value = members[expr]
                    else:
                        try:
                            value = int(eval(expr, {}, dict(members)))  # noqa: S307 - shifts like 1 << 2 in public headers
                        except Exception:  # noqa: BLE001
                            continue
                else:
                    value += 1
                members[m.group(1)] = value
            enums.setdefault(match.group(1), members)
    return enums


_ARG = re.compile(r'"(\w+)"_a(\s*=)?|py::arg\("(\w+)"\)(\s*=)?')


def call_args(call: str) -> list[str]:
    """Keyword names declared in one ``.def(...)`` / ``py::init(...)`` call, in order."""
    names = []
    for m in _ARG.finditer(call):
        name = m.group(1) or m.group(3)
        default = bool(m.group(2) or m.group(4))
        names.append(name + ("=" if default else ""))
    return names


def bindings(root: Path, enum_values: dict[str, dict[str, int]]) -> tuple[dict, dict]:
    classes: dict[str, dict] = {}
    enums: dict[str, dict[str, int]] = {}
    scope_names: dict[str, str] = {}  # C++ variable holding a py::class_ -> its Python name
    for rel in SOURCES:
        path = root / rel
        if not path.is_file():
            continue
        text = strip_comments(path.read_text(encoding="utf-8", errors="replace"))
        for m in re.finditer(r"py::class_<([^>]*(?:<[^>]*>[^>]*)?)>\s*(\w+)?\s*[({]\s*(\w+)\s*,\s*\"(\w+)\"", text):
            if m.group(2):
                scope_names[m.group(2)] = m.group(4)
        for m in re.finditer(
            r"py::(class_|enum_)<([^>]*(?:<[^>]*>[^>]*)?)>\s*(\w+)?\s*[({]\s*(\w+)\s*,\s*\"(\w+)\"", text
        ):
            kind, cpp_type, var, scope, py_name = m.groups()
            end = statement_end(text, m.start())
            chain = text[m.start() : end]
            if kind == "enum_":
                key = py_name if scope == "m" else f"{scope_names.get(scope, scope)}.{py_name}"
                cpp_name = cpp_type.split("::")[-1].strip()
                values = enum_values.get(cpp_name, {})
                members = {}
                for v in re.finditer(r'\.value\(\s*"(\w+)"\s*,\s*([\w:]+)', chain):
                    member = v.group(2).split("::")[-1]
                    if member in values:
                        members[v.group(1)] = values[member]
                enums[key] = members
                continue
            entry = classes.setdefault(py_name, {"init": [], "methods": {}, "properties": {}})
            if var:  # py::class_<X> var{m, "X"}; ... var.def(...) later: follow the variable too
                for extra in re.finditer(rf"\b{var}\s*\.\s*def", text):
                    chain += text[extra.start() + len(var) : statement_end(text, extra.start())]
            for d in re.finditer(r"\.(def|def_static|def_property|def_property_readonly|def_readwrite)\s*\(", chain):
                call = chain[d.end() - 1 : balanced(chain, d.end() - 1)]
                inner = call[1:-1].strip()
                if d.group(1) == "def" and inner.startswith("py::init"):
                    entry["init"].append(call_args(call))
                    continue
                name = re.match(r'"(\w+)"', inner)
                if not name:
                    continue
                if d.group(1) in ("def", "def_static"):
                    entry["methods"].setdefault(name.group(1), []).append(call_args(call[len(name.group(0)) + 1 :]))
                elif d.group(1) == "def_property_readonly":
                    entry["properties"][name.group(1)] = "ro"
                else:
                    entry["properties"][name.group(1)] = "rw"
    return classes, enums


def extract(root: Path) -> dict:
    classes, enums = bindings(root, cpp_enums(root))
    return {
        "tensorrt": version(root),
        "source": "github.com/NVIDIA/TensorRT " + ", ".join(SOURCES + HEADERS),
        "classes": dict(sorted(classes.items())),
        "enums": dict(sorted(enums.items())),
    }


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not Path(argv[1]).is_dir():
        print(__doc__, file=sys.stderr)
        return 2
    json.dump(extract(Path(argv[1])), sys.stdout, indent=1, sort_keys=False)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
