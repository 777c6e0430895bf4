"""batch-predict's inputs: list files, globs and URIs expand to the files predict would read, bad ones kept."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from vitdeploy.base.errors import InputError
from vitdeploy.batch.inputs import expand_inputs, read_key
from vitdeploy.demo import IMAGES_DIR
from vitdeploy.runtime.image_paths import expand_image_paths


@pytest.fixture()
def photos(tmp_path) -> Path:
    root = tmp_path / "photos"
    (root / "sub").mkdir(parents=True)
    for src in sorted(IMAGES_DIR.glob("digit[01]_*"))[:4]:
        shutil.copy(src, root / src.name)
    shutil.copy(next(IMAGES_DIR.glob("digit2_*.png")), root / "sub" / "deep.png")
    (root / ".hidden.png").write_bytes(b"x")
    (root / "notes.txt").write_text("not an image")
    return root


def test_a_folder_expands_as_predict_expands_it(photos):
    items = expand_inputs([str(photos)])
    assert [it.path for it in items] == [str(p) for p, _ in expand_image_paths([photos])]
    assert all(it.error is None and Path(it.read).is_absolute() for it in items)


def test_a_list_file_with_a_missing_path_keeps_the_others(photos, tmp_path):
    names = sorted(p.name for p in photos.glob("*.png"))[:2]
    listing = photos / "list.txt"
    listing.write_text(f"# three paths\n{names[0]}\n\n{photos / names[1]}\nmissing.jpg\n")
    items = expand_inputs([str(listing)])
    assert [it.path for it in items] == [str(photos / names[0]), str(photos / names[1]), str(photos / "missing.jpg")]
    assert [it.error is None for it in items] == [True, True, False]
    assert items[2].error == f"{photos / 'missing.jpg'}: no such file or directory"


def test_csv_and_parquet_lists_read_their_path_column(photos, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = sorted(str(p) for p in photos.glob("*.jpg"))
    (tmp_path / "l.csv").write_text("id,path\n" + "".join(f"{i},{p}\n" for i, p in enumerate(files)))
    pq.write_table(pa.table({"path": files, "other": list(range(len(files)))}), tmp_path / "l.parquet")
    assert [it.path for it in expand_inputs([str(tmp_path / "l.csv")])] == files
    assert [it.path for it in expand_inputs([str(tmp_path / "l.parquet")])] == files
    (tmp_path / "bad.csv").write_text("file\na.jpg\n")
    with pytest.raises(InputError, match=r"bad\.csv: no 'path' column \(columns: file\)"):
        expand_inputs([str(tmp_path / "bad.csv")])


def test_a_glob_matches_like_a_shell_and_an_empty_glob_is_an_error_row(photos):
    items = expand_inputs([str(photos / "*.jpg"), str(photos / "**" / "*.png"), str(photos / "*.gif")])
    jpgs = sorted(str(p) for p in photos.glob("*.jpg"))
    pngs = sorted(str(p) for p in photos.glob("**/*.png") if not p.name.startswith("."))
    assert [it.path for it in items[:-1]] == jpgs + pngs
    assert items[-1].error == f"{photos / '*.gif'}: no file matches the pattern"


def test_file_uris_walk_folders_match_globs_and_report_missing_paths(photos):
    uri = photos.resolve().as_uri()
    folder = expand_inputs([uri])
    assert [it.path for it in folder] == sorted(
        f"file://{p.resolve()}"
        for p in photos.rglob("*")
        if p.suffix in (".png", ".jpg") and not p.name.startswith(".")
    )
    assert all(read_key(it.read) == it.read and Path(it.read).is_file() for it in folder)
    (one,) = expand_inputs([f"{uri}/sub/deep.png"])
    assert one.path == f"{uri}/sub/deep.png" and one.error is None
    globbed = expand_inputs([f"{uri}/*.jpg"])
    assert [it.path for it in globbed] == [f"file://{p.resolve()}" for p in sorted(photos.glob("*.jpg"))]
    (gone,) = expand_inputs([f"{uri}/gone.png"])
    assert gone.error == f"{uri}/gone.png: no such file or directory"


def test_the_same_file_given_twice_is_read_once(photos):
    one = sorted(photos.glob("*.jpg"))[0]
    items = expand_inputs([str(one), str(one), str(photos)])
    assert [it.read for it in items].count(str(one.absolute())) == 1
