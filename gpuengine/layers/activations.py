"""Element-wise activations: tanh (the MLP's), ReLU and ReLU6, forward and backward.

tanh' = 1 - tanh^2, so backward needs only the forward output, not the input.
ReLU' = [y > 0], likewise; ReLU6 = min(max(x, 0), 6) (MobileNetV2, Sandler et
al. 2018) has ReLU6' = [0 < y < 6], which is torch's hardtanh gradient (zero
at both clip points). Each is one CUDA kernel over the buffer, up to 16 bytes a thread;
`activation_forward`/`activation_backward` serve layers that fuse an
activation into their own forward (a convolution's conv + bias + ReLU graph).
`BackwardColumnSum` is such a layer's backward with its bias gradient: dz =
act'(y) dy written and summed down each column in the same pass, instead of
a second launch that reads dz back (VGG-16's conv gradients are 0.9 GB a step).
It takes reductions.py's column tiles, or its whole rows where rows are wide
(`backward_row_sums`: the Transformer's feed-forward, VGG's deeper layers).
An Activation whose input layer applies it (a Linear's ReLU epilogue) takes
that layer's bias gradient the same way (`bias_of`), and the layer's weight
gradient GEMM runs without a bias epilogue.
"""
from __future__ import annotations

import numpy as np

from .. import checks
from ..ops.reductions import COLUMN_TILE_SOURCE, ROW_TILE_SOURCE, plan_chunks, plan_rows
from ..runtime.backend import widen
from ..runtime.kernels import ctype, get_kernel, packed_launch
from .base import BuildContext, Layer

_SOURCE = r"""
__device__ __forceinline__ float act(float x) { return @FORWARD@; }
__device__ __forceinline__ float act_grad(float y, float dy) { return @BACKWARD@; }
// VEC values a thread, moved by one vector access per buffer.
extern "C" __global__ void forward(const ELEM_T* x, ELEM_T* y, long long packs) {
    for (long long n = blockIdx.x * (long long)blockDim.x + threadIdx.x; n < packs;
         n += (long long)gridDim.x * blockDim.x) {
        const Pack<ELEM_T, VEC> a = load_pack<ELEM_T, VEC>(x, n * VEC);
        Pack<ELEM_T, VEC> b;
        #pragma unroll
        for (int k = 0; k < VEC; ++k) store_f(b.v, k, act(load_f(a.v, k)));
        store_pack(y, n * VEC, b);
    }
}
extern "C" __global__ void backward(const ELEM_T* y, const ELEM_T* dy, ELEM_T* dx, long long packs) {
    for (long long n = blockIdx.x * (long long)blockDim.x + threadIdx.x; n < packs;
         n += (long long)gridDim.x * blockDim.x) {
        const Pack<ELEM_T, VEC> a = load_pack<ELEM_T, VEC>(y, n * VEC), g = load_pack<ELEM_T, VEC>(dy, n * VEC);
        Pack<ELEM_T, VEC> b;
        #pragma unroll
        for (int k = 0; k < VEC; ++k) store_f(b.v, k, act_grad(load_f(a.v, k), load_f(g.v, k)));
        store_pack(dx, n * VEC, b);
    }
}
"""

_ACTIVATIONS = {
    "tanh": ("tanhf(x)", "dy * (1.f - y * y)",
             lambda x: np.tanh(x), lambda y, dy: dy * (1.0 - y * y)),
    "relu": ("fmaxf(x, 0.f)", "y > 0.f ? dy : 0.f",
             lambda x: np.maximum(x, 0.0), lambda y, dy: np.where(y > 0, dy, 0.0)),
    "relu6": ("fminf(fmaxf(x, 0.f), 6.f)", "y > 0.f && y < 6.f ? dy : 0.f",
              lambda x: np.clip(x, 0.0, 6.0), lambda y, dy: np.where((y > 0) & (y < 6), dy, 0.0)),
}


# One source per activation, made once: get_kernel's cache keys on the source text.
SOURCES = {kind: _SOURCE.replace("@FORWARD@", forward).replace("@BACKWARD@", backward)
           for kind, (forward, backward, _, _) in _ACTIVATIONS.items()}

