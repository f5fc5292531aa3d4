"""Image data readers on small files the tests write: MNIST IDX files, BMP class folders, generated digits.

Good files read back exactly (pixels scaled to [0, 1] once, labels one-hot);
every bad case -- missing files, wrong magic, truncated or overlong files,
corrupt gzip, count mismatch, labels out of range, BMPs of the wrong size or
depth, compressed or colour BMPs in a grayscale set, a pixel offset inside the
headers, empty class folders -- is a DataError that names the offending file
or folder and what was expected, and no data come back. Bad arguments (an
image shape that is not (H, W, C), a channel count other than 1 or 3) are
refused by name before any file is read.
"""
from __future__ import annotations

import gzip
import re
import struct

import numpy as np
import pytest

from gpuengine.data.checks import DataError
from gpuengine.data.formats.bmp import load_bmp_folder, read_bmp, write_bmp
from gpuengine.data.formats.mnist import (IMAGE_MAGIC, LABEL_MAGIC, digits_data, load_idx, make_digits, read_idx,
    write_idx)
from gpuengine.data.labels import one_hot

RNG = np.random.default_rng(0)
IMAGES = RNG.integers(0, 256, (6, 28, 28), dtype=np.uint8)
LABELS = np.array([0, 3, 9, 3, 1, 0], np.uint8)


@pytest.fixture
def idx_pair(tmp_path):
    images, labels = tmp_path / "images-idx3-ubyte", tmp_path / "labels-idx1-ubyte"
    write_idx(images, IMAGES)
    write_idx(labels, LABELS)
    return images, labels


# -- IDX -------------------------------------------------------------------------------

def test_idx_round_trip_scales_pixels_and_one_hots_labels(idx_pair):
    x, t = load_idx(*idx_pair)
    assert x.dtype == np.float32 and x.shape == (6, 28, 28, 1)
    np.testing.assert_array_equal(x[..., 0], IMAGES / np.float32(255))
    np.testing.assert_array_equal(t, np.eye(10, dtype=np.float32)[LABELS])


def test_idx_headers_carry_the_mnist_magic_numbers(idx_pair):
    images, labels = idx_pair
    assert struct.unpack(">I", images.read_bytes()[:4])[0] == IMAGE_MAGIC == 2051
    assert struct.unpack(">I", labels.read_bytes()[:4])[0] == LABEL_MAGIC == 2049


def test_gzipped_idx_files_are_read(idx_pair, tmp_path):
    zipped = []
    for path in idx_pair:
        target = tmp_path / (path.name + ".gz")
        target.write_bytes(gzip.compress(path.read_bytes()))
        zipped.append(target)
    for a, b in zip(load_idx(*zipped), load_idx(*idx_pair)):
        np.testing.assert_array_equal(a, b)


def _damage(path, data: bytes):
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("damage, message", [
    (lambda d: d[:-5], "truncated"),
    (lambda d: d + b"\0\0", "trailing bytes"),
    (lambda d: d[:6], "too short"),
    (lambda d: struct.pack(">I", 2049) + d[4:], "magic number 2049, expected 2051"),
])
def test_bad_image_file_is_named(idx_pair, damage, message):
    images, labels = idx_pair
    _damage(images, damage(images.read_bytes()))
    with pytest.raises(DataError, match=message) as info:
        load_idx(images, labels)
    assert str(images) in str(info.value)


def test_corrupt_gzip_is_named(idx_pair, tmp_path):
    images, labels = idx_pair
    bad = _damage(tmp_path / "images.gz", gzip.compress(images.read_bytes())[:40])
    with pytest.raises(DataError, match="corrupt gzip") as info:
        load_idx(bad, labels)
    assert str(bad) in str(info.value)


def test_image_and_label_counts_must_agree(idx_pair):
    images, labels = idx_pair
    write_idx(labels, LABELS[:4])
    with pytest.raises(DataError, match="6 images but .* 4 labels"):
        load_idx(images, labels)


def test_label_out_of_range_is_named(idx_pair):
    images, labels = idx_pair
    write_idx(labels, np.array([0, 3, 10, 3, 1, 0], np.uint8))
    with pytest.raises(DataError, match="label 10 at index 2 is out of range for 10 classes") as info:
        load_idx(images, labels)
    assert str(labels) in str(info.value)


