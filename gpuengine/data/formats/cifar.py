"""CIFAR-shaped data (seed note 002): the binary batches, and generated colour images for machines with no downloads.

The binary version of "The CIFAR-10 and CIFAR-100 datasets" (Krizhevsky 2009,
"Learning Multiple Layers of Features from Tiny Images"): a file is records
back to back, with no header. A CIFAR-10 record (`data_batch_1.bin` ..
`data_batch_5.bin`, `test_batch.bin`) is 1 label byte (0..9) then 3072 pixel
bytes: the 1024 red, then 1024 green, then 1024 blue values of a 32x32 image,
each plane row-major (CHW). A CIFAR-100 record (`train.bin`, `test.bin`) is a
coarse label byte (0..19), a fine label byte (0..99), then the same 3072 bytes.
Images come back HWC. A missing or empty file, a size that is not a whole
number of records, or a label out of range is a DataError naming the file
(and the record); all files are read and checked before anything is returned.

`make_images` stands in for CIFAR where it cannot be downloaded: see its
docstring for what makes a class.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ... import checks
from ..checks import DataError
from ..labels import training_arrays

SIZE, CHANNELS = 32, 3
PIXEL_BYTES = SIZE * SIZE * CHANNELS
# Per variant: the label bytes ahead of a record's pixels as (name, classes), in file order.
LABEL_BYTES = {"cifar10": (("label", 10),), "cifar100": (("coarse label", 20), ("fine label", 100))}
FILES = {"cifar10": {"train": tuple(f"data_batch_{i}.bin" for i in range(1, 6)), "test": ("test_batch.bin",)},
         "cifar100": {"train": ("train.bin",), "test": ("test.bin",)}}

_TEMPLATE_SEED = 2002   # fixed: every sample seed draws from the same class patterns
_GRID = 8               # a class pattern is an 8x8 grid of cells
_CHUNK = 4096           # images per vectorised pass: bounds the float32 temporaries


def _check_variant(variant: str, coarse: bool = False):
    if variant not in LABEL_BYTES:
        raise DataError(f"variant={variant!r} is not a CIFAR variant; use one of {', '.join(LABEL_BYTES)}")
    if coarse and variant != "cifar100":
        raise DataError(f"coarse labels exist only in CIFAR-100; {variant} records carry one label")


def record_bytes(variant: str) -> int:
    _check_variant(variant)
    return len(LABEL_BYTES[variant]) + PIXEL_BYTES


def label_classes(variant: str, coarse: bool = False) -> int:
    """Classes of the labels read: 10 (CIFAR-10), 100 (CIFAR-100 fine) or 20 (CIFAR-100 coarse)."""
    _check_variant(variant, coarse)
    return LABEL_BYTES[variant][0 if coarse else -1][1]


def cifar_files(root, variant: str = "cifar10", split: str = "train") -> list[Path]:
    """The standard batch files of a split in an extracted binary archive (cifar-10-batches-bin/, cifar-100-binary/)."""
    _check_variant(variant)
    if split not in FILES[variant]:
        raise DataError(f"split={split!r} is not a CIFAR split; use train or test")
    return [Path(root) / name for name in FILES[variant][split]]


def _size_problem(path: Path, size: int, variant: str) -> str:
    """Why `size` bytes are not whole records: another variant's records, or a truncated last record."""
    record = record_bytes(variant)
    for other in LABEL_BYTES:
        if other != variant and size % record_bytes(other) == 0:
            return (f"{path}: wrong record size: {size} bytes are {size // record_bytes(other)} records of "
                    f"{record_bytes(other)} bytes ({other}), not whole {variant} records of {record} bytes "
                    f"({len(LABEL_BYTES[variant])} label + {PIXEL_BYTES} pixel bytes)")
    return (f"{path}: truncated record: {size} bytes are {size // record} whole {variant} records of {record} "
            f"bytes and {size % record} bytes of a truncated one")


