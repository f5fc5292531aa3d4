"""Sinusoidal positional encoding (Vaswani et al. 2017, section 3.5): y = x + PE, PE a fixed table.

PE[t, 2i] = sin(t / 10000^(2i/d)), PE[t, 2i+1] = cos(t / 10000^(2i/d)) for
positions t of a (T, d) sample. The table is computed once on the host in
float64 and held in float32; nothing is trained, and the input gradient is the
output gradient itself (like a residual add), so backward computes nothing.
Over a token embedding that only it reads, a program has the embedding add the
table as it writes its rows (`added_by_input`): this layer then runs nothing.
"""
from __future__ import annotations

import numpy as np

from ..runtime.backend import widen
from ..runtime.kernels import ctype, get_kernel, launch_shape
from .base import BuildContext, Layer

_SOURCE = r"""
extern "C" __global__ void add_table(const ELEM_T* x, const float* table, ELEM_T* out, long long table_size,
                                     long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        store_f(out, i, load_f(x, i) + table[i % table_size]);
}
"""


def sinusoid_table(length: int, d_model: int) -> np.ndarray:
    """The (length, d_model) float64 table; an odd d_model's last column is a sine."""
    position = np.arange(length, dtype=np.float64)[:, None]
    rate = np.exp(-np.log(10000.0) * np.arange(0, d_model, 2, dtype=np.float64) / d_model)
    table = np.zeros((length, d_model))
    table[:, 0::2] = np.sin(position * rate)
    table[:, 1::2] = np.cos(position * rate[:d_model // 2])
    return table


def device_table(ctx: BuildContext, shape: tuple, dtype) -> object:
    """The table on the context's device: float64 under the gradient checks' precision, float32 otherwise (bf16
    activations add it in float32)."""
    host = sinusoid_table(*shape)
    table = ctx.allocator.zeros(host.shape, np.float64 if dtype == np.float64 else np.float32, "workspace")
    ctx.backend.upload(table, host)
    return table


class SinusoidalPositionalEncoding(Layer):
    """(T, d) samples plus the fixed table of T positions."""

    added_by_input = False   # set by a program whose TokenEmbedding below adds the table as it writes its rows
    wiring = ("added_by_input",)

    def __init__(self, name: str = ""):
        self.name = name

    def output_shape(self, input_shape):
        if len(input_shape) != 2:
            raise ValueError(f"{self.name}: positional encoding takes (positions, d_model) samples, "
                             f"got {tuple(input_shape)}")
        return tuple(input_shape)

    def build_forward(self, ctx: BuildContext, x):
        self.backend, self.x = ctx.backend, x
        if self.added_by_input:   # x holds x + PE already
            self.out = x
            return x
        self.table = device_table(ctx, x.shape[1:], x.dtype)
        self.out = ctx.allocator.zeros(x.shape, x.dtype, "activations")
        if ctx.backend.is_gpu:
            self._kernel = get_kernel(_SOURCE, "add_table", ELEM_T=ctype(x.dtype))
        return self.out

    def build_backward(self, ctx: BuildContext, dy, needs_input_grad: bool):
        return dy if needs_input_grad else None

    def forward(self):
        if self.added_by_input:
            return
        if not self.backend.is_gpu:
            self.out[...] = (widen(self.x) + self.table).astype(self.out.dtype)
            return
        grid, block = launch_shape(self.out.size)
        self._kernel(grid, block, (self.x, self.table, self.out, np.int64(self.table.size), np.int64(self.out.size)))

    def backward(self):
        """Nothing to compute: the input gradient is the output gradient."""
