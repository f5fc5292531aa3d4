"""The device batch gather: rows of a staged array into the static batch buffers.

One kernel, two row maps. SHUFFLED: the row of batch position i at global step
s is the epoch's Feistel permutation of (s mod steps_per_epoch) * B + i (see
shuffle.py), read from the device step counter, so it runs inside a captured
graph; under data parallelism B is the global batch and rank r reads positions
r * b .. r * b + b - 1 of it (b its own batch). RING: the row is slot (s mod
pool) of the host-streamed loader's device ring. Rows are copied as 16-byte or
4-byte words; targets ride along.
"""
from __future__ import annotations

import numpy as np

from ..runtime.kernels import get_kernel
from .shuffle import DEVICE_SOURCE, batch_rows, half_bits

_SOURCE = DEVICE_SOURCE + r"""
extern "C" __global__ void gather(const WORD_T* src_x, const float* src_t, WORD_T* out_x, float* out_t,
                                  int row_words, int target_width, const long long* step, long long steps_per_epoch,
                                  int batch, unsigned int n, unsigned int half, unsigned int seed, int pool,
                                  unsigned int global_batch, unsigned int rank_offset) {
    // One warp per batch row, 8 rows per block: many 16-byte copies in flight.
    const int lane = threadIdx.x & 31;
    const int i = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (i >= batch) return;
    const long long s = step[0];
    long long row;
    if (SHUFFLED) {
        const unsigned int epoch = (unsigned int)(s / steps_per_epoch);
        const unsigned int position = (unsigned int)(s % steps_per_epoch);
        row = feistel_permute(position * global_batch + rank_offset + (unsigned int)i, n, half,
                              epoch_key(seed, epoch));
    } else {
        row = (long long)(s % pool) * batch + i;
    }
    const WORD_T* src = src_x + row * row_words;
    WORD_T* dst = out_x + (long long)i * row_words;
    #pragma unroll 4
    for (int w = lane; w < row_words; w += 32) dst[w] = src[w];
    for (int c = lane; c < target_width; c += 32)
        out_t[(long long)i * target_width + c] = src_t[row * target_width + c];
}
"""


_ROWS_PER_BLOCK = 8


def as_words(a):
    """View a C-contiguous array's rows as 16-byte (uint4) or 4-byte words."""
    row_bytes = a.strides[0]
    if row_bytes % 16 == 0:
        return a.reshape(a.shape[0], -1).view(np.uint32).reshape(a.shape[0], -1), "uint4", row_bytes // 16
    if row_bytes % 4 == 0:
        return a.reshape(a.shape[0], -1).view(np.uint32).reshape(a.shape[0], -1), "unsigned int", row_bytes // 4
    raise ValueError(f"rows of {row_bytes} bytes cannot be gathered as words; use an even feature count")


class DeviceGather:
    """Gathers one batch per step from `src_x`/`src_t` into `out_x`/`out_t` on the device."""

    def __init__(self, backend, state, src_x, src_t, out_x, out_t, *, shuffled: bool, seed: int = 0, pool: int = 1,
                 rank: int = 0, world: int = 1):
        self.backend, self.state = backend, state
        self.src_x, self.src_t, self.out_x, self.out_t = src_x, src_t, out_x, out_t
        self.batch = out_x.shape[0]
        self.n = src_x.shape[0]
        self.shuffled, self.seed, self.pool = shuffled, seed, pool
        self.rank, self.world = rank, world
        if backend.is_gpu:
            self._src_words, word_type, self._row_words = as_words(src_x)
            self._out_words, _, _ = as_words(out_x)
            self._kernel = get_kernel(_SOURCE, "gather", WORD_T=word_type, SHUFFLED=int(shuffled))

    def run(self):
        if not self.backend.is_gpu:
            rows = self.host_rows(int(self.state.step[0]))
            np.take(self.src_x, rows, axis=0, out=self.out_x)
            np.take(self.src_t, rows, axis=0, out=self.out_t)
            return
        self._kernel((-(-self.batch // _ROWS_PER_BLOCK),), (32 * _ROWS_PER_BLOCK,),
                     (self._src_words, self.src_t, self._out_words, self.out_t, np.int32(self._row_words),
                      np.int32(self.out_t.shape[1]), self.state.step, np.int64(self.state.steps_per_epoch),
                      np.int32(self.batch), np.uint32(self.n), np.uint32(half_bits(self.n)),
                      np.uint32(self.seed & 0xFFFFFFFF), np.int32(self.pool),
                      np.uint32(self.batch * self.world), np.uint32(self.rank * self.batch)))

    def host_rows(self, step: int) -> np.ndarray:
        """The source rows the kernel reads at global step `step` (NumPy, for the CPU and tests)."""
        if self.shuffled:
            return batch_rows(self.n, self.seed, step, self.batch, self.state.steps_per_epoch, self.rank, self.world)
        return np.arange(self.batch) + (step % self.pool) * self.batch
