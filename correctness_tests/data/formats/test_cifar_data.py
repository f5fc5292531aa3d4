"""CIFAR-shaped data on small files the tests write: binary batches, 32x32x3 BMP class folders, generated images.

Good batches read back exactly (CHW records as HWC images, the chosen label
byte); every bad case -- a missing, empty or truncated file, records of the
other variant's size, a label out of range -- is a DataError naming the file
(and the record), and nothing comes back. The generated images must carry
their class in the spatial pattern only: an oracle that knows the patterns
recovers it, the mean colour and the class-mean image do not.
"""
from __future__ import annotations

import numpy as np
import pytest

from gpuengine.data.checks import DataError
from gpuengine.data.formats.bmp import load_bmp_folder, write_bmp
from gpuengine.data.formats.cifar import (_class_grids, cifar_files, label_classes, load_cifar, make_images,
    read_cifar, read_cifar_batch, record_bytes, write_cifar_batch)

RNG = np.random.default_rng(0)
IMAGES = RNG.integers(0, 256, (5, 32, 32, 3), dtype=np.uint8)
LABELS10 = np.array([0, 9, 3, 3, 7])
LABELS100 = np.array([[0, 99], [19, 4], [7, 50], [7, 51], [12, 0]])   # (coarse, fine)


@pytest.fixture
def batch10(tmp_path):
    write_cifar_batch(tmp_path / "data_batch_1.bin", IMAGES, LABELS10, "cifar10")
    return tmp_path / "data_batch_1.bin"


@pytest.fixture
def batch100(tmp_path):
    write_cifar_batch(tmp_path / "train.bin", IMAGES, LABELS100, "cifar100")
    return tmp_path / "train.bin"


# -- binary batches --------------------------------------------------------------------

def test_record_sizes_and_classes():
    assert record_bytes("cifar10") == 3073 and record_bytes("cifar100") == 3074
    assert label_classes("cifar10") == 10
    assert (label_classes("cifar100"), label_classes("cifar100", coarse=True)) == (100, 20)


def test_cifar10_record_layout_is_label_then_red_green_blue_planes(tmp_path):
    """Bytes written by hand, not by the writer: pixel (r, c) of channel k is byte 1 + 1024 k + 32 r + c."""
    planes = np.arange(3072, dtype=np.int64) % 251
    (tmp_path / "one.bin").write_bytes(bytes([6]) + planes.astype(np.uint8).tobytes())
    images, labels = read_cifar_batch(tmp_path / "one.bin")
    assert images.shape == (1, 32, 32, 3) and images.dtype == np.uint8 and labels.tolist() == [6]
    for r, c, k in ((0, 0, 0), (0, 1, 0), (1, 0, 0), (31, 31, 0), (0, 0, 1), (5, 7, 2)):
        assert images[0, r, c, k] == planes[1024 * k + 32 * r + c]


def test_cifar10_round_trip_and_training_arrays(batch10):
    images, labels = read_cifar_batch(batch10)
    np.testing.assert_array_equal(images, IMAGES)
    assert labels.dtype == np.int64 and labels.tolist() == LABELS10.tolist()
    x, t = load_cifar(batch10)
    assert x.dtype == np.float32 and x.shape == (5, 32, 32, 3)
    np.testing.assert_array_equal(x, IMAGES / np.float32(255))
    np.testing.assert_array_equal(t, np.eye(10, dtype=np.float32)[LABELS10])


def test_cifar100_picks_the_fine_byte_by_default_and_the_coarse_on_request(batch100):
    images, fine = read_cifar_batch(batch100, "cifar100")
    _, coarse = read_cifar_batch(batch100, "cifar100", coarse=True)
    np.testing.assert_array_equal(images, IMAGES)
    assert fine.tolist() == LABELS100[:, 1].tolist() and coarse.tolist() == LABELS100[:, 0].tolist()
    assert load_cifar(batch100, "cifar100")[1].shape == (5, 100)
    np.testing.assert_array_equal(load_cifar(batch100, "cifar100", coarse=True)[1],
                                  np.eye(20, dtype=np.float32)[LABELS100[:, 0]])


