"""Issue 10, theme 4 (one bad path never sinks the others; decompression bombs) and the
command-line sizes of theme 5 (`predict --batch-size`, `bench --batch-sizes` bounded).

Unreadable paths need permissions to apply, so those runs drop root's permission bypass
(helpers.bad_input.without_root_bypass) and go through a subprocess, CLI and API alike.
"""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers.bad_input import GOOD_IMAGES, assert_one_error_line, run_cli, run_python

from vitdeploy.base.errors import ConfigError
from vitdeploy.base.limits import MAX_BATCH
from vitdeploy.cli import main

pytestmark = pytest.mark.integration

BAD_KINDS = [
    "missing",
    "empty dir",
    "symlink loop",
    "dangling symlink",
    "unreadable file",
    "unreadable dir",
    "unreadable sub-folder",
]


def make_bad(root: Path, kind: str) -> tuple[Path, str]:
    """A bad path of ``kind`` under ``root`` and the words its error record must hold."""
    root.mkdir(parents=True, exist_ok=True)
    if kind == "missing":
        return root / "x.jpg", "no such file or directory"
    if kind == "empty dir":
        (root / "x.jpg").mkdir()
        return root / "x.jpg", "directory holds no images"
    if kind == "symlink loop":
        (root / "a").symlink_to(root / "b")
        (root / "b").symlink_to(root / "a")
        return root / "a", "symlink loop"
    if kind == "dangling symlink":
        (root / "d.jpg").symlink_to(root / "gone.jpg")
        return root / "d.jpg", "dangling symlink"
    if kind == "unreadable file":
        path = root / "u.jpg"
        path.write_bytes(GOOD_IMAGES[1].read_bytes())
        path.chmod(0)
        return path, "Permission denied"
    if kind == "unreadable dir":
        path = root / "udir"
        path.mkdir()
        (path / "a.png").write_bytes(GOOD_IMAGES[0].read_bytes())
        path.chmod(0)
        return path, "cannot read the directory"
    path = root / "tree"  # a readable folder with one image and one unreadable sub-folder
    (path / "locked").mkdir(parents=True)
    (path / "ok.png").write_bytes(GOOD_IMAGES[0].read_bytes())
    (path / "locked" / "b.png").write_bytes(GOOD_IMAGES[0].read_bytes())
    (path / "locked").chmod(0)
    return path, "cannot read the directory"


def _restore(root: Path) -> None:
    for p in [root, *root.rglob("*")]:
        if not p.is_symlink():
            p.chmod(0o755 if p.is_dir() else 0o644)


@pytest.mark.parametrize("kind", BAD_KINDS)
def test_each_bad_path_gets_its_own_record_and_the_others_are_predicted(demo_artifacts, tmp_path, kind):
    bad, words = make_bad(tmp_path / "in", kind)
    args = [str(GOOD_IMAGES[0]), str(bad), str(GOOD_IMAGES[1])]
    try:
        res = run_cli("predict", *args, "-a", str(demo_artifacts), "--json", unprivileged=True)
        api = run_python(
            "import json\nfrom vitdeploy.runtime.predictor import Predictor\n"
            "from vitdeploy.runtime.batch_predict import predict_paths\n"
            f"with Predictor.from_artifacts({str(demo_artifacts)!r}, backend='ort') as p:\n"
            f"    for rec in predict_paths(p, {args!r}, batch_size=2):\n        print(json.dumps(rec))\n",
            unprivileged=True,
        )
    finally:
        _restore(tmp_path / "in")
    assert res.returncode == 1, res.stderr
    assert "Traceback" not in res.stderr and "Traceback" not in api.stderr, (res.stderr, api.stderr)
    for out in (res.stdout, api.stdout):
        records = [json.loads(line) for line in out.splitlines()]
        good = [r for r in records if "error" not in r]
        errors = [r for r in records if "error" in r]
        assert [r["path"] for r in good][0] == str(GOOD_IMAGES[0]) and good[-1]["path"] == str(GOOD_IMAGES[1])
        assert good[0]["label"] == "0" and good[-1]["label"] == "3"
        assert len(errors) == 1 and words in errors[0]["error"], errors
        assert [r["path"] for r in records].index(errors[0]["path"]) == 1 + (kind == "unreadable sub-folder")


