"""On a GPU: the tiled transpose (gpuengine/ops/transpose.py) writes exactly src.T, partial tiles at every edge."""
from __future__ import annotations

import numpy as np
import pytest

from gpuengine.ops.transpose import Transpose
from gpuengine.runtime.backend import Backend, bfloat16_dtype, gpu_visible

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_visible(), reason="no CUDA GPU visible (CuPy missing or no device)")]


@pytest.mark.parametrize("shape", [(8000, 1000), (33, 50), (1, 7), (70, 1), (100, 65)])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_kernel_writes_the_transpose(shape, dtype):
    backend = Backend("cuda")
    dtype = np.dtype(np.float32) if dtype == "float32" else bfloat16_dtype()
    host = np.random.default_rng(1).standard_normal(shape).astype(dtype)
    with backend.activate():
        src = backend.xp.asarray(host)
        dst = backend.xp.asarray(np.full(shape[::-1], np.nan).astype(dtype))
        Transpose(backend, src, dst).run()
        backend.synchronize()
    bits = np.uint16 if dtype.itemsize == 2 else np.uint32   # bitwise: a move, no arithmetic
    np.testing.assert_array_equal(backend.to_host(dst).view(bits), np.ascontiguousarray(host.T).view(bits))
