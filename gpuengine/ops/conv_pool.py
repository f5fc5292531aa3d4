"""A network's first convolution (few taps, + bias, + ReLU) and the max pool after it in one forward kernel.

Seed note 001's CNN convolves 28x28x1 images with 16 3x3 filters, then pools
2x2. cuDNN's engine for one input channel took 13.6 us of the H100's 86 us
step at batch 128 writing the 6.4 MB convolution output (fp32), and the
pool 3.0 us reading it back. Here a thread takes one filter of a pooled
pixel: it computes the POOL_H x POOL_W convolution outputs of its window from
the image (cached: neighbouring threads are one pixel's filters, so they read
the same values), adds the bias, applies the ReLU, rounds each to the compute dtype as
the stored output would be, and keeps the first maximum and its window offset,
as maxpool_forward does. Only the pooled output and the argmax are written;
the weight gradient (direct_wgrad.py with a pool) reads those, so the
full-size output is never needed. A thread's filter is fixed over its
grid-stride loop (the stride is a multiple of FILTERS), so its taps load once.
Windows must not overlap and carry no padding (direct_wgrad.pool_fits).
The convolution layer still builds its own output buffer and cuDNN graph,
unused in a training program: the fusion is found after the layers are built.
"""
from __future__ import annotations

import numpy as np

from ..runtime.kernels import get_kernel, multiprocessor_count
from .direct_wgrad import kernel_defines, pool_fits

_SOURCE = r"""
// The geometry is compiled in: the convolution's (IN_H, IN_W, CHANNELS, WIN_H, WIN_W, STRIDE_H, STRIDE_W,
// PAD_TOP, PAD_LEFT, FILTERS) and the pool's (POOL_H, POOL_W windows, POOLED_H x POOLED_W of them).
#define TAPS (WIN_H * WIN_W * CHANNELS)
extern "C" __global__ void conv_pool_forward(const ELEM_T* x, const ELEM_T* weight, const ELEM_T* bias,
                                             ELEM_T* pooled, int* argmax, int outputs) {
    const int stride = gridDim.x * blockDim.x;   // a multiple of FILTERS: f stays the thread's
    const int first = blockIdx.x * blockDim.x + threadIdx.x, f = first % FILTERS;
    float w[TAPS];
    #pragma unroll
    for (int t = 0; t < TAPS; ++t) w[t] = load_f(weight, f * TAPS + t);   // KRSC
    const float b = HAS_BIAS ? load_f(bias, f) : 0.f;
    for (int o = first; o < outputs; o += stride) {
        const int q = o / FILTERS, pw = q % POOLED_W, ph = q / POOLED_W % POOLED_H, n = q / (POOLED_W * POOLED_H);
        float best = 0.f;
        int arg = -1;
        #pragma unroll
        for (int a = 0; a < POOL_H; ++a) {
            #pragma unroll
            for (int d = 0; d < POOL_W; ++d) {
                const int oh = ph * POOL_H + a, ow = pw * POOL_W + d;
                float v = b;
                #pragma unroll
                for (int i = 0; i < WIN_H; ++i) {
                    const int row = oh * STRIDE_H - PAD_TOP + i;
                    #pragma unroll
                    for (int j = 0; j < WIN_W; ++j) {
                        const int col = ow * STRIDE_W - PAD_LEFT + j;
                        if (row < 0 || row >= IN_H || col < 0 || col >= IN_W) continue;
                        const int at = ((n * IN_H + row) * IN_W + col) * CHANNELS;
                        #pragma unroll
                        for (int c = 0; c < CHANNELS; ++c) v += load_f(x, at + c) * w[(i * WIN_W + j) * CHANNELS + c];
                    }
                }
                if (HAS_RELU) v = fmaxf(v, 0.f);
                ELEM_T stored[1];
                store_f(stored, 0, v);   // the value a stored output would hold
                v = load_f(stored, 0);
                if (arg < 0 || v > best) { best = v; arg = a * POOL_W + d; }
            }
        }
        store_f(pooled, o, best);
        argmax[o] = arg;
    }
}
"""
_THREADS = 256
_BLOCKS_PER_SM = 4


class ConvPoolForward:
    """pooled, argmax = maxpool([relu](conv(x, w) + b)) in one launch, for a built Conv2D and the MaxPool2D over it
    (the pool's own `out` and `argmax` buffers are written); `run()`."""

    def __init__(self, conv, pool):
        if not pool_fits(pool.window):
            raise ValueError(f"{pool.name}: ConvPoolForward needs windows that neither overlap nor pad, "
                             f"got {pool.window}")
        filters, self.outputs = conv.filters, pool.out.size
        self._args = (conv.x, conv.weight, conv.weight if conv.bias is None else conv.bias, pool.out, pool.argmax,
                      np.int32(self.outputs))
        self.threads = filters * (_THREADS // filters)
        self.blocks = max(1, min(_BLOCKS_PER_SM * multiprocessor_count(), -(-self.outputs // self.threads)))
        # the direct weight gradient's defines with the pool: the same geometry, compiled in
        defines = kernel_defines(conv.window, conv.x.shape[1:], filters, conv.x.dtype, conv.activation == "relu",
                                 conv.bias is not None, pool.window)
        self._kernel = get_kernel(_SOURCE, "conv_pool_forward", **defines)

    def run(self):
        self._kernel((self.blocks,), (self.threads,), self._args)
