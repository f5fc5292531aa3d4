"""A matrix into its transpose, preallocated: dst (cols, rows) = src (rows, cols)^T, one launch.

Why: cuBLASLt's TF32 kernels on Hopper read K-major tiles. A dense layer's
weight gradient dW = dy^T x sums over the batch, and with x and dy stored a
row a sample the batch is each operand's outermost axis: cuBLASLt then runs
its `nt` kernel, which turns every tile on the way in (the seed-000 MLP on an
H200: 89.7 us for dW against 55.5 us for the forward GEMM of the same 16
GFLOP on `tn`). A layer that copies x batch-innermost while x is still in L2
(just gathered) hands the GEMM K-major operands for a 32 MB write.

A block moves a 32 x 32 tile through shared memory (one column of padding,
so the reads down a column meet no bank twice): reads along src's rows and
writes along dst's rows, both coalesced.
"""
from __future__ import annotations

import numpy as np

from ..runtime.kernels import ctype, get_kernel

_SOURCE = r"""
extern "C" __global__ void transpose(const ELEM_T* __restrict__ src, ELEM_T* __restrict__ dst, int rows, int cols) {
    __shared__ ELEM_T tile[32][33];
    // row tiles along x: a batch of 700,000 rows is 21,875 tiles, past y's 65,535
    const long long r0 = (long long)blockIdx.x * 32;
    const int c0 = blockIdx.y * 32;
    for (int j = threadIdx.y; j < 32; j += blockDim.y) {
        const long long r = r0 + j;
        const int c = c0 + threadIdx.x;
        if (r < rows && c < cols) tile[j][threadIdx.x] = src[r * cols + c];
    }
    __syncthreads();
    for (int j = threadIdx.y; j < 32; j += blockDim.y) {
        const int c = c0 + j;
        const long long r = r0 + threadIdx.x;
        if (c < cols && r < rows) dst[(long long)c * rows + r] = tile[threadIdx.x][j];
    }
}
"""
_ROWS_A_PASS = 8   # blockDim.y: 256 threads, four elements each


class Transpose:
    """dst = src.T for a C-contiguous (rows, cols) `src` and a C-contiguous (cols, rows) `dst` of its dtype."""

    def __init__(self, backend, src, dst):
        if src.ndim != 2 or dst.shape != src.shape[::-1] or dst.dtype != src.dtype:
            raise ValueError(f"Transpose of {src.dtype} {src.shape} into {dst.dtype} {dst.shape}: expected "
                             f"{src.dtype} {src.shape[::-1]}")
        for name, array in (("src", src), ("dst", dst)):
            if not array.flags.c_contiguous:
                raise ValueError(f"Transpose: {name} {array.shape} strides {array.strides} is not C-contiguous")
        self.backend, self.src, self.dst = backend, src, dst
        rows, cols = src.shape
        if backend.is_gpu:
            self._kernel = get_kernel(_SOURCE, "transpose", ELEM_T=ctype(src.dtype))
            self._grid = (-(-rows // 32), -(-cols // 32))
            if self._grid[1] > 65535:
                raise ValueError(f"Transpose: {cols} columns are {self._grid[1]} tiles, past the grid's 65,535")
            self._args = (src, dst, np.int32(rows), np.int32(cols))

    def run(self):
        if not self.backend.is_gpu:
            self.dst[...] = self.src.T
            return
        self._kernel(self._grid, (32, _ROWS_A_PASS), self._args)
