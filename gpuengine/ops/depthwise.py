"""Depthwise convolution by direct CUDA kernels, beside cuDNN's grouped graphs: whichever measures faster.

A depthwise convolution (groups = channels = filters; MobileNetV2's 3x3
layers, Sandler et al. 2018) is kh*kw multiply-adds per output value: memory
bound, and a shape cuDNN serves through its grouped-convolution engines, not
always fast; so a depthwise Conv2D
builds both and `autotune.FasterOf` times them on the layer's live buffers at
the first eager run, keeping the faster for good (as cuDNN graphs keep their
fastest plan; a preset in autotune.PLAN_CHOICES pins the choice between runs).
The kernels, NHWC with the geometry compiled in (divisions by constants,
unrolled taps), all deterministic:
  forward  one thread per output value, channels fastest (coalesced), + bias, ReLU;
  dgrad    one thread per input value gathering the outputs whose windows hold it (no atomics);
  wgrad    per chunk of pixels, threads over channels keep their kh*kw tap sums in registers, lanes meet
           in shared memory, and a second kernel adds the chunks in a fixed order straight into the fp32
           master gradient (no bf16 scratch to widen).
"""
from __future__ import annotations

import numpy as np

from ..runtime.kernels import ctype, get_kernel, launch_shape, multiprocessor_count

_SOURCE = r"""
// Geometry compiled in: IN_H, IN_W, CHANNELS, OUT_H, OUT_W, WIN_H, WIN_W, STRIDE_H, STRIDE_W, PAD_TOP, PAD_LEFT;
// HAS_BIAS, HAS_RELU; LANES (pixel lanes of a wgrad block). Weights are (CHANNELS, WIN_H, WIN_W).
#define TAPS (WIN_H * WIN_W)
extern "C" __global__ void depthwise_forward(const ELEM_T* x, const ELEM_T* w, const ELEM_T* bias, ELEM_T* y,
                                             int total) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        const int ch = i % CHANNELS, pixel = i / CHANNELS;
        const int ow = pixel % OUT_W, oh = pixel / OUT_W % OUT_H, b = pixel / (OUT_W * OUT_H);
        float acc = HAS_BIAS ? load_f(bias, ch) : 0.f;
        #pragma unroll
        for (int a = 0; a < WIN_H; ++a) {
            const int row = oh * STRIDE_H - PAD_TOP + a;
            if (row < 0 || row >= IN_H) continue;
            #pragma unroll
            for (int d = 0; d < WIN_W; ++d) {
                const int col = ow * STRIDE_W - PAD_LEFT + d;
                if (col < 0 || col >= IN_W) continue;
                acc += load_f(x, ((b * IN_H + row) * IN_W + col) * CHANNELS + ch) * load_f(w, ch * TAPS + a * WIN_W + d);
            }
        }
        store_f(y, i, HAS_RELU ? fmaxf(acc, 0.f) : acc);
    }
}
extern "C" __global__ void depthwise_dgrad(const ELEM_T* dz, const ELEM_T* w, ELEM_T* dx, int total) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        const int ch = i % CHANNELS, pixel = i / CHANNELS;
        const int col = pixel % IN_W, row = pixel / IN_W % IN_H, b = pixel / (IN_W * IN_H);
        float g = 0.f;
        #pragma unroll
        for (int a = 0; a < WIN_H; ++a) {
            const int r = row + PAD_TOP - a;   // = oh * STRIDE_H for the output row that reads `row` through tap a
            if (r < 0 || r % STRIDE_H != 0 || r / STRIDE_H >= OUT_H) continue;
            #pragma unroll
            for (int d = 0; d < WIN_W; ++d) {
                const int q = col + PAD_LEFT - d;
                if (q < 0 || q % STRIDE_W != 0 || q / STRIDE_W >= OUT_W) continue;
                g += load_f(dz, ((b * OUT_H + r / STRIDE_H) * OUT_W + q / STRIDE_W) * CHANNELS + ch)
                     * load_f(w, ch * TAPS + a * WIN_W + d);
            }
        }
        store_f(dx, i, g);
    }
}
// Block (32 channels, LANES pixel lanes) of grid (pixel chunks, channel tiles): partials[chunk][channel][tap].
extern "C" __global__ void depthwise_wgrad_partials(const ELEM_T* x, const ELEM_T* dz, float* partials, int pixels,
                                                    int pixels_per_chunk) {
    __shared__ float sums[LANES][32][TAPS];
    const int ch = blockIdx.y * 32 + threadIdx.x, lane = threadIdx.y;
    float acc[TAPS];
    #pragma unroll
    for (int t = 0; t < TAPS; ++t) acc[t] = 0.f;
    const int first = blockIdx.x * pixels_per_chunk, last = min(pixels, first + pixels_per_chunk);
    if (ch < CHANNELS) {
        for (int p = first + lane; p < last; p += LANES) {
            const float g = load_f(dz, p * CHANNELS + ch);
            const int ow = p % OUT_W, oh = p / OUT_W % OUT_H, b = p / (OUT_W * OUT_H);
            #pragma unroll
            for (int a = 0; a < WIN_H; ++a) {
                const int row = oh * STRIDE_H - PAD_TOP + a;
                if (row < 0 || row >= IN_H) continue;
                #pragma unroll
                for (int d = 0; d < WIN_W; ++d) {
                    const int col = ow * STRIDE_W - PAD_LEFT + d;
                    if (col >= 0 && col < IN_W) acc[a * WIN_W + d] += g * load_f(x, ((b * IN_H + row) * IN_W + col) * CHANNELS + ch);
                }
            }
        }
    }
    #pragma unroll
    for (int t = 0; t < TAPS; ++t) sums[lane][threadIdx.x][t] = acc[t];
    __syncthreads();
    if (ch >= CHANNELS) return;
    for (int t = lane; t < TAPS; t += LANES) {
        float s = 0.f;
        for (int l = 0; l < LANES; ++l) s += sums[l][threadIdx.x][t];
        partials[((long long)blockIdx.x * CHANNELS + ch) * TAPS + t] = s;
    }
}
extern "C" __global__ void depthwise_wgrad_sum(const float* partials, int chunks, float* dw) {
    const int v = blockIdx.x * blockDim.x + threadIdx.x;   // channel * TAPS + tap: the weights' own layout
    if (v >= CHANNELS * TAPS) return;
    float s = 0.f;
    for (int c = 0; c < chunks; ++c) s += partials[(long long)c * CHANNELS * TAPS + v];
    dw[v] = s;
}
"""
LANES = 8                   # pixel lanes of a weight-gradient block (32 channels each)
_SHARED_BYTES = 48 * 1024   # the block's static tap sums: LANES x 32 x taps floats (up to 5x5 windows)
_CHUNKS_PER_SM = 4