_SUM_SOURCE = COLUMN_TILE_SOURCE + r"""
__device__ __forceinline__ float act_grad(float y, float dy) { return @BACKWARD@; }
// dz = act'(y) dy over a (rows, cols) gradient, and dst[c] = sum_r dz[r, c] of the values as stored.
extern "C" __global__ void backward_column_sum(const ELEM_T* __restrict__ y, const ELEM_T* __restrict__ dy,
                                               ELEM_T* __restrict__ dz, float* dst, float* partials,
                                               unsigned int* counters, int rows, int cols, int rows_per_chunk,
                                               int tile_cols) {
    extern __shared__ float lane_sums[];
    const ColumnTile t = column_tile(rows, rows_per_chunk, tile_cols);
    float s[1] = {0.f};
    if (t.col < cols) {
        #pragma unroll 8
        for (long long r = t.first; r < t.stop; r += t.step) {
            const long long i = r * cols + t.col;
            store_f(dz, i, act_grad(load_f(y, i), load_f(dy, i)));
            s[0] += load_f(dz, i);   // rounded as stored: the sum a separate pass over dz would take
        }
    }
    float* const out[1] = {dst};
    finish_column_sums<1>(t, cols, tile_cols, s, lane_sums, partials, counters, out);
}
"""
SUM_SOURCES = {kind: _SUM_SOURCE.replace("@BACKWARD@", backward) for kind, (_, backward, _, _) in _ACTIVATIONS.items()}
_SUM_BLOCKS_PER_SM = 4   # three streams (y, dy, dz) to keep in flight, against a plain sum's one

_ROW_SUM_SOURCE = ROW_TILE_SOURCE + r"""
__device__ __forceinline__ float act_grad(float y, float dy) { return @BACKWARD@; }
// dz = act'(y) dy over (rows, cols) and dst[c] = sum_r dz[r, c] as stored, by whole rows (reductions.py).
extern "C" __global__ void __launch_bounds__(ROW_THREADS) backward_row_sums(
        const ELEM_T* __restrict__ y, const ELEM_T* __restrict__ dy, ELEM_T* __restrict__ dz, float* dst,
        float* partials, unsigned int* counter, int rows, int cols, int rows_per_block) {
    typedef Pack<ELEM_T, VEC> P;
    extern __shared__ float4 shared[];   // float4: the last block's runs are 16-byte aligned
    const RowTile t = row_tile(rows, cols, rows_per_block);
    float s[VEC];
    #pragma unroll
    for (int k = 0; k < VEC; ++k) s[k] = 0.f;
    #pragma unroll 4
    for (long long r = t.first; r < t.stop; r += t.lanes) {
        const long long i = r * cols + t.col;
        const P a = load_pack<ELEM_T, VEC>(y, i), g = load_pack<ELEM_T, VEC>(dy, i);
        P out;
        #pragma unroll
        for (int k = 0; k < VEC; ++k) store_f(out.v, k, act_grad(load_f(a.v, k), load_f(g.v, k)));
        store_pack(dz, i, out);
        #pragma unroll
        for (int k = 0; k < VEC; ++k) s[k] += load_f(out.v, k);   // rounded as stored
    }
    finish_row_sums(t, cols, s, shared, dst, partials, counter);
}
"""
ROW_SUM_SOURCES = {kind: _ROW_SUM_SOURCE.replace("@BACKWARD@", backward)
                   for kind, (_, backward, _, _) in _ACTIVATIONS.items()}


def _check_kind(kind: str):
    checks.choice("Activation kind", kind, tuple(_ACTIVATIONS))