def read_cifar_batch(path, variant: str = "cifar10", coarse: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """uint8 images (n, 32, 32, 3) HWC and int64 labels of one binary batch file.

    CIFAR-100 gives fine labels (100 classes) unless `coarse` (20 classes); both
    label bytes of every record are range-checked either way.
    """
    _check_variant(variant, coarse)
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such CIFAR batch file")
    data = path.read_bytes()
    if not data:
        raise DataError(f"{path}: empty file (no {variant} records)")
    record = record_bytes(variant)
    if len(data) % record:
        raise DataError(_size_problem(path, len(data), variant))
    records = np.frombuffer(data, np.uint8).reshape(-1, record)
    for column, (name, classes) in enumerate(LABEL_BYTES[variant]):
        bad = np.flatnonzero(records[:, column] >= classes)
        if bad.size:
            raise DataError(f"{path}: record {int(bad[0])} has {name} {int(records[bad[0], column])}, out of range "
                            f"for {classes} classes (0..{classes - 1}); {bad.size} records are out of range")
    labels = records[:, 0 if coarse else len(LABEL_BYTES[variant]) - 1].astype(np.int64)
    planes = records[:, len(LABEL_BYTES[variant]):].reshape(-1, CHANNELS, SIZE, SIZE)   # (n, C, H, W)
    return np.ascontiguousarray(planes.transpose(0, 2, 3, 1)), labels


def read_cifar(paths, variant: str = "cifar10", coarse: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Several batch files (a path or an iterable of paths) concatenated in the order given."""
    _check_variant(variant, coarse)
    paths = [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
    if not paths:
        raise DataError("no CIFAR batch files given")
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:   # before reading the others: a typo should not cost a full read
        raise DataError(f"{missing[0]}: no such CIFAR batch file ({len(missing)} of {len(paths)} files missing)")
    batches = [read_cifar_batch(path, variant, coarse) for path in paths]
    return np.concatenate([b[0] for b in batches]), np.concatenate([b[1] for b in batches])


def load_cifar(paths, variant: str = "cifar10", coarse: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(x float32 (n, 32, 32, 3) in [0, 1], t float32 (n, classes) one-hot) from binary batch files."""
    images, labels = read_cifar(paths, variant, coarse)
    return training_arrays(images, labels, label_classes(variant, coarse), f"{variant} batches")


def write_cifar_batch(path, images: np.ndarray, labels: np.ndarray, variant: str = "cifar10"):
    """Write uint8 images (n, 32, 32, 3) as a binary batch file.

    Labels are (n,) for CIFAR-10 and (n, 2) coarse then fine for CIFAR-100,
    written as given (any byte), so tests can write out-of-range ones.
    """
    _check_variant(variant)
    images, labels = np.asarray(images), np.asarray(labels)
    label_count = len(LABEL_BYTES[variant])
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[1:] != (SIZE, SIZE, CHANNELS):
        raise ValueError(f"write_cifar_batch takes uint8 images (n, {SIZE}, {SIZE}, {CHANNELS}), "
                         f"got {images.dtype} {images.shape}")
    labels = labels.reshape(len(labels), -1)
    if labels.shape != (len(images), label_count) or labels.dtype.kind not in "iu" or \
            labels.min(initial=0) < 0 or labels.max(initial=0) > 255:
        raise ValueError(f"{variant} labels must be {label_count} whole number(s) 0..255 per image, "
                         f"{len(images)} images; got {labels.dtype} {labels.shape}")
    records = np.concatenate([labels.astype(np.uint8), images.transpose(0, 3, 1, 2).reshape(len(images), -1)], axis=1)
    Path(path).write_bytes(records.tobytes())


def _class_grids(classes: int) -> np.ndarray:
    """float32 (classes, 8, 8) of +-0.5: each class raises a fixed half of the cells and lowers the rest."""
    rng = np.random.default_rng(_TEMPLATE_SEED)
    half = np.repeat(np.float32([0.5, -0.5]), _GRID * _GRID // 2)
    return rng.permuted(np.tile(half, (classes, 1)), axis=1).reshape(classes, _GRID, _GRID)


def make_images(samples: int, classes: int, seed: int = 0, size: int = SIZE, clutter: float = 0.3,
                noise: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    """uint8 colour images (samples, size, size, 3) and int64 labels (balanced classes, shuffled).

    What makes a class: a fixed 8x8 grid pattern (from a fixed seed) in which
    half of the cells are raised and half lowered. A sample draws its class's
    pattern over the whole image in a random colour of either polarity (raised
    cells lighter or darker, tinted per channel) on a random background colour,
    shifted cyclically by up to one cell each way, with every cell's colour
    disturbed (`clutter`, std per channel) and pixel noise (`noise`) on top.
    Every pattern raises as many cells as it lowers and each class comes in both
    polarities equally often, so the mean colour of an image is its background's
    whatever the class (it predicts nothing) and the mean image of a class holds
    no pattern: a network has to learn the spatial arrangement, shift- and
    polarity-tolerantly. (A 3-layer CNN with Adam on 10,000 images of 10
    classes averages losses of about 2.0, 1.0 and 0.55 over its first three
    epochs, starting from ln 10 = 2.30: learnable, not trivial.)
    """
    samples = checks.whole("samples", samples, error=DataError)
    classes = checks.whole("classes", classes, 2, error=DataError)
    if not checks.is_whole(size) or size < _GRID or size % _GRID:
        checks.refuse("size", size, f"a whole number that is a multiple of {_GRID} (the class grid's cells)", DataError)
    seed = checks.seed("seed", seed, DataError)
    clutter = checks.number("clutter", clutter, at_least=0.0, error=DataError)
    noise = checks.number("noise", noise, at_least=0.0, error=DataError)
    rng = np.random.default_rng(seed)
    order = rng.permutation(samples)
    labels = order % classes
    sign = np.where(order // classes % 2, np.float32(-1.0), np.float32(1.0))   # each class's polarities balanced
    shift = rng.integers(-(size // _GRID), size // _GRID + 1, size=(2, samples))
    background = rng.uniform(0.25, 0.75, (samples, 1, 1, CHANNELS)).astype(np.float32)
    polarity = sign * rng.uniform(0.3, 0.5, samples).astype(np.float32)
    colour = polarity[:, None] + rng.uniform(-0.15, 0.15, (samples, CHANNELS)).astype(np.float32)
    cells = _class_grids(classes)[labels][..., None] * colour[:, None, None, :] + background   # (n, 8, 8, 3)
    cells += rng.standard_normal(cells.shape, dtype=np.float32) * np.float32(clutter)
    cells = cells.reshape(-1, CHANNELS)
    span = np.arange(size)
    images = np.empty((samples, size, size, CHANNELS), np.uint8)
    for start in range(0, samples, _CHUNK):
        part = slice(start, min(start + _CHUNK, samples))
        rows = (span - shift[0, part, None]) % size * _GRID // size   # (m, size): the cell of each pixel row
        cols = (span - shift[1, part, None]) % size * _GRID // size
        cell = (np.arange(part.start, part.stop)[:, None, None] * _GRID + rows[:, :, None]) * _GRID + cols[:, None, :]
        pixels = np.take(cells, cell.ravel(), axis=0).reshape(-1, size, size, CHANNELS)
        pixels += rng.standard_normal(pixels.shape, dtype=np.float32) * np.float32(noise)
        images[part] = np.clip(np.rint(pixels * np.float32(255.0)), 0, 255)
    return images, labels.astype(np.int64)