@pytest.mark.parametrize("which, kind, magic", [(0, "images", IMAGE_MAGIC), (1, "labels", LABEL_MAGIC)])
def test_a_missing_idx_file_is_named_with_what_was_expected(idx_pair, which, kind, magic):
    """Was a raw FileNotFoundError; a missing labels file is named before the images are read."""
    paths = list(idx_pair)
    paths[which] = paths[which].with_name("missing-idx")
    with pytest.raises(DataError, match=rf"missing-idx: no such file; expected an IDX file of unsigned-byte {kind} "
                                        rf"\(magic {magic}, gzipped or not\)$"):
        load_idx(*paths)


def test_labels_read_as_images_are_refused(idx_pair):
    with pytest.raises(DataError, match="expected 2051"):
        read_idx(idx_pair[1], IMAGE_MAGIC)


def test_one_hot_refuses_negative_and_fractional_labels():
    with pytest.raises(DataError, match="label -1 at index 1"):
        one_hot(np.array([0, -1]), 3, "mine")
    with pytest.raises(DataError, match="whole numbers"):
        one_hot(np.array([0.5]), 3, "mine")


# -- BMP -------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(5, 3), (4, 7, 1), (6, 5, 3)])
def test_bmp_round_trip(tmp_path, shape):
    image = RNG.integers(0, 256, shape, dtype=np.uint8)
    write_bmp(tmp_path / "a.bmp", image)
    channels = 3 if len(shape) == 3 and shape[2] == 3 else 1
    np.testing.assert_array_equal(read_bmp(tmp_path / "a.bmp", channels), image.reshape(shape[:2] + (channels,)))


def test_gray_pixels_stored_as_24_bit_read_as_one_channel(tmp_path):
    gray = RNG.integers(0, 256, (4, 6, 1), dtype=np.uint8)
    write_bmp(tmp_path / "g.bmp", np.repeat(gray, 3, axis=2))
    np.testing.assert_array_equal(read_bmp(tmp_path / "g.bmp", 1), gray)


def test_top_down_bmp_rows(tmp_path):
    image = RNG.integers(0, 256, (3, 4), dtype=np.uint8)
    write_bmp(tmp_path / "a.bmp", image)
    data = bytearray((tmp_path / "a.bmp").read_bytes())
    offset = struct.unpack_from("<I", data, 10)[0]
    rows = np.frombuffer(bytes(data[offset:]), np.uint8).reshape(3, 4)
    data[offset:] = rows[::-1].tobytes()            # store rows top-down ...
    struct.pack_into("<i", data, 22, -3)            # ... and say so with a negative height
    (tmp_path / "a.bmp").write_bytes(bytes(data))
    np.testing.assert_array_equal(read_bmp(tmp_path / "a.bmp")[..., 0], image)


def _class_folder(root, counts=(2, 3, 1), size=8):
    for c, count in enumerate(counts):
        folder = root / f"class_{c}"
        folder.mkdir(parents=True)
        for i in range(count):
            write_bmp(folder / f"{i}.bmp", np.full((size, size), 10 * c + i, np.uint8))
    return root


def test_bmp_folder_loads_classes_in_sorted_order(tmp_path):
    x, t, names = load_bmp_folder(_class_folder(tmp_path / "data"), (8, 8, 1))
    assert names == ["class_0", "class_1", "class_2"] and x.shape == (6, 8, 8, 1) and x.dtype == np.float32
    np.testing.assert_array_equal(t.argmax(axis=1), [0, 0, 1, 1, 1, 2])
    np.testing.assert_allclose(x[:, 0, 0, 0], np.array([0, 1, 10, 11, 12, 20]) / 255.0)


def _patch(path, offset, fmt, value):
    data = bytearray(path.read_bytes())
    struct.pack_into(fmt, data, offset, value)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("spoil, message", [
    (lambda p: write_bmp(p, np.zeros((9, 8), np.uint8)), "is 8x9 pixels, the data set's images are 8x8"),
    (lambda p: _patch(p, 28, "<H", 16), "16-bit BMP"),
    (lambda p: _patch(p, 28, "<H", 32), "32-bit BMP"),
    (lambda p: _patch(p, 30, "<I", 1), "compressed BMP"),
    (lambda p: p.write_bytes(p.read_bytes()[:-10]), "truncated"),
    (lambda p: p.write_bytes(b"PK" + p.read_bytes()[2:]), "not a Windows BMP"),
    (lambda p: write_bmp(p, RNG.integers(0, 256, (8, 8, 3), dtype=np.uint8)), "has colour"),
    (lambda p: _patch(p, 10, "<I", 0), "pixel data offset 0 points into the headers"),
])
def test_bad_bmp_in_a_folder_is_named_and_nothing_loads(tmp_path, spoil, message):
    root = _class_folder(tmp_path / "data")
    bad = root / "class_1" / "1.bmp"
    spoil(bad)
    with pytest.raises(DataError, match=message) as info:
        load_bmp_folder(root, (8, 8, 1))
    assert str(bad) in str(info.value)


