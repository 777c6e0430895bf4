"""load_image / is_image_path / iter_image_paths: decoding, every mode to RGB, orientation,
animations, decompression bombs and every kind of bad input a user can hand us.

Bad files are generated here, in tmp_path or in memory; nothing binary is committed.
"""

from __future__ import annotations

import io
import struct
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageFile, features

from vitdeploy.base.errors import InputError
from vitdeploy.runtime.image_paths import is_image_path, iter_image_paths
from vitdeploy.runtime.images import MAX_IMAGE_PIXELS, SUPPORTED_FORMATS, load_image

# ---------------------------------------------------------------------------------------------
# helpers


def encode(img: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_with_header(width: int, height: int) -> bytes:
    """A syntactically valid PNG whose IHDR claims width x height, with a few bytes of data."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + png_chunk(b"IHDR", ihdr)
        + png_chunk(b"IDAT", zlib.compress(b"\x00" * 64))
        + png_chunk(b"IEND", b"")
    )


def noise(h: int, w: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def px(img: Image.Image, x: int = 0, y: int = 0) -> tuple[int, ...]:
    assert img.mode == "RGB"
    return tuple(int(v) for v in np.asarray(img)[y, x])


def close(a, b, tol: int = 1) -> bool:
    return all(abs(int(x) - int(y)) <= tol for x, y in zip(a, b))


# ---------------------------------------------------------------------------------------------
# formats and input kinds


@pytest.mark.parametrize("fmt", sorted(SUPPORTED_FORMATS))
def test_every_supported_format_decodes_to_rgb(tmp_path: Path, fmt: str) -> None:
    if fmt == "WEBP" and not features.check("webp"):
        pytest.skip("Pillow built without WebP")
    arr = np.zeros((12, 20, 3), np.uint8)
    arr[:, :10] = (200, 30, 40)
    arr[:, 10:] = (10, 220, 90)
    kw = {"lossless": True} if fmt == "WEBP" else {}
    if fmt == "JPEG":
        kw = {"quality": 95}
    path = tmp_path / f"img.{fmt.lower()}"
    path.write_bytes(encode(Image.fromarray(arr), fmt, **kw))
    img = load_image(path)
    assert img.mode == "RGB" and img.size == (20, 12)
    tol = 6 if fmt in ("JPEG", "GIF") else 0
    assert close(px(img, 2, 6), (200, 30, 40), tol) and close(px(img, 17, 6), (10, 220, 90), tol)


def test_path_bytes_pil_and_array_inputs_give_identical_pixels(tmp_path: Path) -> None:
    arr = noise(31, 47)
    data = encode(Image.fromarray(arr), "PNG")
    path = tmp_path / "x.png"
    path.write_bytes(data)
    expected = np.asarray(load_image(path))
    np.testing.assert_array_equal(expected, arr)
    opened = Image.open(io.BytesIO(data))
    for source in (str(path), data, bytearray(data), memoryview(data), opened, arr):
        np.testing.assert_array_equal(np.asarray(load_image(source)), expected)


def test_array_shapes(tmp_path: Path) -> None:
    grey = np.full((3, 4), 77, np.uint8)
    for a in (grey, grey[:, :, None]):
        img = load_image(a)
        assert img.size == (4, 3) and px(img) == (77, 77, 77)
    rgba = np.zeros((2, 2, 4), np.uint8)
    rgba[..., 1] = 255  # green, fully transparent -> background
    assert px(load_image(rgba, background=(1, 2, 3))) == (1, 2, 3)
    # non-contiguous views are fine
    big = noise(10, 10)
    np.testing.assert_array_equal(np.asarray(load_image(big[::2, ::3])), big[::2, ::3])


@pytest.mark.parametrize(
    ("array", "needle"),
    [
        (np.zeros((4, 4, 3), np.float32), "dtype float32"),
        (np.zeros((4, 4, 3), np.uint16), "dtype uint16"),
        (np.zeros((3, 4, 4, 3), np.uint8), "shape (3, 4, 4, 3)"),
        (np.zeros((3, 8, 8), np.uint8), "shape (3, 8, 8)"),  # CHW by mistake
        (np.zeros((0, 5, 3), np.uint8), "no pixels (5x0)"),
        (np.zeros((5, 0), np.uint8), "no pixels (0x5)"),
    ],
)
def test_bad_arrays_are_input_errors(array: np.ndarray, needle: str) -> None:
    with pytest.raises(InputError) as err:
        load_image(array)
    assert "<array>" in str(err.value) and needle in str(err.value)


def test_unsupported_python_type() -> None:
    with pytest.raises(InputError, match="unsupported image input of type int"):
        load_image(42)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# bad files


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.jpg"
    with pytest.raises(InputError) as err:
        load_image(missing)
    assert str(missing) in str(err.value) and "no such file" in str(err.value)


def test_directory_instead_of_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="is a directory"):
        load_image(tmp_path)


def test_empty_file_and_empty_bytes(tmp_path: Path) -> None:
    empty = tmp_path / "empty.png"
    empty.write_bytes(b"")
    with pytest.raises(InputError) as err:
        load_image(empty)
    assert str(empty) in str(err.value) and "empty" in str(err.value)
    with pytest.raises(InputError, match=r"<bytes>: empty"):
        load_image(b"")


def test_text_renamed_jpg(tmp_path: Path) -> None:
    fake = tmp_path / "notes.jpg"
    fake.write_text("shopping list: eggs, milk\n")
    with pytest.raises(InputError) as err:
        load_image(fake)
    msg = str(err.value)
    assert str(fake) in msg and "not a recognised image" in msg and "looks like text" in msg


def test_truncated_jpeg(tmp_path: Path) -> None:
    data = encode(Image.fromarray(noise(96, 128)), "JPEG", quality=90)
    for cut in (len(data) // 2, len(data) - 20):
        path = tmp_path / f"cut{cut}.jpg"
        path.write_bytes(data[:cut])
        with pytest.raises(InputError) as err:
            load_image(path)
        assert str(path) in str(err.value) and "truncated" in str(err.value)


def test_truncated_png(tmp_path: Path) -> None:
    data = encode(Image.fromarray(noise(64, 64)), "PNG")
    path = tmp_path / "cut.png"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError) as err:
        load_image(path)
    assert str(path) in str(err.value) and "truncated" in str(err.value)
    with pytest.raises(InputError, match="<bytes>: .*truncated"):
        load_image(data[:200])


def test_corrupt_bytes_inside_valid_container(tmp_path: Path) -> None:
    data = bytearray(encode(Image.fromarray(noise(64, 64)), "PNG"))
    data[100:140] = b"\xff" * 40  # breaks the zlib stream and the CRC
    with pytest.raises(InputError, match="<bytes>"):
        load_image(bytes(data))


def test_zero_sized_image_header() -> None:
    with pytest.raises(InputError) as err:
        load_image(png_with_header(0, 0))
    assert "<bytes>" in str(err.value) and "PNG" in str(err.value)


def test_zero_sized_pil_image() -> None:
    with pytest.raises(InputError, match=r"<PIL image>: image has no pixels \(0x0\)"):
        load_image(Image.new("RGB", (0, 0)))


@pytest.mark.parametrize("fmt", ["ICO", "PPM", "TGA", "PCX"])
def test_formats_outside_the_allow_list_are_refused(tmp_path: Path, fmt: str) -> None:
    path = tmp_path / f"img.{fmt.lower()}"
    path.write_bytes(encode(Image.new("RGB", (16, 16), (1, 2, 3)), fmt))
    with pytest.raises(InputError) as err:
        load_image(path)
    msg = str(err.value)
    assert str(path) in msg and "supported formats are BMP, GIF, JPEG, PNG, TIFF, WEBP" in msg


# ---------------------------------------------------------------------------------------------
# decompression bombs


def test_bomb_header_refused_before_decoding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "bomb.png"
    path.write_bytes(png_with_header(20000, 20000))  # 400 Mpx claimed, ~100 bytes on disk

    decoded = []  # Image.load is where Pillow allocates and decodes pixels: it must never run

    def record_load(self, *args, **kwargs):
        decoded.append(self.size)
        raise MemoryError("decoding a 400 Mpx bomb")

    monkeypatch.setattr(Image.Image, "load", record_load)
    monkeypatch.setattr(ImageFile.ImageFile, "load", record_load)
    with pytest.raises(InputError) as err:
        load_image(path)
    msg = str(err.value)
    assert str(path) in msg and "400000000" in msg and "before decoding" in msg
    assert str(MAX_IMAGE_PIXELS) in msg  # names the limit
    assert decoded == []  # refused from the header alone: nothing was allocated or decoded


def test_configured_limit_is_checked_before_decoding(tmp_path: Path) -> None:
    path = tmp_path / "big.png"
    # A real 100x100 image: decoding it would succeed, so only the size check can refuse it.
    path.write_bytes(encode(Image.fromarray(noise(100, 100)), "PNG"))
    with pytest.raises(InputError) as err:
        load_image(path, max_pixels=5000)
    msg = str(err.value)
    assert str(path) in msg and "100x100 = 10000 pixels" in msg and "limit of 5000" in msg
    assert load_image(path, max_pixels=10000).size == (100, 100)
    assert load_image(path, max_pixels=None).size == (100, 100)
    # same limit for decoded inputs
    with pytest.raises(InputError, match="<array>: 100x100 = 10000 pixels"):
        load_image(noise(100, 100), max_pixels=5000)


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
def test_bomb_between_pillow_warning_and_error_thresholds() -> None:
    data = png_with_header(10000, 10000)  # 100 Mpx: Pillow only warns, our limit refuses
    with pytest.raises(InputError, match="10000x10000 = 100000000 pixels"):
        load_image(data)


def test_bomb_warning_promoted_to_error_is_still_an_input_error() -> None:
    data = png_with_header(10000, 10000)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(InputError, match="<bytes>: .*refused before decoding"):
            load_image(data)


def test_raising_max_pixels_cannot_bypass_pillow_ceiling() -> None:
    with pytest.raises(InputError, match="400000000 pixels"):
        load_image(png_with_header(20000, 20000), max_pixels=10**10)


# ---------------------------------------------------------------------------------------------
# modes


def test_rgba_half_alpha_red_over_white_and_custom_background(tmp_path: Path) -> None:
    rgba = Image.new("RGBA", (4, 4), (255, 0, 0, 128))
    path = tmp_path / "a.png"
    path.write_bytes(encode(rgba, "PNG"))
    assert close(px(load_image(path)), (255, 128, 128))
    assert close(px(load_image(rgba)), (255, 128, 128))
    assert close(px(load_image(path, background=(0, 0, 0))), (128, 0, 0))
    clear = Image.new("RGBA", (2, 2), (9, 9, 9, 0))
    assert px(load_image(clear, background=(10, 20, 30))) == (10, 20, 30)
    assert px(load_image(Image.new("RGBA", (2, 2), (9, 8, 7, 255)))) == (9, 8, 7)


def test_la_and_pa_composited() -> None:
    assert close(px(load_image(Image.new("LA", (2, 2), (0, 128)))), (127, 127, 127))
    pa = Image.new("PA", (2, 2))
    pa.putpalette([0, 0, 255] + [0, 0, 0] * 255)
    pa.putdata([(0, 0)] * 4)  # palette index 0 (blue), alpha 0 -> background
    assert px(load_image(pa, background=(5, 6, 7))) == (5, 6, 7)
    pa.putdata([(0, 255)] * 4)
    assert px(load_image(pa)) == (0, 0, 255)


def test_palette_with_trns_composited(tmp_path: Path) -> None:
    p = Image.new("P", (4, 1))
    p.putpalette([0, 255, 0, 255, 0, 0] + [0, 0, 0] * 254)
    p.putdata([0, 1, 0, 1])  # index 0 green (transparent), index 1 red
    path = tmp_path / "p.png"
    path.write_bytes(encode(p, "PNG", transparency=0))
    reopened = Image.open(path)
    assert reopened.mode == "P" and "transparency" in reopened.info  # a real tRNS chunk
    img = load_image(path)
    assert px(img, 0) == (255, 255, 255) and px(img, 1) == (255, 0, 0)
    assert px(load_image(path, background=(0, 0, 0)), 2) == (0, 0, 0)
    gif = tmp_path / "p.gif"
    gif.write_bytes(encode(p, "GIF", transparency=0))
    g = load_image(gif)
    assert px(g, 0) == (255, 255, 255) and px(g, 1) == (255, 0, 0)


def test_palette_without_transparency() -> None:
    p = Image.new("P", (2, 1))
    p.putpalette([10, 20, 30, 200, 100, 50] + [0, 0, 0] * 254)
    p.putdata([1, 0])
    img = load_image(p)
    assert px(img, 0) == (200, 100, 50) and px(img, 1) == (10, 20, 30)


def test_rgb_with_colour_key_transparency(tmp_path: Path) -> None:
    arr = np.zeros((1, 2, 3), np.uint8)
    arr[0, 1] = (50, 60, 70)
    path = tmp_path / "key.png"
    path.write_bytes(encode(Image.fromarray(arr), "PNG", transparency=(0, 0, 0)))
    img = load_image(path, background=(200, 200, 200))
    assert px(img, 0) == (200, 200, 200) and px(img, 1) == (50, 60, 70)


def test_cmyk_pure_cyan(tmp_path: Path) -> None:
    cyan = Image.new("CMYK", (4, 4), (255, 0, 0, 0))
    assert px(load_image(cyan)) == (0, 255, 255)
    path = tmp_path / "c.tif"
    path.write_bytes(encode(cyan, "TIFF"))
    assert px(load_image(path)) == (0, 255, 255)
    jpg = tmp_path / "c.jpg"
    jpg.write_bytes(encode(cyan, "JPEG", quality=100))
    assert close(px(load_image(jpg)), (0, 255, 255), 2)


def test_16bit_greyscale_scaled_by_bit_depth_not_clipped(tmp_path: Path) -> None:
    values = np.array([[0, 257, 128 * 257, 65535]], dtype=np.uint16)
    expected = [0, 1, 128, 255]
    img16 = Image.fromarray(values)
    assert img16.mode == "I;16"
    for fmt in ("PNG", "TIFF"):
        path = tmp_path / f"g16.{fmt.lower()}"
        path.write_bytes(encode(img16, fmt))
        got = np.asarray(load_image(path))[0, :, 0]
        assert got.tolist() == expected, fmt
    big_endian = Image.frombytes("I;16B", (4, 1), values.astype(">u2").tobytes())
    assert np.asarray(load_image(big_endian))[0, :, 0].tolist() == expected
    assert np.asarray(load_image(img16))[0, :, 1].tolist() == expected


def test_32bit_integer_greyscale() -> None:
    # Mode "I" holding 16-bit data (older Pillow PNG decoders, user-made images): 16-bit scale.
    as_i = Image.fromarray(np.array([[0, 257, 65535]], dtype=np.int32))
    assert as_i.mode == "I"
    assert np.asarray(load_image(as_i))[0, :, 0].tolist() == [0, 1, 255]
    # A signed 32-bit TIFF uses its full range: -2**31 -> 0, 0 -> 128, 2**31-1 -> 255.
    data = encode(Image.fromarray(np.array([[-(2**31), 0, 2**31 - 1]], dtype=np.int32)), "TIFF")
    assert np.asarray(load_image(data))[0, :, 0].tolist() == [0, 128, 255]


def test_float_greyscale() -> None:
    unit = Image.fromarray(np.array([[0.0, 0.25, 1.0]], dtype=np.float32))
    assert unit.mode == "F"
    assert np.asarray(load_image(unit))[0, :, 0].tolist() == [0, 64, 255]
    wide = Image.fromarray(np.array([[-5.0, 12.4, 300.0]], dtype=np.float32))
    assert np.asarray(load_image(wide))[0, :, 0].tolist() == [0, 12, 255]
    with pytest.raises(InputError, match="NaN"):
        load_image(Image.fromarray(np.array([[np.nan, 1.0]], dtype=np.float32)))


def test_one_bit_l_ycbcr_hsv_lab() -> None:
    one = Image.new("1", (2, 1))
    one.putpixel((1, 0), 1)
    img = load_image(one)
    assert px(img, 0) == (0, 0, 0) and px(img, 1) == (255, 255, 255)
    assert px(load_image(Image.new("L", (1, 1), 77))) == (77, 77, 77)
    red_ycc = Image.new("RGB", (1, 1), (255, 0, 0)).convert("YCbCr")
    assert red_ycc.mode == "YCbCr" and close(px(load_image(red_ycc)), (255, 0, 0), 2)
    assert close(px(load_image(Image.new("HSV", (1, 1), (0, 255, 255)))), (255, 0, 0), 1)
    # CIE L*a*b* goes through littlecms: L=100%, a=b=0 (stored +128) is white, not raw bytes.
    assert close(px(load_image(Image.new("LAB", (1, 1), (255, 128, 128)))), (255, 255, 255), 2)


def test_pil_input_is_not_modified() -> None:
    rgba = Image.new("RGBA", (3, 3), (255, 0, 0, 128))
    before = np.asarray(rgba).copy()
    load_image(rgba)
    assert rgba.mode == "RGBA"
    np.testing.assert_array_equal(np.asarray(rgba), before)


# ---------------------------------------------------------------------------------------------
# orientation and animation


def _two_tone(w: int, h: int) -> Image.Image:
    """Left half red, right half blue."""
    arr = np.zeros((h, w, 3), np.uint8)
    arr[:, : w // 2] = (255, 0, 0)
    arr[:, w // 2 :] = (0, 0, 255)
    return Image.fromarray(arr)


def _with_orientation(img: Image.Image, fmt: str, orientation: int, **kw) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return encode(img, fmt, exif=exif.tobytes(), **kw)


def test_exif_orientation_6_rotates_jpeg(tmp_path: Path) -> None:
    # Stored 40 wide x 20 high; orientation 6 = rotate 90 degrees clockwise to display.
    path = tmp_path / "rot.jpg"
    path.write_bytes(_with_orientation(_two_tone(40, 20), "JPEG", 6, quality=95))
    img = load_image(path)
    assert img.size == (20, 40)
    assert close(px(img, 10, 3), (255, 0, 0), 8)  # stored left (red) is now on top
    assert close(px(img, 10, 36), (0, 0, 255), 8)
    # The same file as bytes or as an opened PIL image is rotated the same way.
    np.testing.assert_array_equal(np.asarray(load_image(path.read_bytes())), np.asarray(img))
    np.testing.assert_array_equal(np.asarray(load_image(Image.open(path))), np.asarray(img))


@pytest.mark.parametrize(
    ("orientation", "size", "red_at"), [(1, (40, 20), (3, 10)), (3, (40, 20), (36, 10)), (8, (20, 40), (10, 36))]
)
def test_other_orientations_png(tmp_path: Path, orientation: int, size, red_at) -> None:
    data = _with_orientation(_two_tone(40, 20), "PNG", orientation)
    img = load_image(data)
    assert img.size == size and px(img, *red_at) == (255, 0, 0)


def test_animated_gif_webp_apng_first_frame(tmp_path: Path) -> None:
    frames = [Image.new("RGB", (8, 8), c) for c in ((255, 0, 0), (0, 255, 0), (0, 0, 255))]
    kinds = [("GIF", {}), ("PNG", {})]
    if features.check("webp"):
        kinds.append(("WEBP", {"lossless": True}))
    for fmt, kw in kinds:
        path = tmp_path / f"anim.{fmt.lower()}"
        data = encode(frames[0], fmt, save_all=True, append_images=frames[1:], duration=50, **kw)
        path.write_bytes(data)
        opened = Image.open(path)
        assert getattr(opened, "n_frames", 1) == 3, fmt  # really animated
        assert px(load_image(path)) == (255, 0, 0), fmt
        assert px(load_image(path.read_bytes())) == (255, 0, 0), fmt


def test_multipage_tiff_first_page(tmp_path: Path) -> None:
    pages = [Image.new("RGB", (4, 4), c) for c in ((1, 2, 3), (200, 100, 0))]
    path = tmp_path / "pages.tif"
    path.write_bytes(encode(pages[0], "TIFF", save_all=True, append_images=pages[1:]))
    assert px(load_image(path)) == (1, 2, 3)


def test_tiny_and_extreme_aspect_images_load() -> None:
    assert load_image(np.zeros((1, 1, 3), np.uint8)).size == (1, 1)
    assert load_image(encode(Image.new("RGB", (10000, 1)), "PNG")).size == (10000, 1)
    assert load_image(encode(Image.new("L", (1, 10000)), "PNG")).size == (1, 10000)


# ---------------------------------------------------------------------------------------------
# paths


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("a.jpg", True),
        ("a.JPEG", True),
        ("a.Png", True),
        ("x/y.webp", True),
        ("a.tif", True),
        ("a.tiff", True),
        ("a.bmp", True),
        ("a.gif", True),
        ("a.jfif", True),
        ("a.txt", False),
        ("a.heic", False),
        ("jpg", False),
        ("a.jpg.txt", False),
        ("a.svg", False),
    ],
)
def test_is_image_path(name: str, expected: bool) -> None:
    assert is_image_path(name) is expected
    assert is_image_path(Path(name)) is expected


def test_iter_image_paths_walks_sorted_and_keeps_files_as_given(tmp_path: Path) -> None:
    root = tmp_path / "imgs"
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / ".hidden").mkdir()
    for rel in ("b.jpg", "a.png", "sub/c.JPG", "sub/deeper/d.webp", ".hidden/e.png", ".f.png"):
        (root / rel).write_bytes(b"x")
    (root / "notes.txt").write_text("no")
    single = tmp_path / "odd_name.dat"
    single.write_bytes(b"x")
    got = iter_image_paths([single, str(root)])
    assert got == [single, root / "a.png", root / "b.jpg", root / "sub" / "c.JPG", root / "sub" / "deeper" / "d.webp"]
    assert all(isinstance(p, Path) for p in got)


def test_iter_image_paths_errors(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    with pytest.raises(InputError) as err:
        iter_image_paths([missing])
    assert str(missing) in str(err.value) and "no such file" in str(err.value)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "readme.txt").write_text("x")
    with pytest.raises(InputError) as err:
        iter_image_paths([empty])
    assert str(empty) in str(err.value) and "no images" in str(err.value)
    assert iter_image_paths([]) == []


def test_keep_grey_returns_l_only_for_greyscale_without_alpha() -> None:
    assert load_image(np.zeros((2, 2), np.uint8), keep_grey=True).mode == "L"
    assert load_image(Image.new("1", (2, 2)), keep_grey=True).mode == "L"
    sixteen = Image.fromarray(np.array([[0, 65535]], dtype=np.uint16))
    assert np.asarray(load_image(sixteen, keep_grey=True)).tolist() == [[0, 255]]
    assert load_image(Image.new("LA", (2, 2)), keep_grey=True).mode == "RGB"
    assert load_image(np.zeros((2, 2, 3), np.uint8), keep_grey=True).mode == "RGB"
    assert load_image(np.zeros((2, 2), np.uint8)).mode == "RGB"


def test_premultiplied_alpha_modes() -> None:
    # RGBa / La store colour premultiplied by alpha: (100, 0, 0) at alpha 128 is red 199.
    rgba = load_image(Image.new("RGBa", (1, 1), (100, 0, 0, 128)), background=(0, 0, 0))
    assert close(px(rgba), (100, 0, 0))
    la = load_image(Image.new("La", (1, 1), (100, 128)), background=(0, 0, 0))
    assert close(px(la), (100, 100, 100))
