"""The bf16 weight gradients a training program widens in one launch (gpuengine/ops/widen.py): its table and its
NumPy path; test_gpu_widen.py runs the kernel."""
from __future__ import annotations

import numpy as np
import pytest

from gpuengine.ops.widen import Widening, chunk_rows
from gpuengine.runtime.backend import Backend, bfloat16_dtype
from gpuengine.runtime.memory import Allocator


def test_each_pair_is_cut_into_chunks_whose_addresses_step_by_the_element_sizes():
    rows = chunk_rows([(1000, 8000, 40000), (50, 90, 3), (7, 9, 0)], chunk=16384)
    assert rows == [(1000, 8000, 16384), (1000 + 2 * 16384, 8000 + 4 * 16384, 16384),
                    (1000 + 4 * 16384, 8000 + 8 * 16384, 40000 - 2 * 16384), (50, 90, 3)]   # nothing of an empty one


def pairs_at(widening, steps, rng):
    out = []
    for step in steps:
        widening.step = step
        scratch = rng.standard_normal((3, 5)).astype(bfloat16_dtype())
        master = np.full((3, 5), -7.0, np.float32)
        widening.add(scratch, master)
        out.append((scratch, master))
    return out


def test_on_numpy_a_step_widens_its_own_pairs_and_run_widens_all():
    backend = Backend("cpu")
    widening = Widening(backend, Allocator(backend))
    (a, a_master), (b, b_master) = pairs_at(widening, (0, 2), np.random.default_rng(0))
    widening.build()
    widening.run_step(2)
    np.testing.assert_array_equal(b_master, b.astype(np.float32))
    assert (a_master == -7.0).all()   # step 0's pair is left for its own step
    widening.run_step(1)              # a step without pairs widens nothing
    assert (a_master == -7.0).all()
    widening.run()
    np.testing.assert_array_equal(a_master, a.astype(np.float32))
    assert len(widening) == 2


def test_bad_pairs_and_the_order_of_building_are_errors_that_say_so():
    backend = Backend("cpu")
    widening = Widening(backend, Allocator(backend))
    with pytest.raises(ValueError, match="a bf16 scratch and a float32 master of one shape"):
        widening.add(np.zeros(3, np.float32), np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="of one shape"):
        widening.add(np.zeros(3, bfloat16_dtype()), np.zeros(4, np.float32))
    with pytest.raises(RuntimeError, match="runs once built"):
        widening.run()
    widening.build()
    with pytest.raises(RuntimeError, match="added after the widening was built"):
        widening.add(np.zeros(3, bfloat16_dtype()), np.zeros(3, np.float32))
