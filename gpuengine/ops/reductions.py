"""Column sums (bias gradients) in one deterministic launch.

A dense or convolution bias gradient is the sum of the output gradient over
its rows: (batch, units) for a dense layer, (N*H*W, C) for an NHWC convolution,
often tall and narrow (seed note 001: 100,352 x 16 at batch 128). One kernel
does it: the grid is (column tile, row chunk) blocks, about _BLOCKS_PER_SM per
SM. Inside a block, row lanes of tile_cols threads read consecutive columns of
consecutive rows (tiles of 32 columns: a 128-byte row segment per warp in fp32;
narrower matrices put several rows in one warp, so 16 columns stay coalesced;
a tile's width is a power of two) and the lanes' sums meet by warp shuffles,
then in shared memory. Each block writes its chunk's
partial sums, fences, and takes a ticket on its tile's counter; the block that
draws the last ticket adds all of the tile's chunks and writes dst.

Why one launch: the output gradient was just written and usually sits in L2,
so the sum is short and a second, latency-bound launch over the partials would
cost about as much again (a Transformer step makes ~70 of these sums). Why
deterministic: the last block adds the chunks in a fixed assignment (lane l
takes chunks l, l + lanes, ...), then a warp's lanes by shuffles and the
warps in order, so whichever block finishes last the result is the same, bit
for bit, run to run; no float atomics. The last block resets its counter, so
the next launch and every CUDA-graph replay start from zero. In a training
program the blocks end at their partials instead (DEFER), and the program adds
every kernel's in one launch after the backward pass (ops/partial_sums.py).

Other column-sum kernels (LayerNorm's two parameter gradients side by side)
reuse the block layout and the ending (`COLUMN_TILE_SOURCE`, `plan_chunks`):
`finish_column_sums<N>` takes N sums per thread and writes N destinations.

Rows wide enough to fill a warp with vector accesses (the Transformer's 768
and 1,024 features) take whole rows instead (`ROW_TILE_SOURCE`, `plan_rows`):
a thread a column reads them a few bytes at a time, far below the bandwidth
(28.8 us for a ReLU's gradient and its sum over 6,144 x 1,024 bf16 values on
an H200, where the ReLU's vectorised gradient alone took 7.6 us). A block
takes whole rows, a thread 16 bytes of a row, one block an SM; the block's
row lanes meet in shared memory, and the block drawing the last ticket adds
the blocks' rows of partials as float4 runs of blocks, in a fixed order.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..runtime.backend import widen
from ..runtime.kernels import ctype, get_kernel, launch_early, multiprocessor_count, vector_width

# DEFER's default, for the kernels compiled without it (batch norm's, which read their sums back).
_DEFER_SOURCE = r"""
#ifndef DEFER
#define DEFER 0   // 1: a block of several ends at its row of partials, which a training program adds
#endif
"""
# The block layout and ending every column-sum kernel shares; prepended to their sources.
COLUMN_TILE_SOURCE = _DEFER_SOURCE + r"""
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
// Each column's N sums s added over the block's row lanes in a fixed order, into total (valid in the column's
// owner, row lane 0): a warp's row lanes by shuffles (tile_cols apart, tile_cols a power of two), then the warps
// in order. Few sums (N <= 2: bias and LayerNorm gradients): the owner adds the warps' slots itself, with no
// second barrier. Many (the batch norm's 16): one thread per (sum, column) adds them, since an owner's chain
// of warps x N shared-memory loads held up the whole tile. Every thread calls it; the caller's next write of
// lane_sums must come after a barrier.
template <int N>
__device__ __forceinline__ void lane_totals(const float (&s)[N], float* lane_sums, const ColumnTile& t, int tile_cols,
                                            float (&total)[N]) {
    const int warps = blockDim.x >> 5, warp = threadIdx.x >> 5;
    #pragma unroll
    for (int j = 0; j < N; ++j) {
        float v = s[j];
        for (int o = tile_cols; o < 32; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if ((threadIdx.x & 31) < tile_cols) lane_sums[(j * warps + warp) * tile_cols + t.tc] = v;
    }
    __syncthreads();
    if (N > 2) {
        for (int k = threadIdx.x; k < N * tile_cols; k += blockDim.x) {   // slots (j, w, tc): read by thread k alone
            float* slots = lane_sums + (k / tile_cols) * warps * tile_cols + k % tile_cols;
            float sum = 0.f;
            for (int w = 0; w < warps; ++w) sum += slots[w * tile_cols];
            slots[0] = sum;
        }
        __syncthreads();
    }
    if (threadIdx.x >= tile_cols) return;
    #pragma unroll
    for (int j = 0; j < N; ++j) {
        const float* slots = lane_sums + j * warps * tile_cols + t.tc;
        if (N > 2) {
            total[j] = slots[0];
        } else {
            total[j] = 0.f;
            for (int w = 0; w < warps; ++w) total[j] += slots[w * tile_cols];
        }
    }
}
// The end of a column-sum kernel, every thread of the block calling it with its N sums s of column t.col.
// The block's totals go to partials[chunk][j * cols + col]; the block drawing its tile's last ticket adds all
// chunks of partials (lane l: chunks l, l + step, ...; then lane_totals) into dst[j][col] and resets the tile's
// counter. lane_sums holds N * blockDim.x floats. gridDim.y is the number of chunks. True in the block that
// wrote dst (its owner threads may read back their columns' sums), false in the others. With DEFER 1 every block
// of several chunks ends at its partials (rows of N * cols floats): a training program adds them after the
// backward pass (ops/partial_sums.py), so no caller may read dst back.
template <int N>
__device__ __forceinline__ bool finish_column_sums(const ColumnTile& t, int cols, int tile_cols, const float (&s)[N],
                                                   float* lane_sums, float* partials, unsigned int* counters,
                                                   float* const (&dst)[N]) {
    __shared__ bool last;
    const int chunks = gridDim.y;
    const bool owner = threadIdx.x < tile_cols && t.col < cols;   // row lane 0: one thread per column
    float total[N];
    lane_totals<N>(s, lane_sums, t, tile_cols, total);
    if (chunks == 1) {   // one chunk: the block's totals are the sums, no partials or ticket needed
        if (owner)
            for (int j = 0; j < N; ++j) dst[j][t.col] = total[j];
        return true;
    }
    if (owner) {
        float* chunk = partials + (long long)blockIdx.y * N * cols;
        for (int j = 0; j < N; ++j) chunk[j * cols + t.col] = total[j];
        if (!DEFER) __threadfence();   // the partials reach every SM before this block's ticket is taken
    }
    if (DEFER) return false;
    __syncthreads();   // also: the owners' reads end before lane_totals writes lane_sums again
    if (threadIdx.x == 0) {
        last = atomicAdd(counters + blockIdx.x, 1u) == (unsigned int)(chunks - 1);
        if (last) counters[blockIdx.x] = 0u;   // all tickets drawn: zero for the next launch or graph replay
    }
    __syncthreads();
    if (!last) return false;
    __threadfence();   // pairs with the writers' fences before the partials are read
    float f[N];
    #pragma unroll
    for (int j = 0; j < N; ++j) f[j] = 0.f;
    if (t.col < cols) {
        #pragma unroll 4
        for (int k = threadIdx.x / tile_cols; k < chunks; k += t.step) {   // unrolled: 4 chunks' loads in flight
            const volatile float* chunk = partials + (long long)k * N * cols;   // volatile: from L2, never a stale L1
            #pragma unroll
            for (int j = 0; j < N; ++j) f[j] += chunk[j * cols + t.col];
        }
    }
    lane_totals<N>(f, lane_sums, t, tile_cols, total);
    if (owner)
        for (int j = 0; j < N; ++j) dst[j][t.col] = total[j];
    return true;
}
"""
# The last block's sum of every block's row of partials, for the kernels that end so (whole rows, LayerNorm's).
BLOCK_ROWS_SOURCE = r"""
// In the block that drew the last ticket: the gridDim.x blocks' rows of partials (stride floats each, stride % 4 ==
// 0) added into runs[split][stride / 4], `split` threads sharing a group of 4 columns, each adding a run of blocks
// in order. Latency bound: float4 loads, 16 in flight a thread, from L2 (__ldcg, never a stale L1). The caller's sum
// j is then run_total(runs, split, stride, j), the runs added in order: the same bits every run.
__device__ __forceinline__ void add_block_rows(const float* partials, int stride, int split, float4* runs) {
    const int groups = stride >> 2;
    const unsigned int span = (gridDim.x + split - 1) / split;
    for (int i = threadIdx.x; i < groups * split; i += blockDim.x) {   // more groups than threads: split is 1
        const int g = i % groups, part = i / groups;
        const unsigned int first = part * span, end = min(gridDim.x, first + span);
        const float4* column = (const float4*)partials + g;
        float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
        #pragma unroll 16
        for (unsigned int b = first; b < end; ++b) {   // the run's blocks in order
            const float4 v = __ldcg(column + (long long)b * groups);
            sum.x += v.x; sum.y += v.y; sum.z += v.z; sum.w += v.w;
        }
        runs[part * groups + g] = sum;
    }
    __syncthreads();
}
__device__ __forceinline__ float run_total(const float4* runs, int split, int stride, int j) {
    float total = 0.f;
    for (int part = 0; part < split; ++part) total += ((const float*)runs)[part * stride + j];   // the runs in order
    return total;
}
"""
# Whole rows: the layout and ending of the column sums that take them; kernels compile it with VEC, a thread's values,
# and declare __launch_bounds__(ROW_THREADS), so that the compiler keeps to the registers a block of them may take.
_ROW_THREADS = 1024     # a whole-row block's threads at most
ROW_TILE_SOURCE = _DEFER_SOURCE + BLOCK_ROWS_SOURCE + f"#define ROW_THREADS {_ROW_THREADS}\n" + r"""
// A thread of a block of whole rows: the block takes rows first .. stop - 1 of its rows_per_block, lanes of them at a
// time (its row lanes of cols / VEC threads), a thread VEC neighbouring columns from col by one vector access.
struct RowTile {
    int lane, lanes, col;
    long long first, stop;
};
__device__ __forceinline__ RowTile row_tile(int rows, int cols, int rows_per_block) {
    RowTile t;
    const int per_row = cols / VEC;
    t.lanes = blockDim.x / per_row;
    t.lane = threadIdx.x / per_row;
    t.col = (threadIdx.x % per_row) * VEC;
    t.first = (long long)blockIdx.x * rows_per_block + t.lane;
    t.stop = min((long long)rows, (long long)(blockIdx.x + 1) * rows_per_block);
    return t;
}
// The end of a whole-row kernel, every thread of the block calling it with its VEC columns' sums s: the row lanes
// meet in shared memory in order (`shared`: lanes x cols floats), the block writes its row of partials (cols floats,
// cols % 4 == 0), and the block drawing the last ticket adds the blocks' rows in a fixed order, float4 runs of
// blocks read from L2 and then the runs in order: the same bits every run, no float atomics. It resets the counter
// for the next launch or graph replay. With DEFER 1 every block of several ends at its partials, which a training
// program adds after the backward pass (ops/partial_sums.py).
__device__ __forceinline__ void finish_row_sums(const RowTile& t, int cols, const float (&s)[VEC], float4* shared,
                                                float* dst, float* partials, unsigned int* counter) {
    __shared__ bool last;
    float* lane_sums = (float*)shared;
    #pragma unroll
    for (int k = 0; k < VEC; ++k) lane_sums[t.lane * cols + t.col + k] = s[k];
    __syncthreads();
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        float total = 0.f;
        for (int l = 0; l < t.lanes; ++l) total += lane_sums[l * cols + j];   // the row lanes in order
        if (gridDim.x == 1) dst[j] = total;   // one block: its sums are the result
        else partials[(long long)blockIdx.x * cols + j] = total;
    }
    if (gridDim.x == 1 || DEFER) return;
    __threadfence();   // the partials reach every SM before this block's ticket is taken
    __syncthreads();   // also: every read of lane_sums is done before it takes the runs
    if (threadIdx.x == 0) {
        last = atomicAdd(counter, 1u) == gridDim.x - 1;
        if (last) *counter = 0u;   // all tickets drawn: zero for the next launch or graph replay
    }
    __syncthreads();
    if (!last) return;
    __threadfence();   // pairs with the writers' fences before the partials are read
    const int split = max(1, min(t.lanes, (int)blockDim.x / (cols >> 2)));   // runs within the lanes' cols floats
    add_block_rows(partials, cols, split, shared);
    for (int j = threadIdx.x; j < cols; j += blockDim.x) dst[j] = run_total(shared, split, cols, j);
}
"""
_ROW_SOURCE = ROW_TILE_SOURCE + r"""
extern "C" __global__ void __launch_bounds__(ROW_THREADS) row_sum(const ELEM_T* __restrict__ src, float* dst,
                                                                  float* partials, unsigned int* counter, int rows,
                                                                  int cols, int rows_per_block) {
    extern __shared__ float4 shared[];   // float4: the last block's runs are 16-byte aligned
    const RowTile t = row_tile(rows, cols, rows_per_block);
    float s[VEC];
    #pragma unroll
    for (int k = 0; k < VEC; ++k) s[k] = 0.f;
    #pragma unroll 4
    for (long long r = t.first; r < t.stop; r += t.lanes) {
        const Pack<ELEM_T, VEC> a = load_pack<ELEM_T, VEC>(src, r * cols + t.col);
        #pragma unroll
        for (int k = 0; k < VEC; ++k) s[k] += load_f(a.v, k);
    }
    finish_row_sums(t, cols, s, shared, dst, partials, counter);
}
"""
_SOURCE = COLUMN_TILE_SOURCE + r"""
extern "C" __global__ void column_sum(const ELEM_T* src, float* dst, float* partials, unsigned int* counters,
                                      int rows, int cols, int rows_per_chunk, int tile_cols) {
    extern __shared__ float lane_sums[];
    const ColumnTile t = column_tile(rows, rows_per_chunk, tile_cols);
    float s[1] = {0.f};
    if (t.col < cols) {
        #pragma unroll 8
        for (long long r = t.first; r < t.stop; r += t.step) s[0] += load_f(src, r * cols + t.col);
    }
    float* const out[1] = {dst};
    finish_column_sums<1>(t, cols, tile_cols, s, lane_sums, partials, counters, out);
}
"""
_THREADS = 256
_TILE_COLS = 32         # columns per row lane: one warp reads one 128-byte fp32 row segment
_BLOCKS_PER_SM = 2      # enough blocks to cover L2 latency; fewer chunks for the last block to add
_MIN_ROWS_PER_LANE = 8  # below this a chunk's set-up and ticket cost more than its loads
_MAX_CHUNKS = 65535     # CUDA's limit on gridDim.y


def deferred(sums, blocks: int, partials, segments) -> bool:
    """Whether `sums` (a PartialSums, or None) adds a grid's partials: where it has several blocks' (one writes dst
    itself) and `sums` takes them; its kernel is then compiled with DEFER 1."""
    return blocks > 1 and sums is not None and sums.add(partials, segments)


@dataclass(frozen=True)
class ChunkPlan:
    """A column sum's grid: `tiles` column tiles by `chunks` row chunks, `threads` per block."""

    tile_cols: int
    threads: int
    tiles: int
    rows_per_chunk: int
    chunks: int

    def workspace(self, allocator, cols: int, sums: int = 1):
        """(partials, counters): each chunk's `sums` x cols partial sums, one ticket counter per tile (zeroed
        here; the kernels leave them zero)."""
        return (allocator.zeros((self.chunks, sums * cols), np.float32, "workspace"),
                allocator.zeros((self.tiles,), np.uint32, "workspace"))

    def defer(self, sums, partials, segments) -> bool:
        return deferred(sums, self.chunks, partials, segments)

    def grid_args(self) -> tuple:
        """The kernels' last arguments: rows a chunk, columns a tile."""
        return np.int32(self.rows_per_chunk), np.int32(self.tile_cols)

    def shared_bytes(self, sums: int = 1) -> int:
        """A block's dynamic shared memory: its threads' `sums` float partials."""
        return 4 * sums * self.threads

    def launch(self, kernel, args: tuple, sums: int = 1, early: bool = False):
        """`early`: launch_early's programmatic launch (a kernel compiled to wait for the one before it)."""
        grid, block, shared = (self.tiles, self.chunks), (self.threads,), self.shared_bytes(sums)
        if early:
            launch_early(kernel, grid, block, args, shared)
        else:
            kernel(grid, block, args, shared_mem=shared)