def fits(groups: int, in_channels: int, filters: int, window) -> bool:
    """A depthwise convolution whose wgrad block's tap sums fit in static shared memory."""
    taps = window.kernel[0] * window.kernel[1]
    return groups > 1 and groups == in_channels == filters and LANES * 32 * taps * 4 <= _SHARED_BYTES


def kernel_defines(window, input_shape, dtype, has_bias: bool, relu: bool) -> dict:
    """The kernels' compile-time defines for (H, W, C) samples of `dtype` through `window`."""
    h, w, c = input_shape
    (out_h, out_w), (kh, kw), (sh, sw) = window.output_hw, window.kernel, window.stride
    top, _, left, _ = window.pads
    return dict(ELEM_T=ctype(dtype), IN_H=h, IN_W=w, CHANNELS=c, OUT_H=out_h, OUT_W=out_w, WIN_H=kh, WIN_W=kw,
                STRIDE_H=sh, STRIDE_W=sw, PAD_TOP=top, PAD_LEFT=left, HAS_BIAS=int(has_bias), HAS_RELU=int(relu),
                LANES=LANES)


class DepthwiseKernels:
    """The three ops of one depthwise layer on fixed buffers: forward(), dgrad(), wgrad(); launches only."""

    def __init__(self, allocator, window, x, weight, out, bias=None, relu: bool = False):
        if x.size >= 2 ** 31 or out.size >= 2 ** 31:
            raise ValueError(f"depthwise convolution of {x.shape} -> {out.shape} is too large for 32-bit indices")
        self.x, self.weight, self.out, self.bias = x, weight, out, bias
        defines = kernel_defines(window, x.shape[1:], x.dtype, bias is not None, relu)
        self._forward = get_kernel(_SOURCE, "depthwise_forward", **defines)
        self._dgrad = get_kernel(_SOURCE, "depthwise_dgrad", **defines)
        self._partials = get_kernel(_SOURCE, "depthwise_wgrad_partials", **defines)
        self._sum = get_kernel(_SOURCE, "depthwise_wgrad_sum", **defines)
        self.channels, self.taps = x.shape[3], window.kernel[0] * window.kernel[1]
        self.pixels = out.shape[0] * out.shape[1] * out.shape[2]
        self.tiles = -(-self.channels // 32)
        wanted = max(1, _CHUNKS_PER_SM * multiprocessor_count() // self.tiles)
        self.chunks = min(wanted, -(-self.pixels // LANES))
        self.pixels_per_chunk = -(-self.pixels // self.chunks)
        self.partials = allocator.zeros((self.chunks, self.channels, self.taps), np.float32, "workspace")

    def forward(self):
        grid, block = launch_shape(self.out.size)
        bias = self.bias if self.bias is not None else self.weight   # never read without HAS_BIAS
        self._forward(grid, block, (self.x, self.weight, bias, self.out, np.int32(self.out.size)))

    def dgrad(self, dz, dx):
        grid, block = launch_shape(dx.size)
        self._dgrad(grid, block, (dz, self.weight, dx, np.int32(dx.size)))

    def wgrad(self, dz, grad_w):
        """grad_w (float32, the master gradient) = the filter gradient given dz at the convolution's output."""
        self._partials((self.chunks, self.tiles), (32, LANES),
                       (self.x, dz, self.partials, np.int32(self.pixels), np.int32(self.pixels_per_chunk)))
        n = self.channels * self.taps
        self._sum((-(-n // 256),), (256,), (self.partials, np.int32(self.chunks), grad_w))
