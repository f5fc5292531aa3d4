"""Validation of training data and batch sizes: clear errors, before anything is staged."""
from __future__ import annotations

import numpy as np


class DataError(ValueError):
    """The data or the batch size cannot be used; the message names the problem."""


def check_features(x: np.ndarray, expected_shape: tuple, what: str = "inputs") -> np.ndarray:
    x = np.asarray(x)
    if x.ndim < 1 or tuple(x.shape[1:]) != tuple(expected_shape):
        raise DataError(f"{what} have per-sample shape {tuple(x.shape[1:])}, the network expects {tuple(expected_shape)}")
    if x.dtype.kind not in "fiu" and x.dtype.name != "bfloat16":
        raise DataError(f"{what} must be numeric, got dtype {x.dtype}")
    if x.dtype.kind == "f" or x.dtype.name == "bfloat16":
        finite = np.isfinite(x.astype(np.float32, copy=False))
        if not finite.all():
            bad = np.argwhere(~finite)[0]
            raise DataError(f"{what} contain NaN or inf (first at index {tuple(int(i) for i in bad)})")
    return x


def check_training_data(x, t, input_shape: tuple, target_shape: tuple) -> tuple[np.ndarray, np.ndarray]:
    x = check_features(x, input_shape, "inputs")
    t = check_features(t, target_shape, "targets")
    if len(x) != len(t):
        raise DataError(f"{len(x)} input samples but {len(t)} targets")
    return x, t


def check_batch(batch, samples: int) -> int:
    if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)):
        raise DataError(f"batch size must be a whole number, got {batch!r}")
    if batch <= 0:
        raise DataError(f"batch size must be >= 1, got {batch}")
    if batch > samples:
        raise DataError(f"batch size {batch} is larger than the data set ({samples} samples)")
    return int(batch)
