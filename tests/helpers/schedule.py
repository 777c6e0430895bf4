"""The order in which the pytest-xdist workers are handed the test files: the longest first.

`make test` runs the files on two workers (``--dist loadfile``), each handed the next file of one queue when it is
nearly done with its own. Handed out longest first (``tests/data/file_seconds.json``, what each file took), the
last files handed out are short ones and the two workers finish within a short file of each other; in pytest-xdist's
own order (files with the most tests first, which puts the few long end-to-end tests last) one worker can be left
running a long file alone at the end. A file the table does not name (new, or moved) goes first: a stale table
costs time, never a result.

Refresh the table from a run's durations:
``python -m pytest -n 2 --dist loadfile -m "not serial" --durations=0 -q > durations.txt`` then
``python tests/helpers/schedule.py durations.txt``.
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

TABLE = Path(__file__).resolve().parents[1] / "data" / "file_seconds.json"


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def longest_first(items: list, table: dict[str, float] | None = None) -> list:
    """``items`` with their files in descending order of seconds (unknown files first), each file's tests in
    their own order; ties keep the collection's order."""
    seconds = json.loads(TABLE.read_text()) if table is None else table
    first_seen: dict[str, int] = {}
    for item in items:
        first_seen.setdefault(file_of(item.nodeid), len(first_seen))

    def key(item) -> tuple[float, int]:
        name = file_of(item.nodeid)
        return (-seconds.get(name, float("inf")), first_seen[name])

    return sorted(items, key=key)  # stable: a file's tests keep their order


def seconds_per_file(report: str) -> dict[str, float]:
    """Setup, call and teardown seconds summed per file, from pytest's ``--durations=0`` lines."""
    total: dict[str, float] = defaultdict(float)
    for match in re.finditer(r"^([\d.]+)s (?:setup|call|teardown)\s+(\S+)", report, re.MULTILINE):
        total[file_of(match.group(2))] += float(match.group(1))
    return dict(total)


def main(report: Path) -> None:
    seconds = seconds_per_file(report.read_text())
    table = {name: round(s, 1) for name, s in sorted(seconds.items(), key=lambda kv: (-kv[1], kv[0]))}
    TABLE.write_text(json.dumps(table, indent=1) + "\n")
    print(f"wrote {TABLE}: {len(table)} files, {sum(table.values()):.0f} s")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