def test_a_24_bit_bmp_whose_pixel_offset_points_into_the_headers_is_refused(tmp_path):
    """Offset 0 read the headers as pixels: garbage, silently."""
    write_bmp(tmp_path / "c.bmp", RNG.integers(0, 256, (4, 4, 3), dtype=np.uint8))
    _patch(tmp_path / "c.bmp", 10, "<I", 0)
    with pytest.raises(DataError, match=r"c.bmp: pixel data offset 0 points into the headers; expected an offset "
                                        r">= 54, where they end"):
        read_bmp(tmp_path / "c.bmp", 3)


def test_a_missing_bmp_is_named_with_what_was_expected(tmp_path):
    with pytest.raises(DataError, match=r"none.bmp: no such file; expected an uncompressed 8- or 24-bit BMP image$"):
        read_bmp(tmp_path / "none.bmp")


@pytest.mark.parametrize("shape, allowed", [((8, 8), "a tuple of 3 whole numbers >= 1"),
                                            ((8, -8, 1), "a tuple of 3 whole numbers >= 1"),
                                            ("8x8", "a tuple of 3 whole numbers >= 1"),
                                            ((8, 8, 2), r"\(height, width, channels\) with channels 1 \(gray\) or 3")])
def test_an_image_shape_that_is_not_height_width_channels_is_refused_by_name(tmp_path, shape, allowed):
    """A 2-tuple was a raw IndexError once the first image had been read."""
    root = _class_folder(tmp_path / "data")
    with pytest.raises(DataError, match=rf"^image_shape={re.escape(repr(shape))} is not accepted; use {allowed}"):
        load_bmp_folder(root, shape)


def test_a_channel_count_other_than_gray_or_rgb_is_refused_before_reading(tmp_path):
    with pytest.raises(DataError, match=r"^channels=2 is not accepted; use one of 1, 3 \(1 for gray, 3 for RGB\)$"):
        read_bmp(tmp_path / "none.bmp", 2)


def test_empty_class_folder_is_named(tmp_path):
    root = _class_folder(tmp_path / "data")
    (root / "class_3").mkdir()
    with pytest.raises(DataError, match="empty class folder") as info:
        load_bmp_folder(root, (8, 8, 1))
    assert str(root / "class_3") in str(info.value)


def test_missing_or_flat_folder_is_refused(tmp_path):
    with pytest.raises(DataError, match="no such folder"):
        load_bmp_folder(tmp_path / "nowhere", (8, 8, 1))
    with pytest.raises(DataError, match="no class subfolders"):
        load_bmp_folder(tmp_path, (8, 8, 1))


# -- generated digits ------------------------------------------------------------------

def test_generated_digits_are_balanced_deterministic_and_in_range():
    x, t = digits_data(500, seed=3)
    assert x.shape == (500, 28, 28, 1) and x.dtype == np.float32 and 0 <= x.min() and x.max() <= 1
    np.testing.assert_array_equal(t.sum(axis=0), np.full(10, 50))
    again, _ = digits_data(500, seed=3)
    np.testing.assert_array_equal(x, again)
    assert not np.array_equal(x, digits_data(500, seed=4)[0])


@pytest.mark.parametrize("kwargs, given", [(dict(samples=10.5), "samples=10.5"), (dict(samples=10, classes=1),
                                           "classes=1"), (dict(samples=10, seed=-1), "seed=-1")])
def test_generated_digits_refuse_bad_arguments_by_name(kwargs, given):
    with pytest.raises(DataError, match=rf"^{given} is not accepted; use a whole number >= "):
        make_digits(**kwargs)


def test_generated_digits_carry_their_class():
    """Nearest class mean of one seed's images classifies another seed's well above chance (10%)."""
    train, train_labels = make_digits(2000, seed=0)
    test, test_labels = make_digits(500, seed=1)
    means = np.stack([train[train_labels == c].mean(axis=0) for c in range(10)]).reshape(10, -1)
    distances = ((test.reshape(500, 1, -1) - means[None]) ** 2).sum(axis=2)
    assert (distances.argmin(axis=1) == test_labels).mean() > 0.5
