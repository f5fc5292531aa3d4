"""Column sums of a step's kernels finished together: their blocks' partial sums added in one launch.

The engine's column sums (bias gradients, LayerNorm's dgamma and dbeta) end in
one launch: each block writes its row of partial sums, fences, takes a ticket,
and the block that draws the last ticket adds every block's row. The whole
launch waits for that chain: the fence, the ticket and one block reading up to
132 rows from L2 (at 1,024 rows x 256 features a LayerNorm backward took 7.7 us
where its bytes take about 1 us on an H200). Nothing reads those gradients
before the optimizer, so a training program collects each such kernel's
partials (`PartialSums.add`: LayerNorm's one-launch backward and its column
sums, ColumnSum, BackwardColumnSum), the kernel writes them and ends, and one
launch after the backward pass adds them all: a table of column runs, block b
adding run b's 32 columns over the partials' rows. Deterministic: a run's rows
are split among 16 warps in a fixed assignment, each adding its rows in order,
then the warps' sums in order; the same bits every run, no atomics, no counter
to reset. (A narrow convolution's bias sum has hundreds of chunks, which its
last block added alone.)

Data parallel all-reduces each backward step's gradients as soon as that step
has written them, so a program built for it (TrainingProgram's each_step)
leaves its sums to their own kernels' last blocks: a launch a step would add
launches. `run_step` (step_launches.py) finishes one step's sums where a
program that took them is run step by step all the same.
"""
from __future__ import annotations

import numpy as np

from ..runtime.kernels import get_kernel
from .step_launches import StepLaunches

RUN_COLS = 32     # columns a block adds: a warp reads a 128-byte row segment
RUN_WARPS = 16    # warps sharing a run's rows: at most ceil(rows / 16) loads a thread, all in flight

_SOURCE = r"""
// Block b adds run b of the table: (source, stride, rows, count, destination): dst[c] = sum over r of
// src[r * stride + c] for c < count, the rows split among the block's warps in order, then the warps in order.
extern "C" __global__ void __launch_bounds__(32 * RUN_WARPS) partial_sums(const long long* table) {
    __shared__ float warp_sums[RUN_WARPS][32];
    const long long* run = table + 5 * (long long)blockIdx.x;
    const float* src = reinterpret_cast<const float*>(run[0]);
    const long long stride = run[1];
    const int rows = (int)run[2], count = (int)run[3];
    float* dst = reinterpret_cast<float*>(run[4]);
    const int c = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int span = (rows + RUN_WARPS - 1) / RUN_WARPS, first = warp * span, end = min(rows, first + span);
    float sum = 0.f;
    if (c < count) {
        #pragma unroll 16
        for (int r = first; r < end; ++r) sum += src[r * stride + c];   // this warp's rows in order
    }
    warp_sums[warp][c] = sum;
    __syncthreads();
    if (warp == 0 && c < count) {
        float total = 0.f;
        #pragma unroll
        for (int w = 0; w < RUN_WARPS; ++w) total += warp_sums[w][c];   // the warps in order
        dst[c] = total;
    }
}
"""


def column_runs(entries: list[tuple[int, int, int, int, int]], cols: int = RUN_COLS) -> list[tuple[int, ...]]:
    """The table's rows: each (source address, stride in floats, rows, count, destination address) cut into runs
    of at most `cols` columns, their addresses stepped by 4 bytes a column."""
    runs = []
    for source, stride, rows, count, destination in entries:
        for start in range(0, count, cols):
            runs.append((source + 4 * start, stride, rows, min(cols, count - start), destination + 4 * start))
    return runs


class PartialSums(StepLaunches):
    """The partial column sums of one training program's kernels, finished in one launch after the backward pass."""

    threads = 32 * RUN_WARPS
    unbuilt = "the partial sums are finished once built (PartialSums.build)"
    late = "partial sums added after the finishing launch was built: add every sum first"

    def add(self, partials, segments) -> bool:
        """`partials` (float32, a row per block) holds, for each (first column, destination) of `segments`, the
        blocks' sums of destination.size columns from that first one; `run` or `run_step` adds the rows into each
        destination (float32). True: the kernel that writes the partials leaves their sum to this; False (nothing
        taken) where a destination is strided, which the table's runs cannot address."""
        if partials.dtype != np.float32 or partials.ndim != 2:
            raise ValueError(f"partial sums are a float32 row per block, got {partials.dtype} {partials.shape}")
        for first, destination in segments:
            if destination.dtype != np.float32 or not 0 <= first <= first + destination.size <= partials.shape[1]:
                raise ValueError(f"a sum into {destination.size} {destination.dtype} values from column {first} does "
                                 f"not fit float32 partials of {partials.shape[1]} columns and a float32 destination")
        if not all(destination.flags.c_contiguous for _, destination in segments):
            return False
        self._add([(partials, first, destination) for first, destination in segments])
        return True

    def _on_host(self, partials, first, destination):
        destination.reshape(-1)[...] = partials[:, first:first + destination.size].sum(axis=0)

    def _launch(self, sums):
        runs = column_runs([(int(p.data.ptr) + 4 * first, p.shape[1], p.shape[0], d.size, int(d.data.ptr))
                            for p, first, d in sums])
        return get_kernel(_SOURCE, "partial_sums", RUN_WARPS=RUN_WARPS), (len(runs),), self.allocator.table(runs)
