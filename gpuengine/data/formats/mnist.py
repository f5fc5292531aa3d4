"""MNIST-shaped data (seed note 001): IDX files, and generated digits for machines with no downloads.

IDX (LeCun et al., "THE MNIST DATABASE" file-format notes): a big-endian header
of a magic number -- two zero bytes, the element type (0x08 = unsigned byte)
and the number of dimensions -- then one uint32 per dimension, then the data.
Images are magic 2051 (n, rows, cols), labels 2049 (n,). Gzipped files (as
distributed) are read too. A missing file, a wrong magic, a truncated or
overlong file, image and label counts that differ, or a label out of range is a
DataError naming the file and what was expected; nothing is returned then.

No machine here can download MNIST, so tests and benchmarks use `make_digits`:
28x28 grayscale images of 10 classes, each class a fixed pattern of strokes,
drawn shifted by up to 3 pixels, with random contrast and noise. A network has
to learn translation-tolerant templates, so the loss descends the way it does on
real digits (from ln 10 = 2.30 towards a small value) and descent means learning.
"""
from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np

from ... import checks
from ..checks import DataError
from ..labels import training_arrays

IMAGE_MAGIC, LABEL_MAGIC = 2051, 2049
IMAGE_SHAPE = (28, 28, 1)
CLASSES = 10
_TEMPLATE_SEED = 1001   # fixed: every sample seed draws from the same ten classes
_MAX_SHIFT = 3
_STROKES = 3


def _kind(magic: int) -> str:
    return {IMAGE_MAGIC: "images", LABEL_MAGIC: "labels"}.get(magic, "data")


def _no_such_file(path, magic: int) -> DataError:
    return DataError(f"{path}: no such file; expected an IDX file of unsigned-byte {_kind(magic)} "
                     f"(magic {magic}, gzipped or not)")


def _read(path: Path, magic: int) -> bytes:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise _no_such_file(path, magic) from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read the IDX file: {exc}") from exc
    if data[:2] != b"\x1f\x8b":
        return data
    try:
        return gzip.decompress(data)
    except (OSError, EOFError) as exc:
        raise DataError(f"{path}: corrupt gzip stream ({exc})") from exc


def read_idx(path, magic: int) -> np.ndarray:
    """The uint8 array of an IDX file whose header carries `magic` (2051 images, 2049 labels)."""
    path = Path(path)
    data = _read(path, magic)
    dims = magic & 0xFF
    found = struct.unpack_from(">I", data, 0)[0] if len(data) >= 4 else None
    if found is not None and found != magic:
        raise DataError(f"{path}: IDX magic number {found}, expected {magic} for unsigned-byte {_kind(magic)}")
    if len(data) < 4 + 4 * dims:
        raise DataError(f"{path}: {len(data)} bytes is too short for an IDX header (truncated?)")
    shape = struct.unpack_from(f">{dims}I", data, 4)
    expected = 4 + 4 * dims + int(np.prod(shape))
    if len(data) != expected:
        problem = "truncated" if len(data) < expected else "trailing bytes"
        raise DataError(f"{path}: header says {shape} ({expected} bytes), the file has {len(data)} ({problem})")
    return np.frombuffer(data, np.uint8, offset=4 + 4 * dims).reshape(shape).copy()


def write_idx(path, array: np.ndarray):
    """Write a uint8 array as an IDX file (images (n, rows, cols) get magic 2051, labels (n,) 2049)."""
    array = np.asarray(array)
    if array.dtype != np.uint8 or array.ndim not in (1, 3):
        raise ValueError(f"write_idx takes uint8 labels (n,) or images (n, rows, cols), "
                         f"got {array.dtype} {array.shape}")
    header = struct.pack(f">I{array.ndim}I", 0x0800 | array.ndim, *array.shape)
    Path(path).write_bytes(header + array.tobytes())


def load_idx(images_path, labels_path, classes: int = CLASSES) -> tuple[np.ndarray, np.ndarray]:
    """(x float32 (n, rows, cols, 1) in [0, 1], t float32 (n, classes) one-hot) from an IDX pair."""
    classes = checks.whole("classes", classes, error=DataError)
    for path, magic in ((images_path, IMAGE_MAGIC), (labels_path, LABEL_MAGIC)):
        if not Path(path).exists():   # both looked for before either is read: a typo should not cost a full read
            raise _no_such_file(path, magic)
    images = read_idx(images_path, IMAGE_MAGIC)
    labels = read_idx(labels_path, LABEL_MAGIC)
    if len(images) != len(labels):
        raise DataError(f"{images_path} holds {len(images)} images but {labels_path} holds {len(labels)} labels")
    return training_arrays(images, labels, classes, str(labels_path))


def _stroke_templates(size: int, classes: int) -> np.ndarray:
    """float (classes, size, size) in [0, 1]: each class a few soft line segments, away from the border."""
    rng = np.random.default_rng(_TEMPLATE_SEED)
    grid = np.arange(size, dtype=np.float64)
    lo, hi = _MAX_SHIFT + 3, size - _MAX_SHIFT - 4
    templates = np.zeros((classes, size, size))
    for c in range(classes):
        for _ in range(_STROKES):
            (r0, c0), (r1, c1) = rng.uniform(lo, hi, size=(2, 2))
            for s in np.linspace(0.0, 1.0, 12):
                r, q = r0 + s * (r1 - r0), c0 + s * (c1 - c0)
                bump = np.exp(-((grid[:, None] - r) ** 2 + (grid[None, :] - q) ** 2) / (2 * 1.2 ** 2))
                templates[c] = np.maximum(templates[c], bump)
    return templates


def make_digits(samples: int, seed: int = 0, classes: int = CLASSES, size: int = IMAGE_SHAPE[0],
                noise: float = 0.15) -> tuple[np.ndarray, np.ndarray]:
    """uint8 images (samples, size, size) and int64 labels (balanced classes, shuffled)."""
    samples = checks.whole("samples", samples, error=DataError)
    classes = checks.whole("classes", classes, 2, error=DataError)
    size = checks.whole("size", size, 2 * _MAX_SHIFT + 8, error=DataError)   # room for the shifts and a stroke
    seed, noise = checks.seed("seed", seed, DataError), checks.number("noise", noise, at_least=0.0, error=DataError)
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(samples) % classes)
    padded = np.pad(_stroke_templates(size, classes), ((0, 0), (_MAX_SHIFT,) * 2, (_MAX_SHIFT,) * 2))
    shift = rng.integers(0, 2 * _MAX_SHIFT + 1, size=(2, samples))
    span = np.arange(size)
    rows = (shift[0][:, None] + span)[:, :, None]   # (n, size, 1)
    cols = (shift[1][:, None] + span)[:, None, :]   # (n, 1, size)
    images = padded[labels[:, None, None], rows, cols]
    images = images * rng.uniform(0.6, 1.0, (samples, 1, 1)) + rng.normal(0.0, noise, images.shape)
    return np.clip(np.rint(images * 255.0), 0, 255).astype(np.uint8), labels.astype(np.int64)


def digits_data(samples: int, seed: int = 0, classes: int = CLASSES) -> tuple[np.ndarray, np.ndarray]:
    """Generated digits as training arrays: (x float32 (n, 28, 28, 1) in [0, 1], t one-hot (n, classes))."""
    images, labels = make_digits(samples, seed, classes)
    return training_arrays(images, labels, classes, "generated digits")
