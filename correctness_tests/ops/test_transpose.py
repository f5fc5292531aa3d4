"""The transpose a Dense takes its input batch-innermost with (gpuengine/ops/transpose.py): its NumPy path and its
argument checks; test_gpu_transpose.py runs the kernel."""
from __future__ import annotations

import numpy as np
import pytest

from gpuengine.ops.transpose import Transpose
from gpuengine.runtime.backend import Backend


@pytest.mark.parametrize("shape", [(33, 50), (1, 7), (70, 1)])
def test_on_numpy_dst_is_the_transpose(shape):
    src = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    dst = np.full(shape[::-1], np.nan, np.float32)
    Transpose(Backend("cpu"), src, dst).run()
    np.testing.assert_array_equal(dst, src.T)


@pytest.mark.parametrize("dst_shape,dst_dtype,problem", [
    ((4, 6), np.float32, r"expected float32 \(6, 4\)"),
    ((6, 4), np.float64, r"expected float32 \(6, 4\)"),
])
def test_a_destination_of_another_shape_or_dtype_is_refused_by_name(dst_shape, dst_dtype, problem):
    with pytest.raises(ValueError, match=problem):
        Transpose(Backend("cpu"), np.zeros((4, 6), np.float32), np.zeros(dst_shape, dst_dtype))


def test_a_strided_view_is_refused():
    src = np.zeros((6, 4), np.float32).T   # (4, 6), not C-contiguous
    with pytest.raises(ValueError, match="src .* is not C-contiguous"):
        Transpose(Backend("cpu"), src, np.zeros((6, 4), np.float32))
