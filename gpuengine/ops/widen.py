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


class Widening:
    """The (bf16 scratch, fp32 master) gradient pairs of one training program, widened in one launch."""

    def __init__(self, backend, allocator):
        self.backend, self.allocator = backend, allocator
        self.step = 0   # the backward step whose layer is being built: the program sets it
        self._pairs: list[tuple[int, object, object]] = []   # (backward step, scratch, master)
        self._launches: dict | None = None   # None (every pair) or a backward step -> (kernel, grid, table)

    def add(self, scratch, master) -> bool:
        """`scratch` (bf16) is widened into `master` (float32, the same shape) by `run` or `run_step`; True: the
        layer leaves the widening to this."""
        if scratch.shape != master.shape or scratch.dtype.itemsize != 2 or master.dtype != np.float32:
            raise ValueError(f"widening takes a bf16 scratch and a float32 master of one shape, got "
                             f"{scratch.dtype} {scratch.shape} and {master.dtype} {master.shape}")
        if self._launches is not None:
            raise RuntimeError("a gradient pair added after the widening was built: add every pair first")
        self._pairs.append((self.step, scratch, master))
        return True

    def __len__(self):
        return len(self._pairs)

    def build(self):
        """The launches' tables, on the device once every pair is in (outside capture)."""
        self._launches = {}
        if not self.backend.is_gpu or not self._pairs:
            return
        for step in [None] + sorted({s for s, _, _ in self._pairs}):
            self._launches[step] = self._launch([(a, b) for s, a, b in self._pairs if step is None or s == step])

    def run(self):
        """Widen every pair (after the whole backward pass)."""
        self._widen(None)

    def run_step(self, step: int):
        """Widen the pairs of backward step `step` (after that step, before its gradients are sent)."""
        self._widen(step)

    def _widen(self, step):
        if self._launches is None:
            raise RuntimeError("the widening runs once built (Widening.build)")
        if not self.backend.is_gpu:
            for s, scratch, master in self._pairs:
                if step is None or s == step:
                    np.copyto(master, scratch, casting="unsafe")
            return
        if step in self._launches:
            kernel, grid, table = self._launches[step]
            kernel(grid, (THREADS,), (table,))

    def _launch(self, pairs):
        width = vector_width(CHUNK, *[a for pair in pairs for a in pair])   # 8 bytes of bf16 in, 16 of float out
        rows = chunk_rows([(int(s.data.ptr), int(m.data.ptr), int(s.size)) for s, m in pairs])
        with self.backend.activate():
            table = self.allocator.zeros((len(rows), 3), np.int64, "workspace")
            self.backend.upload(table, np.asarray(rows, np.int64))
        return get_kernel(_SOURCE, "widen_chunks", VEC=width), (len(rows),), table
