"""Column sums (bias gradients) in two deterministic passes.

A dense or convolution bias gradient is the sum of the output gradient over
the batch rows. One thread per column looping over thousands of rows leaves
the GPU idle, so rows are split into chunks: pass 1 writes per-chunk partial
sums, pass 2 adds the chunks. No atomics, so results do not vary run to run.
"""
from __future__ import annotations

import numpy as np

from .backend import widen
from .kernels import ctype, get_kernel

_SOURCE = r"""
extern "C" __global__ void column_partials(const ELEM_T* src, float* partials, int rows, int cols, int rows_per_chunk) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    int chunk = blockIdx.y;
    if (col >= cols) return;
    int start = chunk * rows_per_chunk;
    int stop = min(rows, start + rows_per_chunk);
    float s = 0.f;
    for (int r = start; r < stop; ++r) s += load_f(src, (long long)r * cols + col);
    partials[(long long)chunk * cols + col] = s;
}
extern "C" __global__ void sum_partials(const float* partials, float* dst, int chunks, int cols) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= cols) return;
    float s = 0.f;
    for (int c = 0; c < chunks; ++c) s += partials[(long long)c * cols + col];
    dst[col] = s;
}
"""
_THREADS = 128


class ColumnSum:
    """dst[c] = sum_r src[r, c], into a preallocated float32 `dst`."""

    def __init__(self, backend, allocator, src, dst, rows_per_chunk: int = 64):
        if src.ndim != 2 or dst.shape != (src.shape[1],):
            raise ValueError(f"ColumnSum of {src.shape} into {dst.shape}")
        self.backend, self.src, self.dst = backend, src, dst
        rows, cols = src.shape
        self.rows, self.cols = rows, cols
        self.rows_per_chunk = rows_per_chunk
        self.chunks = max(1, -(-rows // rows_per_chunk))
        if backend.is_gpu:
            self.partials = allocator.zeros((self.chunks, cols), np.float32, "workspace")
            self._k1 = get_kernel(_SOURCE, "column_partials", ELEM_T=ctype(src.dtype))
            self._k2 = get_kernel(_SOURCE, "sum_partials", ELEM_T=ctype(src.dtype))

    def run(self):
        if not self.backend.is_gpu:
            self.dst[...] = widen(self.src).sum(axis=0)
            return
        blocks = -(-self.cols // _THREADS)
        self._k1((blocks, self.chunks), (_THREADS,),
                 (self.src, self.partials, np.int32(self.rows), np.int32(self.cols), np.int32(self.rows_per_chunk)))
        self._k2((blocks,), (_THREADS,), (self.partials, self.dst, np.int32(self.chunks), np.int32(self.cols)))