def test_only_bad_paths_still_exit_1_with_records(demo_artifacts, tmp_path):
    res = CliRunner().invoke(
        main,
        ["predict", str(tmp_path / "nope.jpg"), str(tmp_path), "-a", str(demo_artifacts), "--json"],
        catch_exceptions=False,
    )
    assert res.exit_code == 1
    records = [json.loads(line) for line in res.stdout.splitlines()]
    assert [("error" in r) for r in records] == [True, True]


# ----------------------------------------------------------------------------- decompression bombs


def palette_png(width: int, height: int) -> bytes:
    """A 1-bit palette PNG written by hand: 90 Mpx in about 11 KB, without decoding anything."""

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    row = b"\x00" * (1 + (width + 7) // 8)
    comp = zlib.compressobj(9)
    idat = b"".join(comp.compress(row) for _ in range(height)) + comp.flush()
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 1, 3, 0, 0, 0))
        + chunk(b"PLTE", b"\x00\x00\x00\xff\xff\xff")
        + chunk(b"IDAT", idat)
        + chunk(b"IEND", b"")
    )


def test_bomb_at_pillows_warning_size_is_a_clean_per_image_error(demo_artifacts, tmp_path):
    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(palette_png(9500, 9500))  # 90.25 Mpx: above Pillow's 89.5 Mpx warning, below its error
    res = run_cli("predict", str(bomb), str(GOOD_IMAGES[0]), "-a", str(demo_artifacts), "--json")  # -W default
    assert res.returncode == 1
    assert "DecompressionBombWarning" not in res.stderr and "PIL" not in res.stderr, res.stderr
    bad, good = [json.loads(line) for line in res.stdout.splitlines()]
    assert (
        "90250000 pixels exceeds the limit of 89478485" in bad["error"] and "runtime.max_image_pixels" in bad["error"]
    )
    assert good["label"] == "0"


def test_bomb_above_pillows_warning_is_accepted_cleanly_when_the_limit_allows(tmp_path, monkeypatch):
    """runtime.max_image_pixels decides, not Pillow's warning: above it, with a higher limit, the
    image is decoded and no warning escapes (Pillow's threshold is lowered here to keep it cheap)."""
    import warnings

    from PIL import Image

    from vitdeploy.base.errors import InputError
    from vitdeploy.runtime.images import load_image

    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 10_000)
    data = palette_png(150, 100)  # 15 000 px: above the lowered warning threshold, below its error (20 000)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning reaching the caller fails the test
        assert load_image(data, max_pixels=20_000).size == (150, 100)
        with pytest.raises(InputError, match="15000 pixels exceeds the limit of 12000"):
            load_image(data, max_pixels=12_000)
        with pytest.raises(InputError, match="decompression-bomb guard"):
            load_image(palette_png(300, 100), max_pixels=None)  # above Pillow's own error size: still clean


# ----------------------------------------------------------------------------- sizes from the command line


@pytest.mark.parametrize("value", ["1000000000", str(MAX_BATCH + 1)])
def test_predict_batch_size_is_bounded(demo_artifacts, value):
    res = CliRunner().invoke(
        main,
        ["predict", str(GOOD_IMAGES[0]), "-a", str(demo_artifacts), "--batch-size", value],
        catch_exceptions=False,
    )
    assert res.exit_code == 2
    assert_one_error_line(res.stderr, f"batch_size {value} is out of range", f"1..{MAX_BATCH}")


@pytest.mark.parametrize("value", ["1000000000", f"1,8,{MAX_BATCH + 1}"])
def test_bench_batch_sizes_are_bounded(demo_artifacts, value):
    res = CliRunner().invoke(
        main, ["bench", "-a", str(demo_artifacts), "--batch-sizes", value, "-b", "ort"], catch_exceptions=False
    )
    assert res.exit_code == 2
    assert_one_error_line(res.stderr, "--batch-sizes", "out of range", f"1..{MAX_BATCH}")


def test_api_batch_sizes_are_bounded(demo_artifacts):
    from vitdeploy.evaluate.bench import run_bench
    from vitdeploy.runtime.batch_predict import predict_paths
    from vitdeploy.runtime.predictor import Predictor

    with pytest.raises(ConfigError, match="out of range"):
        run_bench(demo_artifacts, batch_sizes=[1, 10**9])
    with (
        Predictor.from_artifacts(demo_artifacts, backend="ort") as p,
        pytest.raises(ConfigError, match="out of range"),
    ):
        predict_paths(p, [GOOD_IMAGES[0]], batch_size=10**9)
