"""Validation of training data and batch sizes: clear errors, before anything is staged.

Beyond shapes and finiteness, what a layer or loss reads from the data is
checked here too, once on the host where the data enters (the trainer, the
predictor, a reader), never per step on the device: token ids must be whole
numbers in 0..vocab-1 (an embedding indexes its table with them), and the
target rows of a softmax cross-entropy must be probabilities. A refusal names
the array, the first offending element and its value, and how many there are.
"""
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


def _widened(values) -> np.ndarray:
    values = np.asarray(values)
    return values.astype(np.float32) if values.dtype.name == "bfloat16" else values


def _first(bad: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argwhere(bad)[0])


def _index_text(index: tuple[int, ...]) -> str:
    return ", ".join(map(str, index))


def _in_all(count: int, one: str, many: str) -> str:
    return f"{count} {one if count == 1 else many} in all"


def check_ids(values, what: str, vocab: int, reads: str = "", pad_id: int | None = None, offset=()) -> None:
    """Ids (float or integer storage) must be whole numbers in 0..vocab-1, or `pad_id` where one is given.

    `offset` is added to the reported index (a column slice's start), `reads` says who reads them as ids.
    """
    values = _widened(values)
    if values.dtype.kind in "iu":
        bad = (values < 0) | (values >= vocab)
    else:
        bad = ~np.isfinite(values) | (values != np.floor(values)) | (values < 0) | (values >= vocab)
    if pad_id is not None:
        bad &= values != pad_id
    if not bad.any():
        return
    index = _first(bad)
    shown = tuple(i + o for i, o in zip(index, tuple(offset) + (0,) * len(index)))
    padding = "" if pad_id is None else f", or the padding id {pad_id}"
    raise DataError(f"{what}[{_index_text(shown)}]={values[index].item()!r} is not accepted; use a whole number in "
                    f"0..{vocab - 1}{padding}{f' ({reads})' if reads else ''}; "
                    f"{_in_all(int(bad.sum()), 'bad value', 'bad values')}")


PROBABILITY_TOLERANCE = 1e-3   # float32 rows of up to ~1e5 classes sum to 1 well within this


def _unit_roundoff(dtype) -> float:
    if dtype.name == "bfloat16":
        return 2.0 ** -9   # 8 significant bits
    return float(np.finfo(dtype).eps) / 2 if dtype.kind == "f" else 0.0


def check_probability_rows(t, what: str = "targets") -> None:
    """Rows of class probabilities: every entry >= 0, every row summing to 1 (one-hot rows for class labels)."""
    t = np.asarray(t)
    rows = _widened(t).reshape(len(t), -1)
    # Each stored entry may be rounded by half an ulp: a row of K of them may miss 1 by K of those.
    tolerance = PROBABILITY_TOLERANCE + rows.shape[1] * _unit_roundoff(t.dtype)
    allowed = "rows of class probabilities, each entry >= 0 and each row summing to 1 (one-hot rows for labels)"
    negative = rows < 0
    if negative.any():
        index = _first(negative)
        raise DataError(f"{what}[{_index_text(index)}]={rows[index].item()!r} is not accepted; use {allowed}; "
                        f"{_in_all(int(negative.sum()), 'negative entry', 'negative entries')}")
    off = np.abs(rows.sum(axis=1, dtype=np.float64) - 1.0) > tolerance
    if off.any():
        row = int(np.flatnonzero(off)[0])
        total = float(rows[row].sum(dtype=np.float64))
        raise DataError(f"{what}[{row}] (a row summing to {total:.6g}) is not accepted; use {allowed}; "
                        f"{_in_all(int(off.sum()), 'such row', 'such rows')}")


def check_batch(batch, samples: int) -> int:
    if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)):
        raise DataError(f"batch size must be a whole number, got {batch!r}")
    if batch <= 0:
        raise DataError(f"batch size must be >= 1, got {batch}")
    if batch > samples:
        raise DataError(f"batch size {batch} is larger than the data set ({samples} samples)")
    return int(batch)
