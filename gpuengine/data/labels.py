"""Class labels and pixels as training arrays: one-hot float32 targets, pixels scaled to [0, 1] once.

Every image source (IDX files, BMP folders, the generated digits) ends here, so
they all hand the trainer the same thing: x float32 (n, H, W, C) in [0, 1] and
t float32 (n, classes) one-hot rows (the engine's data sources store float32
targets; the softmax cross-entropy reads them as probability rows).
"""
from __future__ import annotations

import numpy as np

from .checks import DataError


def one_hot(labels, classes: int, source: str = "labels") -> np.ndarray:
    """float32 (n, classes) rows with a 1 at each label; a DataError naming `source` for a bad label."""
    if isinstance(classes, bool) or not isinstance(classes, (int, np.integer)) or classes < 1:
        raise DataError(f"{source}: the number of classes must be a whole number >= 1, got {classes!r}")
    labels = np.asarray(labels)
    if labels.ndim != 1 or labels.dtype.kind not in "iu":
        raise DataError(f"{source}: labels must be a 1-D array of whole numbers, got {labels.dtype} {labels.shape}")
    bad = np.flatnonzero((labels < 0) | (labels >= classes))
    if bad.size:
        raise DataError(f"{source}: label {int(labels[bad[0]])} at index {int(bad[0])} is out of range for "
                        f"{classes} classes (0..{classes - 1}); {bad.size} labels are out of range")
    targets = np.zeros((labels.size, classes), np.float32)
    targets[np.arange(labels.size), labels] = 1.0
    return targets


def scale_pixels(images: np.ndarray) -> np.ndarray:
    """uint8 pixels (n, H, W) or (n, H, W, C) as float32 (n, H, W, C) in [0, 1]."""
    images = np.asarray(images)
    if images.dtype != np.uint8:
        raise DataError(f"pixels must be uint8 before scaling, got {images.dtype}")
    if images.ndim == 3:
        images = images[..., None]
    if images.ndim != 4:
        raise DataError(f"images must be (n, H, W) or (n, H, W, C), got shape {images.shape}")
    return images.astype(np.float32) / np.float32(255.0)


def training_arrays(images: np.ndarray, labels, classes: int, source: str = "labels"):
    """(x float32 (n, H, W, C) in [0, 1], t float32 (n, classes) one-hot), counts checked."""
    if len(images) != len(labels):
        raise DataError(f"{source}: {len(images)} images but {len(labels)} labels")
    return scale_pixels(images), one_hot(labels, classes, source)