def test_several_files_concatenate_in_the_order_given(tmp_path, batch10):
    second = tmp_path / "data_batch_2.bin"
    write_cifar_batch(second, IMAGES[:2][:, ::-1], np.array([1, 2]))
    images, labels = read_cifar([second, batch10])
    np.testing.assert_array_equal(images, np.concatenate([IMAGES[:2][:, ::-1], IMAGES]))
    assert labels.tolist() == [1, 2] + LABELS10.tolist()


def test_standard_file_names(tmp_path):
    assert [p.name for p in cifar_files(tmp_path)] == [f"data_batch_{i}.bin" for i in range(1, 6)]
    assert cifar_files(tmp_path, "cifar10", "test") == [tmp_path / "test_batch.bin"]
    assert cifar_files(tmp_path, "cifar100") == [tmp_path / "train.bin"]
    assert cifar_files(tmp_path, "cifar100", "test") == [tmp_path / "test.bin"]
    with pytest.raises(DataError, match="split='val' is not a CIFAR split"):
        cifar_files(tmp_path, "cifar10", "val")


@pytest.mark.parametrize("spoil, variant, message", [
    (lambda d: d[:-100], "cifar10", r"truncated record: 15265 bytes are 4 whole cifar10 records of 3073 bytes "
                                    r"and 2973 bytes of a truncated one"),
    (lambda d: d + bytes(5), "cifar10", r"wrong record size: 15370 bytes are 5 records of 3074 bytes \(cifar100\), "
                                        r"not whole cifar10 records of 3073 bytes \(1 label \+ 3072 pixel bytes\)"),
    (lambda d: d, "cifar100", r"wrong record size: 15365 bytes are 5 records of 3073 bytes \(cifar10\), not whole "
                              r"cifar100 records of 3074 bytes \(2 label \+ 3072 pixel bytes\)"),
    (lambda d: b"", "cifar10", "empty file"),
    (lambda d: d[:3073] + bytes([10]) + d[3074:], "cifar10", "record 1 has label 10, out of range for 10 classes "
                                                             r"\(0..9\); 1 records are out of range"),
])
def test_bad_batch_file_is_named(batch10, spoil, variant, message):
    batch10.write_bytes(spoil(batch10.read_bytes()))
    with pytest.raises(DataError, match=message) as info:
        read_cifar_batch(batch10, variant)
    assert str(batch10) in str(info.value)


@pytest.mark.parametrize("labels, message", [
    ([[0, 99], [19, 4], [7, 100], [7, 51], [12, 0]], "record 2 has fine label 100, out of range for 100 classes"),
    ([[0, 99], [20, 4], [7, 50], [21, 51], [12, 0]], r"record 1 has coarse label 20, out of range for 20 classes "
                                                     r"\(0..19\); 2 records"),
])
@pytest.mark.parametrize("coarse", [False, True])
def test_cifar100_label_out_of_range_is_named_whichever_labels_are_read(batch100, labels, message, coarse):
    write_cifar_batch(batch100, IMAGES, np.array(labels), "cifar100")
    with pytest.raises(DataError, match=message) as info:
        load_cifar(batch100, "cifar100", coarse=coarse)
    assert str(batch100) in str(info.value)


def test_one_bad_file_among_good_ones_loads_nothing(tmp_path, batch10):
    bad = tmp_path / "data_batch_2.bin"
    bad.write_bytes(batch10.read_bytes()[:-1])
    with pytest.raises(DataError, match="truncated record") as info:
        load_cifar([batch10, bad])
    assert str(bad) in str(info.value)


def test_missing_files_are_named_before_any_is_read(tmp_path, batch10, monkeypatch):
    import gpuengine.data.formats.cifar as cifar
    monkeypatch.setattr(cifar, "read_cifar_batch", lambda *a: pytest.fail("read a file before checking them all"))
    with pytest.raises(DataError, match=r"data_batch_2.bin: no such CIFAR batch file \(2 of 3 files missing\)"):
        read_cifar([batch10, tmp_path / "data_batch_2.bin", tmp_path / "data_batch_3.bin"])
    monkeypatch.undo()
    with pytest.raises(DataError, match="no such CIFAR batch file"):
        read_cifar_batch(tmp_path / "nowhere.bin")
    with pytest.raises(DataError, match="no CIFAR batch files given"):
        read_cifar([])


