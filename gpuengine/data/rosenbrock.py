"""Synthetic Rosenbrock regression data (seed note 000).

Inputs are uniform in [-1, 1]^k; the target is the k-dimensional Rosenbrock
function f(x) = sum_i 100 (x_{i+1} - x_i^2)^2 + (1 - x_i)^2, standardised to
zero mean and unit variance over the data set so that an MSE near 1 means
"predicts the mean" and a descending loss means the network learns.
"""
from __future__ import annotations

import functools

import numpy as np

from .. import checks
from .checks import DataError

_ROWS_PER_CHUNK = 16384   # bounds the temporaries: a 400k x 1000 data set is 1.6 GB


def rosenbrock(x: np.ndarray) -> np.ndarray:
    """f(x) for each row of x (at least 2 columns), in float64."""
    x = np.asarray(x)
    if x.ndim != 2 or x.shape[1] < 2:
        raise ValueError(f"rosenbrock needs rows of at least 2 inputs, got shape {x.shape}")
    out = np.empty(len(x), np.float64)
    for start in range(0, len(x), _ROWS_PER_CHUNK):
        block = x[start:start + _ROWS_PER_CHUNK].astype(np.float64)
        head, tail = block[:, :-1], block[:, 1:]
        out[start:start + len(block)] = (100.0 * (tail - head * head) ** 2 + (1.0 - head) ** 2).sum(axis=1)
    return out


@functools.lru_cache(maxsize=4)
def make_rosenbrock(samples: int, inputs: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(x float32 (samples, inputs), t float32 (samples, 1)), targets standardised.

    Cached (read-only arrays): benchmarks at 50 batches per epoch reuse 1.6 GB of inputs.
    """
    samples = checks.whole("samples", samples, 2, error=DataError)   # standardising the targets needs two
    inputs = checks.whole("inputs", inputs, 2, error=DataError)      # the function couples neighbouring inputs
    seed = checks.seed("seed", seed, DataError)
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1.0, 1.0, size=(samples, inputs)).astype(np.float32)
    y = rosenbrock(x)
    t = ((y - y.mean()) / y.std()).astype(np.float32)[:, None]
    x.flags.writeable = False
    t.flags.writeable = False
    return x, t
