"""List the ONNX operators that onnx-tensorrt (TensorRT's ONNX parser) supports in FP16, from a
checkout of github.com/onnx/onnx-tensorrt (its docs/operators.md support matrix).

    python tests/data/tensorrt/extract_onnx_ops.py /path/to/onnx-tensorrt-checkout > onnx-tensorrt-fp16-ops.txt

Output: "# opset MIN MAX" (the opset range the document states), then one operator a line:
those marked supported ("Y") whose supported types include FP16. Restrictions in the matrix's
last column are not encoded; the list answers "could the parser take this op in FP16 at all".
"""

from __future__ import annotations

import re
import sys
from pathlib import Path


def extract(root: Path) -> str:
    text = (root / "docs" / "operators.md").read_text(encoding="utf-8")
    opset = re.search(r"range of opset (\d+) to opset (\d+)", text)
    if not opset:
        raise SystemExit("docs/operators.md: no 'range of opset A to opset B' sentence")
    ops = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[1] == "Y" and "FP16" in [t.strip() for t in cells[2].split(",")]:
            ops.append(cells[0])
    return f"# opset {opset.group(1)} {opset.group(2)}\n" + "\n".join(sorted(ops)) + "\n"


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.stdout.write(extract(Path(sys.argv[1])))