def test_bad_variant_and_coarse_cifar10_are_refused(batch10):
    with pytest.raises(DataError, match="variant='cifar20' is not a CIFAR variant; use one of cifar10, cifar100"):
        read_cifar_batch(batch10, "cifar20")
    with pytest.raises(DataError, match="coarse labels exist only in CIFAR-100"):
        load_cifar(batch10, "cifar10", coarse=True)


def test_writer_refuses_what_is_not_a_batch(tmp_path):
    with pytest.raises(ValueError, match="uint8 images"):
        write_cifar_batch(tmp_path / "a.bin", IMAGES[:, :28], LABELS10)
    with pytest.raises(ValueError, match="cifar100 labels must be 2 whole number"):
        write_cifar_batch(tmp_path / "a.bin", IMAGES, LABELS10, "cifar100")
    with pytest.raises(ValueError, match="0..255"):
        write_cifar_batch(tmp_path / "a.bin", IMAGES, LABELS10 + 250)
    assert not (tmp_path / "a.bin").exists()


# -- BMP class folders of 32x32x3 images -----------------------------------------------

def _rgb_class_folders(root, classes: int, per_class: int = 1):
    """Folders named 0 .. classes-1; image i of class c has pixel (0, 0) = (c, i, 255 - c)."""
    images = RNG.integers(0, 256, (classes, per_class, 32, 32, 3), dtype=np.uint8)
    images[:, :, 0, 0, 0] = np.arange(classes)[:, None]
    images[:, :, 0, 0, 1] = np.arange(per_class)
    images[:, :, 0, 0, 2] = 255 - np.arange(classes)[:, None]
    for c in range(classes):
        (root / str(c)).mkdir(parents=True)
        for i in range(per_class):
            write_bmp(root / str(c) / f"{i}.bmp", images[c, i])
    return images


@pytest.mark.parametrize("classes, per_class", [(10, 3), (100, 1)])
def test_rgb_bmp_folders_of_10_and_100_classes(tmp_path, classes, per_class):
    images = _rgb_class_folders(tmp_path / "train", classes, per_class)
    x, t, names = load_bmp_folder(tmp_path / "train", (32, 32, 3))
    assert x.shape == (classes * per_class, 32, 32, 3) and t.shape == (classes * per_class, classes)
    assert names == [str(c) for c in range(classes)]   # numbered folders keep their numbers as labels
    np.testing.assert_array_equal(t.argmax(axis=1), np.repeat(np.arange(classes), per_class))
    np.testing.assert_array_equal(x, images.reshape(x.shape) / np.float32(255))


def test_named_class_folders_sort_by_name(tmp_path):
    for name in ("truck", "airplane", "cat"):
        (tmp_path / name).mkdir()
        write_bmp(tmp_path / name / "0.bmp", np.zeros((32, 32, 3), np.uint8))
    assert load_bmp_folder(tmp_path, (32, 32, 3))[2] == ["airplane", "cat", "truck"]


def test_empty_class_among_rgb_folders_is_named(tmp_path):
    _rgb_class_folders(tmp_path / "train", 10)
    (tmp_path / "train" / "10").mkdir()
    with pytest.raises(DataError, match="empty class folder") as info:
        load_bmp_folder(tmp_path / "train", (32, 32, 3))
    assert str(tmp_path / "train" / "10") in str(info.value)


def test_wrong_size_rgb_bmp_is_named(tmp_path):
    _rgb_class_folders(tmp_path / "train", 10)
    bad = tmp_path / "train" / "3" / "0.bmp"
    write_bmp(bad, np.zeros((28, 28, 3), np.uint8))
    with pytest.raises(DataError, match="is 28x28 pixels, the data set's images are 32x32") as info:
        load_bmp_folder(tmp_path / "train", (32, 32, 3))
    assert str(bad) in str(info.value)


# -- generated images ------------------------------------------------------------------

