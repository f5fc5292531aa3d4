"""The batch gather: rows of a data set into a batch buffer, inside the captured step.

One kernel. The row of batch position i at global step s is the epoch's
Feistel permutation of (s mod steps_per_epoch) * B + i (see shuffle.py), with
s read from the device step counter (plus `ahead`: the streamed loader fetches
the next step's batch while this one computes), so it runs inside a captured
graph with no host work; under data parallelism B is the global batch and rank
r reads positions r * b .. r * b + b - 1 of it (b its own batch). The source is
device memory (resident data) or mapped pinned host memory (streamed data,
pinned.py). Long rows are split into 4 KB chunks, one warp each, so that a
batch of a few long rows (16 images of 600 KB) still spreads over every SM;
each lane issues its loads before its stores. From host memory every read
crosses PCIe, and a small grid strides over the work, keeping enough reads in
flight to fill the link while leaving the SMs to the step's compute. Rows are
copied as 16-byte or 4-byte words; targets ride along.

A float32 batch may also be written batch-innermost, (features, batch), in the
same pass (`also_batch_innermost`): the TF32 MLP's first Dense reads it so in
its weight gradient (layers/dense.py says why). A block then takes 32 rows and
128 features, a warp reading along a row, and turns the tile in shared memory
to write along the features' columns.
"""
from __future__ import annotations

import numpy as np

from ..runtime.kernels import get_kernel
from .shuffle import DEVICE_SOURCE, batch_rows, half_bits

_SOURCE = DEVICE_SOURCE + r"""
extern "C" __global__ void gather(const WORD_T* __restrict__ src_x, const float* __restrict__ src_t,
                                  WORD_T* __restrict__ out_x, float* __restrict__ out_t,
                                  int row_words, int chunk_words, int chunks, int target_width, const long long* step,
                                  int ahead, long long steps_per_epoch, int batch, unsigned int n, unsigned int half,
                                  unsigned int seed, unsigned int global_batch, unsigned int rank_offset) {
    // One warp per (batch row, chunk of the row) item; warps stride over the items when the grid is smaller.
    const int lane = threadIdx.x & 31;
    const long long s = step[0] + ahead;
    const unsigned int epoch = (unsigned int)(s / steps_per_epoch);
    const unsigned int position = (unsigned int)(s % steps_per_epoch);
    const unsigned int key = epoch_key(seed, epoch);
    const long long items = (long long)batch * chunks;
    const long long warps = (long long)gridDim.x * (blockDim.x >> 5);
    for (long long item = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); item < items;
         item += warps) {
        const int i = (int)(item / chunks), chunk = (int)(item % chunks);
        const long long row = feistel_permute(position * global_batch + rank_offset + (unsigned int)i, n, half, key);
        const WORD_T* src = src_x + row * row_words;
        WORD_T* dst = out_x + (long long)i * row_words;
        const int first = chunk * chunk_words;
        const int last = min(row_words, first + chunk_words);
        for (int w = first + lane; w < last; w += 4 * 32) {
            WORD_T v[4];
            #pragma unroll
            for (int k = 0; k < 4; ++k) if (w + k * 32 < last) v[k] = src[w + k * 32];
            #pragma unroll
            for (int k = 0; k < 4; ++k) if (w + k * 32 < last) dst[w + k * 32] = v[k];
        }
        if (chunk == 0)
            for (int c = lane; c < target_width; c += 32)
                out_t[(long long)i * target_width + c] = src_t[row * target_width + c];
    }
}

// The batch written twice: as rows (out_x) and batch-innermost (out_xt[c * batch + i]). A block per 32 rows and
// 128 features; each warp reads 4 rows along them, the tile turned in shared memory (a padded row: no bank
// conflicts either way) and written 128 bytes a column. Resident float32 rows only.
extern "C" __global__ void gather_t(const float* __restrict__ src_x, const float* __restrict__ src_t,
                                    float* __restrict__ out_x, float* __restrict__ out_xt, float* __restrict__ out_t,
                                    int cols, int target_width, const long long* step, int ahead,
                                    long long steps_per_epoch, int batch, unsigned int n, unsigned int half,
                                    unsigned int seed, unsigned int global_batch, unsigned int rank_offset) {
    __shared__ float tile[32][129];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long long s = step[0] + ahead;
    const unsigned int epoch = (unsigned int)(s / steps_per_epoch);
    const unsigned int position = (unsigned int)(s % steps_per_epoch);
    const unsigned int key = epoch_key(seed, epoch);
    const int i0 = blockIdx.x * 32, c0 = blockIdx.y * 128;
    for (int k = warp; k < 32; k += 8) {
        const int i = i0 + k;
        if (i >= batch) break;
        const long long row = feistel_permute(position * global_batch + rank_offset + (unsigned int)i, n, half, key);
        float v[4];
        #pragma unroll
        for (int m = 0; m < 4; ++m) {
            const int c = c0 + lane + 32 * m;
            v[m] = c < cols ? src_x[row * cols + c] : 0.f;
        }
        #pragma unroll
        for (int m = 0; m < 4; ++m) {
            const int c = c0 + lane + 32 * m;
            if (c < cols) out_x[(long long)i * cols + c] = v[m];
            tile[k][lane + 32 * m] = v[m];
        }
        if (blockIdx.y == 0)
            for (int c = lane; c < target_width; c += 32)
                out_t[(long long)i * target_width + c] = src_t[row * target_width + c];
    }
    __syncthreads();
    const int i = i0 + lane;
    for (int j = warp; j < 128; j += 8) {
        const int c = c0 + j;
        if (c < cols && i < batch) out_xt[(long long)c * batch + i] = tile[lane][j];
    }
}
"""