@dataclass(frozen=True)
class RowPlan:
    """A column sum's grid of whole rows: `blocks` blocks of `threads`, row lanes of cols / width threads, each
    block taking `rows_per_block` rows."""

    width: int
    threads: int
    rows_per_block: int
    blocks: int

    def workspace(self, allocator, cols: int):
        """(partials, counter): each block's cols partial sums and the one ticket counter (zeroed here; the kernels
        leave it zero)."""
        return (allocator.zeros((self.blocks, cols), np.float32, "workspace"),
                allocator.zeros((1,), np.uint32, "workspace"))

    def defer(self, sums, partials, segments) -> bool:
        return deferred(sums, self.blocks, partials, segments)

    def grid_args(self) -> tuple:
        """The kernels' last argument: rows a block."""
        return (np.int32(self.rows_per_block),)

    def launch(self, kernel, args: tuple):
        kernel((self.blocks,), (self.threads,), args, shared_mem=4 * self.threads * self.width)   # lanes x cols


def row_grid(rows: int, cols: int, width: int, blocks: int) -> RowPlan | None:
    """Whole rows moved `width` values a thread, as many rows at a time as fit 1,024 threads, at most `blocks`
    blocks (the last one reads a row of partials of each); None where a row's threads would not fill a warp or fit a
    block, or its partials are not float4 rows (cols % 4): the column tiles take those."""
    per_row = cols // width
    if cols % 4 or not 32 <= per_row <= _ROW_THREADS:
        return None
    lanes = _ROW_THREADS // per_row
    rows_per_block = lanes * max(1, -(-rows // (lanes * blocks)))
    return RowPlan(width, lanes * per_row, rows_per_block, -(-rows // rows_per_block))


def plan_rows(backend, rows: int, cols: int, *arrays) -> RowPlan | None:
    """row_grid on this GPU, a thread up to 16 bytes of every array's rows (vector_width); None on the NumPy
    backend."""
    if not backend.is_gpu:
        return None
    width = vector_width(cols, *arrays, widest=16 // arrays[0].itemsize)
    return row_grid(rows, cols, width, multiprocessor_count())


def plan_chunks(backend, rows: int, cols: int, rows_per_chunk: int | None = None,
                blocks_per_sm: int = _BLOCKS_PER_SM, widest_tile: int = _TILE_COLS) -> ChunkPlan:
    """Tiles of up to `widest_tile` columns (a power of two: a warp's row lanes meet by shuffles); enough row
    chunks for about `blocks_per_sm` blocks on every SM."""
    if widest_tile < 1 or widest_tile & (widest_tile - 1) or widest_tile > 32:
        raise ValueError(f"plan_chunks: widest_tile {widest_tile} is not a power of two up to 32")
    tile_cols = min(1 << (cols - 1).bit_length(), widest_tile)   # the power of two at or above cols
    threads = _THREADS   # a multiple of tile_cols: narrow tiles put several rows in a warp
    tiles = -(-cols // tile_cols)
    if rows_per_chunk is None:
        target_chunks = max(1, blocks_per_sm * (multiprocessor_count() if backend.is_gpu else 1) // tiles)
        row_lanes = threads // tile_cols
        rows_per_chunk = max(row_lanes * _MIN_ROWS_PER_LANE, -(-rows // target_chunks))
    chunks = max(1, -(-rows // rows_per_chunk))
    if chunks > _MAX_CHUNKS:
        raise ValueError(f"{chunks} row chunks of {rows_per_chunk} rows exceed the grid's {_MAX_CHUNKS}")
    return ChunkPlan(tile_cols, threads, tiles, rows_per_chunk, chunks)


class ColumnSum:
    """dst[c] = sum_r src[r, c], into a preallocated float32 `dst`: whole rows where they are wide, else column tiles
    (always with `rows_per_chunk`); where `sums` (a training program's ops.partial_sums.PartialSums) takes them, the
    blocks' partials are added by its launch after the backward pass."""

    def __init__(self, backend, allocator, src, dst, rows_per_chunk: int | None = None, sums=None):
        if src.ndim != 2 or dst.shape != (src.shape[1],):
            raise ValueError(f"ColumnSum of {src.shape} into {dst.shape}")
        self.backend, self.src, self.dst = backend, src, dst
        self.rows, self.cols = src.shape
        whole = plan_rows(backend, self.rows, self.cols, src) if rows_per_chunk is None else None
        self.plan = whole or plan_chunks(backend, self.rows, self.cols, rows_per_chunk)
        if not backend.is_gpu:
            return
        self.partials, self.counters = self.plan.workspace(allocator, self.cols)
        defer = int(self.plan.defer(sums, self.partials, [(0, dst)]))
        if whole is not None:
            self._kernel = get_kernel(_ROW_SOURCE, "row_sum", ELEM_T=ctype(src.dtype), VEC=whole.width, DEFER=defer)
        else:
            self._kernel = get_kernel(_SOURCE, "column_sum", ELEM_T=ctype(src.dtype), DEFER=defer)
        self._args = (src, dst, self.partials, self.counters, np.int32(self.rows), np.int32(self.cols),
                      *self.plan.grid_args())

    def run(self):
        if not self.backend.is_gpu:
            self.dst[...] = widen(self.src).sum(axis=0)
            return
        self.plan.launch(self._kernel, self._args)