@pytest.mark.parametrize("classes, size", [(10, 32), (100, 16)])
def test_generated_images_are_balanced_deterministic_and_in_range(classes, size):
    images, labels = make_images(2 * classes, classes, seed=3, size=size)
    assert images.shape == (2 * classes, size, size, 3) and images.dtype == np.uint8
    assert labels.dtype == np.int64 and np.bincount(labels, minlength=classes).tolist() == [2] * classes
    again = make_images(2 * classes, classes, seed=3, size=size)
    np.testing.assert_array_equal(images, again[0])
    np.testing.assert_array_equal(labels, again[1])
    assert not np.array_equal(images, make_images(2 * classes, classes, seed=4, size=size)[0])
    assert 0 < images.std() and images.min() < 30 and images.max() > 225   # not flat, not washed out


def test_class_patterns_differ_under_every_shift_and_polarity():
    grids = _class_grids(100).reshape(100, -1)
    assert (grids.sum(axis=1) == 0).all()   # as many raised cells as lowered: no class is brighter
    shifted = np.stack([np.roll(_class_grids(100), (i, j), axis=(1, 2)).reshape(100, -1)
                        for i in (-1, 0, 1) for j in (-1, 0, 1)])   # (9, classes, 64)
    agreement = np.abs(np.einsum("sck,dk->scd", shifted, grids)) / 16   # 1 = same pattern up to polarity
    agreement[4, np.arange(100), np.arange(100)] = 0                    # a class against itself, unshifted
    assert agreement.max() < 0.6


def _pattern_match(images, classes, size):
    """Knowing the patterns: (n, classes) signed correlation of the channel sum at each class's best shift."""
    cell = np.arange(size) * 8 // size
    patterns = _class_grids(classes)[:, cell][:, :, cell]
    reach = size // 8
    bank = np.stack([np.roll(patterns, (i, j), axis=(1, 2)) for i in range(-reach, reach + 1)
                     for j in range(-reach, reach + 1)], axis=1).reshape(-1, size * size)
    luma = images.astype(np.float32).sum(axis=3).reshape(len(images), -1)
    luma -= luma.mean(axis=1, keepdims=True)
    score = (luma @ bank.T).reshape(len(images), classes, -1)
    best = np.abs(score).argmax(axis=2)
    return np.take_along_axis(score, best[..., None], axis=2)[..., 0]


def _nearest_mean_accuracy(train, train_labels, test, test_labels, classes):
    means = np.stack([train[train_labels == c].mean(axis=0) for c in range(classes)])
    distance = ((test[:, None] - means[None]) ** 2).sum(axis=2)
    return (distance.argmin(axis=1) == test_labels).mean()


@pytest.mark.parametrize("classes, size", [(10, 32), (100, 16)])
def test_generated_class_lives_in_the_pattern_not_the_colour(classes, size):
    """An oracle that knows the patterns finds the class; the mean colour does not."""
    train, train_labels = make_images(3000, classes, seed=0, size=size)
    test, test_labels = make_images(1000, classes, seed=1, size=size)
    assert (np.abs(_pattern_match(test, classes, size)).argmax(axis=1) == test_labels).mean() > 0.95

    def mean_colour(images):
        return images.reshape(len(images), -1, 3).mean(axis=1)
    accuracy = _nearest_mean_accuracy(mean_colour(train), train_labels, mean_colour(test), test_labels, classes)
    assert accuracy < 1.6 / classes


def test_a_class_mean_image_holds_no_pattern():
    """Both polarities equally often: each image shows its pattern, the class's mean image does not."""
    images, labels = make_images(2000, 10, seed=2, size=16)
    own = _pattern_match(images, 10, 16)[np.arange(len(images)), labels]   # signed match with its own pattern
    for c in range(10):
        match = own[labels == c]
        error = match.std() / np.sqrt(match.size)   # standard error of the class's mean match
        assert abs(match.mean()) < 4 * error < 0.5 * np.abs(match).mean()


def test_generator_refuses_sizes_off_the_grid():
    with pytest.raises(DataError, match=r"^size=28 is not accepted; use a whole number that is a multiple of 8"):
        make_images(10, 10, size=28)
    with pytest.raises(DataError, match=r"^classes=1 is not accepted; use a whole number >= 2$"):
        make_images(10, 1)
