"""bf16 weight gradients widened into their fp32 master gradients, all of a step's in one launch.

Under bf16 a convolution's weight gradient comes out of cuDNN in a bf16 scratch
(layers/conv.py says why) and is widened into the fp32 master gradient the
optimizer reads. One copy a convolution is 53 launches in a ResNet-50 step,
177 us on an H100, where the 141 MB they move take about 50 us at the GPU's
bandwidth (docs/seeds.md). So a training program collects every (scratch,
master) pair its layers build (`Widening.add`) and widens them together: one
launch over a table of chunks, block b reading row b's (source address,
destination address, count) and widening its values VEC at a time. Data
parallel all-reduces each backward step's gradients as soon as that step has
written them, so there each step's pairs are widened by a launch of their own
right after it (`run_step`), which is today's launch count.
"""
from __future__ import annotations

import numpy as np

from ..runtime.kernels import get_kernel, vector_width
from .step_launches import StepLaunches

CHUNK = 16384          # values a block widens: a multiple of every vector width, so chunks keep their alignment
THREADS = 256

_SOURCE = r"""
// Block b widens row b of the table: `count` bf16 values at `source` into floats at `destination`.
extern "C" __global__ void widen_chunks(const long long* table) {
    const long long* row = table + 3 * (long long)blockIdx.x;
    const bf16_t* src = reinterpret_cast<const bf16_t*>(row[0]);
    float* dst = reinterpret_cast<float*>(row[1]);
    const long long count = row[2], packs = count / VEC;
    for (long long p = threadIdx.x; p < packs; p += blockDim.x) {
        const Pack<bf16_t, VEC> s = load_pack<bf16_t, VEC>(src, p * VEC);
        Pack<float, VEC> d;
        #pragma unroll
        for (int k = 0; k < VEC; ++k) d.v[k] = bf16_to_float(s.v[k]);
        store_pack(dst, p * VEC, d);
    }
    for (long long i = packs * VEC + threadIdx.x; i < count; i += blockDim.x) dst[i] = bf16_to_float(src[i]);
}
"""


def chunk_rows(pairs: list[tuple[int, int, int]], chunk: int = CHUNK) -> list[tuple[int, int, int]]:
    """The table's rows: each (source address, destination address, count) pair cut into chunks of `chunk`
    values (the last one shorter), bf16 sources and float destinations."""
    rows = []
    for source, destination, count in pairs:
        for start in range(0, count, chunk):
            rows.append((source + 2 * start, destination + 4 * start, min(chunk, count - start)))
    return rows


class Widening(StepLaunches):
    """The (bf16 scratch, fp32 master) gradient pairs of one training program, widened in one launch."""

    threads = THREADS
    unbuilt = "the widening runs once built (Widening.build)"
    late = "a gradient pair added after the widening was built: add every pair first"

    def add(self, scratch, master) -> bool:
        """`scratch` (bf16) is widened into `master` (float32, the same shape) by `run` or `run_step`; True: the
        layer leaves the widening to this."""
        if scratch.shape != master.shape or scratch.dtype.itemsize != 2 or master.dtype != np.float32:
            raise ValueError(f"widening takes a bf16 scratch and a float32 master of one shape, got "
                             f"{scratch.dtype} {scratch.shape} and {master.dtype} {master.shape}")
        self._add([(scratch, master)])
        return True

    def pairs(self) -> list[tuple]:
        """Every (bf16 scratch, float32 master) pair added, in order."""
        return [item for _, item in self._items]

    def _on_host(self, scratch, master):
        np.copyto(master, scratch, casting="unsafe")

    def _launch(self, pairs):
        width = vector_width(CHUNK, *[a for pair in pairs for a in pair])   # 8 bytes of bf16 in, 16 of float out
        rows = chunk_rows([(int(s.data.ptr), int(m.data.ptr), int(s.size)) for s, m in pairs])
        return get_kernel(_SOURCE, "widen_chunks", VEC=width), (len(rows),), self.allocator.table(rows)
