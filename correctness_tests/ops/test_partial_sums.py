"""The partial column sums a training program finishes in one launch (gpuengine/ops/partial_sums.py): its table, its
NumPy path and its checks; test_gpu_partial_sums.py runs the kernel."""
from __future__ import annotations

import numpy as np
import pytest

from gpuengine.ops.partial_sums import PartialSums, column_runs
from gpuengine.runtime.backend import Backend
from gpuengine.runtime.memory import Allocator


def test_each_sum_is_cut_into_runs_of_columns_whose_addresses_step_by_four_bytes():
    runs = column_runs([(1000, 768, 132, 70, 8000), (50, 4, 3, 3, 90), (7, 9, 2, 0, 9)], cols=32)
    assert runs == [(1000, 768, 132, 32, 8000), (1000 + 128, 768, 132, 32, 8000 + 128),
                    (1000 + 256, 768, 132, 6, 8000 + 256), (50, 4, 3, 3, 90)]   # nothing of an empty one


def sums_at(sums, steps, rng):
    """Per step, partials of 5 blocks x 10 columns holding two sums (columns 0-3 and 4-9) into destinations of nan."""
    out = []
    for step in steps:
        sums.step = step
        partials = rng.standard_normal((5, 10)).astype(np.float32)
        first, second = np.full(4, np.nan, np.float32), np.full(6, np.nan, np.float32)
        assert sums.add(partials, [(0, first), (4, second)])
        out.append((partials, first, second))
    return out


def test_on_numpy_a_step_finishes_its_own_sums_and_run_finishes_all():
    backend = Backend("cpu")
    sums = PartialSums(backend, Allocator(backend))
    (a, a1, a2), (b, b1, b2) = sums_at(sums, (0, 2), np.random.default_rng(0))
    sums.build()
    sums.run_step(2)
    np.testing.assert_allclose(b1, b[:, :4].sum(axis=0), rtol=1e-6)
    np.testing.assert_allclose(b2, b[:, 4:].sum(axis=0), rtol=1e-6)
    assert np.isnan(a1).all() and np.isnan(a2).all()   # step 0's sums are left for its own step
    sums.run_step(1)                                    # a step without sums finishes nothing
    assert np.isnan(a1).all()
    sums.run()
    np.testing.assert_allclose(a1, a[:, :4].sum(axis=0), rtol=1e-6)
    np.testing.assert_allclose(a2, a[:, 4:].sum(axis=0), rtol=1e-6)
    assert len(sums) == 4


def test_bad_sums_and_the_order_of_building_are_errors_that_say_so():
    backend = Backend("cpu")
    sums = PartialSums(backend, Allocator(backend))
    with pytest.raises(ValueError, match="a float32 row per block"):
        sums.add(np.zeros((2, 4), np.float64), [(0, np.zeros(4, np.float32))])
    with pytest.raises(ValueError, match="a float32 row per block"):
        sums.add(np.zeros(4, np.float32), [(0, np.zeros(4, np.float32))])
    with pytest.raises(ValueError, match="from column 2 does not fit float32 partials of 4 columns"):
        sums.add(np.zeros((2, 4), np.float32), [(2, np.zeros(3, np.float32))])
    with pytest.raises(ValueError, match="and a float32 destination"):
        sums.add(np.zeros((2, 4), np.float32), [(0, np.zeros(4, np.float64))])
    # a strided destination is not taken (its kernel finishes it), nor the other sums of its kernel
    assert not sums.add(np.zeros((2, 8), np.float32), [(0, np.zeros(4, np.float32)), (4, np.zeros(8, np.float32)[::2])])
    assert len(sums) == 0   # nothing half-added
    with pytest.raises(RuntimeError, match="finished once built"):
        sums.run()
    sums.build()
    with pytest.raises(RuntimeError, match="added after the finishing launch was built"):
        sums.add(np.zeros((2, 4), np.float32), [(0, np.zeros(4, np.float32))])