def activation_forward(backend, kind: str, x, out):
    """out = act(x), element-wise, on either backend."""
    if not backend.is_gpu:
        out[...] = _ACTIVATIONS[kind][2](widen(x)).astype(out.dtype)
        return
    width, grid, block, packs = packed_launch(x.size, x, out, widest=16 // x.itemsize)
    get_kernel(SOURCES[kind], "forward", ELEM_T=ctype(x.dtype), VEC=width)(grid, block, (x, out, packs))


def activation_backward(backend, kind: str, y, dy, dx):
    """dx = act'(x) dy from the forward output y = act(x), on either backend."""
    if not backend.is_gpu:
        dx[...] = _ACTIVATIONS[kind][3](widen(y), widen(dy)).astype(dx.dtype)
        return
    width, grid, block, packs = packed_launch(y.size, y, dy, dx, widest=16 // y.itemsize)
    get_kernel(SOURCES[kind], "backward", ELEM_T=ctype(y.dtype), VEC=width)(grid, block, (y, dy, dx, packs))


class BackwardColumnSum:
    """dz = act'(y) dy and grad_b[c] = sum over rows of dz[:, c], in one pass: a layer's fused activation and bias
    gradient; y, dy and dz are (..., cols) with cols = grad_b's length. Where `sums` (a training program's
    PartialSums) takes them, the chunks' partials are added by its launch after the backward pass."""

    def __init__(self, backend, allocator, kind: str, y, dy, dz, grad_b, sums=None):
        _check_kind(kind)
        cols = grad_b.shape[0]
        if not (y.shape == dy.shape == dz.shape) or y.shape[-1] != cols or grad_b.ndim != 1:
            raise ValueError(f"BackwardColumnSum of y {y.shape}, dy {dy.shape}, dz {dz.shape} into {grad_b.shape}")
        self.backend, self.kind, self.grad_b = backend, kind, grad_b
        self.y, self.dy, self.dz = (a.reshape(-1, cols) for a in (y, dy, dz))
        rows = self.y.shape[0]
        whole = plan_rows(backend, rows, cols, self.y, self.dy, self.dz)
        self.plan = whole or plan_chunks(backend, rows, cols, blocks_per_sm=_SUM_BLOCKS_PER_SM)
        if not backend.is_gpu:
            return
        self.partials, self.counters = self.plan.workspace(allocator, cols)
        defer = int(self.plan.defer(sums, self.partials, [(0, grad_b)]))
        if whole is not None:
            self._kernel = get_kernel(ROW_SUM_SOURCES[kind], "backward_row_sums", ELEM_T=ctype(y.dtype),
                                      VEC=whole.width, DEFER=defer)
        else:
            self._kernel = get_kernel(SUM_SOURCES[kind], "backward_column_sum", ELEM_T=ctype(y.dtype), DEFER=defer)
        self._args = (self.y, self.dy, self.dz, grad_b, self.partials, self.counters, np.int32(rows), np.int32(cols),
                      *self.plan.grid_args())

    def run(self):
        if not self.backend.is_gpu:
            activation_backward(self.backend, self.kind, self.y, self.dy, self.dz)
            self.grad_b[...] = widen(self.dz).sum(axis=0)
            return
        self.plan.launch(self._kernel, self._args)


class Activation(Layer):
    applied_by_input = False   # set by a program whose layer below applies it (a GEMM's ReLU epilogue)
    bias_of = None   # set by a program: the parameter below whose gradient is dx's column sum, summed here
    wiring = ("applied_by_input", "bias_of")

    def __init__(self, kind: str, name: str = ""):
        _check_kind(kind)
        self.kind, self.name = kind, name

    def build_forward(self, ctx: BuildContext, x):
        self.backend, self.x = ctx.backend, x
        # applied below: x already holds act(z), and backward needs only that output
        self.out = x if self.applied_by_input else ctx.allocator.zeros(x.shape, x.dtype, "activations")
        return self.out

    def build_backward(self, ctx: BuildContext, dy, needs_input_grad: bool):
        self.dy, self.dx, self._column_sum = dy, None, None
        if not needs_input_grad:
            if self.bias_of is not None:
                raise ValueError(f"{self.name}: the gradient of {self.bias_of!r} is dx's column sum, but this "
                                 "activation computes no dx")
            return None
        self.dx = ctx.allocator.zeros(self.x.shape, self.x.dtype, "activations")
        if self.bias_of is not None:
            self._column_sum = BackwardColumnSum(ctx.backend, ctx.allocator, self.kind, self.out, dy, self.dx,
                                                 ctx.params.grad_view(self.bias_of), sums=ctx.sums)
        return self.dx

    def forward(self):
        if not self.applied_by_input:
            activation_forward(self.backend, self.kind, self.x, self.out)

    def backward(self):
        if self._column_sum is not None:
            self._column_sum.run()
        elif self.dx is not None:
            activation_backward(self.backend, self.kind, self.out, self.dy, self.dx)


def Tanh(name: str = "") -> Activation:
    return Activation("tanh", name)


def ReLU(name: str = "") -> Activation:
    return Activation("relu", name)


def ReLU6(name: str = "") -> Activation:
    return Activation("relu6", name)
