"""Column sums (bias gradients) in two deterministic passes.

A dense or convolution bias gradient is the sum of the output gradient over
its rows: (batch, units) for a dense layer, (N*H*W, C) for an NHWC convolution,
often tall and narrow (seed note 001: 100,352 x 16 at batch 128). Pass 1 splits
the rows into a fixed number of chunks, one block per (chunk, tile of up to 256
columns); inside a block, lanes of threads read consecutive columns of
consecutive rows (coalesced even for 16 columns) and their sums meet in shared
memory. Pass 2 adds the chunks' partial sums with the same kernel, in tiles of
32 columns so that 8 lanes share each column's chunks (one thread per column
walking hundreds of chunks took ~13 us a call: 0.66 ms of the Transformer's
step on an H100). No atomics and a fixed order, so results do not vary run to
run.

Other pass-1 kernels (LayerNorm's parameter gradients) reuse the block layout
(`COLUMN_TILE_SOURCE`, `plan_chunks`) and pass 2 (`ChunkSum`); pass 2 reads
rows `ld` floats apart, so one partials array can hold several sums side by side.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..runtime.backend import widen
from ..runtime.kernels import ctype, get_kernel, multiprocessor_count

# The block layout every pass-1 kernel shares; prepended to their sources.
COLUMN_TILE_SOURCE = r"""
// A thread of a (column tile, row chunk) block: it owns column `col` and walks rows first, first + step, ...
// below stop; the tile's tile_cols threads of one row lane read consecutive columns of the same row.
struct ColumnTile {
    int tc, col, step;
    long long first, stop;
};
__device__ __forceinline__ ColumnTile column_tile(int rows, int rows_per_chunk, int tile_cols) {
    ColumnTile t;
    t.step = blockDim.x / tile_cols;
    t.tc = threadIdx.x % tile_cols;
    t.col = blockIdx.x * tile_cols + t.tc;
    const long long start = (long long)blockIdx.y * rows_per_chunk;
    t.first = start + threadIdx.x / tile_cols;
    t.stop = min((long long)rows, start + rows_per_chunk);
    return t;
}
// The thread's column summed over the block's row lanes in lane order (after __syncthreads, in row lane 0).
__device__ __forceinline__ float lanes_total(const float* lane_sums, const ColumnTile& t, int tile_cols) {
    float s = 0.f;
    for (int l = 0; l < t.step; ++l) s += lane_sums[l * tile_cols + t.tc];
    return s;
}
"""
_SOURCE = COLUMN_TILE_SOURCE + r"""
extern "C" __global__ void column_partials(const ELEM_T* src, float* partials, int rows, int cols, int ld,
                                           int rows_per_chunk, int tile_cols) {
    extern __shared__ float lane_sums[];
    const ColumnTile t = column_tile(rows, rows_per_chunk, tile_cols);
    float s = 0.f;
    if (t.col < cols) {
        #pragma unroll 4
        for (long long r = t.first; r < t.stop; r += t.step) s += load_f(src, r * ld + t.col);
    }
    lane_sums[threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.x < tile_cols && t.col < cols)
        partials[(long long)blockIdx.y * cols + t.col] = lanes_total(lane_sums, t, tile_cols);
}
"""
_THREADS = 256
_BLOCKS_PER_SM = 4      # pass-1 blocks in flight per SM: enough loads to cover memory latency
_MIN_ROWS_PER_LANE = 8  # below this a chunk's set-up costs more than its loads
_PASS2_TILE = 32        # pass 2's columns per block: 8 row lanes per column at 256 threads


@dataclass(frozen=True)
class ChunkPlan:
    """Pass 1's grid over a (rows, cols) sum: `tiles` column tiles by `chunks` row chunks, `threads` per block."""

    tile_cols: int
    threads: int
    tiles: int
    rows_per_chunk: int
    chunks: int


def plan_chunks(backend, rows: int, cols: int, rows_per_chunk: int | None = None) -> ChunkPlan:
    """Tiles of up to 256 columns; enough row chunks to keep _BLOCKS_PER_SM blocks on every SM."""
    tile_cols = min(cols, _THREADS)
    threads = tile_cols * (_THREADS // tile_cols)
    tiles = -(-cols // tile_cols)
    if rows_per_chunk is None:
        target_chunks = max(1, _BLOCKS_PER_SM * (multiprocessor_count() if backend.is_gpu else 1) // tiles)
        row_lanes = threads // tile_cols
        rows_per_chunk = max(row_lanes * _MIN_ROWS_PER_LANE, -(-rows // target_chunks))
    return ChunkPlan(tile_cols, threads, tiles, rows_per_chunk, max(1, -(-rows // rows_per_chunk)))


class ChunkSum:
    """Pass 2 on a GPU: dst[c] = sum over k < chunks of partials[k * ld + c], float32 in and out."""

    def __init__(self, partials, dst, chunks: int, ld: int):
        self.partials, self.dst, self.chunks, self.ld = partials, dst, chunks, ld
        self.cols = dst.shape[0]
        self.tile = min(self.cols, _PASS2_TILE)
        self.threads = self.tile * (_THREADS // self.tile)
        self._kernel = get_kernel(_SOURCE, "column_partials", ELEM_T="float")

    def run(self):
        self._kernel((-(-self.cols // self.tile), 1), (self.threads,),
                     (self.partials, self.dst, np.int32(self.chunks), np.int32(self.cols), np.int32(self.ld),
                      np.int32(self.chunks), np.int32(self.tile)), shared_mem=4 * self.threads)


class ColumnSum:
    """dst[c] = sum_r src[r, c], into a preallocated float32 `dst`."""

    def __init__(self, backend, allocator, src, dst, rows_per_chunk: int | None = None):
        if src.ndim != 2 or dst.shape != (src.shape[1],):
            raise ValueError(f"ColumnSum of {src.shape} into {dst.shape}")
        self.backend, self.src, self.dst = backend, src, dst
        self.rows, self.cols = src.shape
        self.plan = plan_chunks(backend, self.rows, self.cols, rows_per_chunk)
        if backend.is_gpu:
            self.partials = allocator.zeros((self.plan.chunks, self.cols), np.float32, "workspace")
            self._k1 = get_kernel(_SOURCE, "column_partials", ELEM_T=ctype(src.dtype))
            self._pass2 = ChunkSum(self.partials, dst, self.plan.chunks, self.cols)

    def run(self):
        if not self.backend.is_gpu:
            self.dst[...] = widen(self.src).sum(axis=0)
            return
        plan = self.plan
        self._k1((plan.tiles, plan.chunks), (plan.threads,),
                 (self.src, self.partials, np.int32(self.rows), np.int32(self.cols), np.int32(self.cols),
                  np.int32(plan.rows_per_chunk), np.int32(plan.tile_cols)), shared_mem=4 * plan.threads)
        self._pass2.run()