_WARPS_PER_BLOCK = 8
_CHUNK_BYTES = 4096   # a warp's share of a row: a 600 KB image spreads over 147 warps (one warp a row: 16 warps
                      # copied the zoo's batch at 60 GB/s, 153 us of AlexNet's 2 ms step on an H100)
# Host reads wait on PCIe: a full grid held every SM for the whole copy and the step's compute, on the other
# branch, queued behind it (H100 cdc7fc0: MLP streamed 0.65x the copy bound, CNN b1024 0.84x resident). 32
# blocks keep 512 KB of reads in flight and leave the SMs to the compute (9776784: 0.91x and 0.96x; the
# loader alone 3-7% slower than with the full grid).
_HOST_BLOCKS = 32


def as_words(a):
    """View a C-contiguous array's rows as 16-byte (uint4) or 4-byte words."""
    row_bytes = a.strides[0]
    if row_bytes % 16 == 0:
        return a.reshape(a.shape[0], -1).view(np.uint32).reshape(a.shape[0], -1), "uint4", row_bytes // 16
    if row_bytes % 4 == 0:
        return a.reshape(a.shape[0], -1).view(np.uint32).reshape(a.shape[0], -1), "unsigned int", row_bytes // 4
    raise ValueError(f"rows of {row_bytes} bytes cannot be gathered as words; use an even feature count")


class DeviceGather:
    """Gathers one batch per step from `src_x`/`src_t` into `out_x`/`out_t` on the device.

    `host_source`: the sources are mapped pinned host memory (a small grid strides over the chunks)."""

    def __init__(self, backend, state, src_x, src_t, out_x, out_t, *, seed: int = 0, rank: int = 0, world: int = 1,
                 host_source: bool = False):
        self.backend, self.state = backend, state
        self.src_x, self.src_t, self.out_x, self.out_t = src_x, src_t, out_x, out_t
        self.batch = out_x.shape[0]
        self.n = src_x.shape[0]
        self.seed, self.rank, self.world, self.host_source = seed, rank, world, host_source
        if backend.is_gpu:
            self._src_words, word_type, self._row_words = as_words(src_x)
            self._out_words, _, _ = as_words(out_x)
            word_bytes = 16 if word_type == "uint4" else 4
            self._chunk_words = max(1, _CHUNK_BYTES // word_bytes)
            self._chunks = -(-self._row_words // self._chunk_words) if self._row_words else 1
            blocks = -(-self.batch * self._chunks // _WARPS_PER_BLOCK)
            self._blocks = min(blocks, _HOST_BLOCKS) if host_source else blocks
            self._kernel = get_kernel(_SOURCE, "gather", WORD_T=word_type)
        self.out_xt = None

    def also_batch_innermost(self, out_xt):
        """From now on also write the batch as `out_xt` (features, batch) in the same pass; float32 rows from
        device memory only."""
        features = self.out_x.size // max(1, self.batch)
        if self.out_x.dtype != np.float32 or out_xt.dtype != np.float32 or out_xt.shape != (features, self.batch):
            raise ValueError(f"a batch-innermost copy takes float32 rows and a float32 ({features}, {self.batch}) "
                             f"buffer; got {self.out_x.dtype} rows and {out_xt.dtype} {out_xt.shape}")
        if self.backend.is_gpu:
            if self.host_source:
                raise ValueError("a batch-innermost copy is gathered from device memory, not from the host")
            self._kernel_t = get_kernel(_SOURCE, "gather_t", WORD_T="float")   # WORD_T: the module's other kernel
            self._grid_t = (-(-self.batch // 32), -(-features // 128))
        self.out_xt = out_xt

    def run(self, ahead: int = 0):
        """Gather the batch of step (device step counter + `ahead`), enqueued on the current stream."""
        if not self.backend.is_gpu:
            rows = self.host_rows(int(self.state.step[0]) + ahead)
            np.take(self.src_x, rows, axis=0, out=self.out_x)
            np.take(self.src_t, rows, axis=0, out=self.out_t)
            if self.out_xt is not None:
                self.out_xt[...] = self.out_x.reshape(self.batch, -1).T
            return
        if self.out_xt is not None:
            self._kernel_t(self._grid_t, (32 * _WARPS_PER_BLOCK,),
                           (self.src_x, self.src_t, self.out_x, self.out_xt, self.out_t, np.int32(self.out_xt.shape[0]),
                            np.int32(self.out_t.shape[1])) + self._order_args(ahead))
            return
        self._kernel((self._blocks,), (32 * _WARPS_PER_BLOCK,),
                     (self._src_words, self.src_t, self._out_words, self.out_t, np.int32(self._row_words),
                      np.int32(self._chunk_words), np.int32(self._chunks), np.int32(self.out_t.shape[1]))
                     + self._order_args(ahead))

    def _order_args(self, ahead: int) -> tuple:
        """Both kernels' last arguments: which rows this rank's batch of step (counter + ahead) takes."""
        return (self.state.step, np.int32(ahead), np.int64(self.state.steps_per_epoch), np.int32(self.batch),
                np.uint32(self.n), np.uint32(half_bits(self.n)), np.uint32(self.seed & 0xFFFFFFFF),
                np.uint32(self.batch * self.world), np.uint32(self.rank * self.batch))

    def host_rows(self, step: int) -> np.ndarray:
        """The source rows the kernel reads at global step `step` (NumPy, for the CPU and tests)."""
        return batch_rows(self.n, self.seed, step, self.batch, self.state.steps_per_epoch, self.rank, self.world)
