"""Weight and bias gradients of a first-layer convolution with few taps, fused with its ReLU, in one pass.

A network's first convolution needs no input gradient, and on images of one to
three channels its filters have few taps (kh kw C = 9 for the MNIST CNN of seed
note 001). There cuDNN's weight-gradient engines reduce 100,000s of pixels into
a handful of values slowly (0.20 ms at batch 1024 on an H200), after a ReLU
backward pass and a bias column sum that each re-read the gradient. This
kernel reads dy and the ReLU output once and the input image from cache:
threads are (pixel lane, filter) pairs, each keeps its filter's kh kw C tap sums
and bias sum in registers over a chunk of pixels, lanes meet in shared memory,
and a second kernel adds the chunks in a fixed order into the fp32 master
gradients (no atomics: the same result every run). The dz buffer is never
written. The kernel is specialised at compile time on the window and channels.
"""
from __future__ import annotations

import numpy as np

from ..kernels import ctype, get_kernel, multiprocessor_count

_SOURCE = r"""
#define TAPS (KH * KW * CH)
extern "C" __global__ void direct_wgrad_partials(const ELEM_T* x, const ELEM_T* y, const ELEM_T* dy, float* partials,
                                                 int n, int h, int w, int out_h, int out_w, int filters, int sh, int sw,
                                                 int top, int left, int pixels_per_chunk) {
    extern __shared__ float sums[];   // [lane][filter][TAPS + 1]
    const int lanes = blockDim.x / filters;   // the block is a whole number of lanes
    const int f = threadIdx.x % filters, lane = threadIdx.x / filters;
    const int width = filters * (TAPS + 1);
    float acc[TAPS + 1];
    #pragma unroll
    for (int t = 0; t <= TAPS; ++t) acc[t] = 0.f;
    const int first = blockIdx.x * pixels_per_chunk;
    const int last = min(n * out_h * out_w, first + pixels_per_chunk);
    for (int p = first + lane; p < last; p += lanes) {
        const int o = p * filters + f;
        float g = load_f(dy, o);
        if (HAS_RELU && !(load_f(y, o) > 0.f)) g = 0.f;
        acc[TAPS] += g;
        const int ow = p % out_w, rest = p / out_w, oh = rest % out_h, b = rest / out_h;
        #pragma unroll
        for (int i = 0; i < KH; ++i) {
            const int row = oh * sh - top + i;
            #pragma unroll
            for (int j = 0; j < KW; ++j) {
                const int col = ow * sw - left + j;
                const bool inside = row >= 0 && row < h && col >= 0 && col < w;
                #pragma unroll
                for (int c = 0; c < CH; ++c)
                    if (inside) acc[(i * KW + j) * CH + c] += g * load_f(x, ((b * h + row) * w + col) * CH + c);
            }
        }
    }
    #pragma unroll
    for (int t = 0; t <= TAPS; ++t) sums[lane * width + f * (TAPS + 1) + t] = acc[t];
    __syncthreads();
    for (int v = threadIdx.x; v < width; v += blockDim.x) {
        float s = 0.f;
        for (int l = 0; l < lanes; ++l) s += sums[l * width + v];
        partials[(long long)blockIdx.x * width + v] = s;
    }
}
extern "C" __global__ void direct_wgrad_sum(const float* partials, int chunks, int filters, float* dw, float* db) {
    const int width = filters * (TAPS + 1);
    const int v = blockIdx.x * blockDim.x + threadIdx.x;
    if (v >= width) return;
    float s = 0.f;
    #pragma unroll 8
    for (int c = 0; c < chunks; ++c) s += partials[(long long)c * width + v];
    const int f = v / (TAPS + 1), t = v % (TAPS + 1);
    if (t < TAPS) dw[f * TAPS + t] = s;   // KRSC: (filter, kh, kw, c) is the tap order above
    else if (HAS_BIAS) db[f] = s;
}
"""
_THREADS = 256
MAX_TAPS = 32       # tap sums live in registers, and the block's shared sums stay under 48 KB
_BLOCKS_PER_SM = 4


def fits(window, channels: int, filters: int) -> bool:
    """Whether a convolution's weight gradient can take this path (its input gradient is not needed)."""
    return window.kernel[0] * window.kernel[1] * channels <= MAX_TAPS and filters <= _THREADS


class DirectWeightGrad:
    """dw (K, kh, kw, C) and db (K,) of y = [relu](conv(x, w) + b), from dy, in two kernel launches."""

    def __init__(self, ctx, window, x, y, dy, grad_w, grad_b, relu: bool):
        n, h, w, channels = x.shape
        filters = dy.shape[3]
        kh, kw = window.kernel
        self.args = tuple(np.int32(v) for v in (n, h, w) + window.output_hw + (filters,) + window.stride
                          + (window.pads[0], window.pads[2]))
        self.x, self.y, self.dy, self.grad_w = x, y, dy, grad_w
        self.grad_b = grad_b if grad_b is not None else grad_w   # unread without a bias
        self.filters = filters
        self.threads = filters * (_THREADS // filters)
        self.width = filters * (kh * kw * channels + 1)
        pixels = n * window.output_hw[0] * window.output_hw[1]
        target_chunks = _BLOCKS_PER_SM * multiprocessor_count()
        self.pixels_per_chunk = max(_THREADS // filters, -(-pixels // target_chunks))
        self.chunks = -(-pixels // self.pixels_per_chunk)
        self.partials = ctx.allocator.zeros((self.chunks, self.width), np.float32, "workspace")
        defines = dict(ELEM_T=ctype(x.dtype), KH=kh, KW=kw, CH=channels, HAS_RELU=int(relu),
                       HAS_BIAS=int(grad_b is not None))
        self._partials = get_kernel(_SOURCE, "direct_wgrad_partials", **defines)
        self._sum = get_kernel(_SOURCE, "direct_wgrad_sum", **defines)

    def run(self):
        self._partials((self.chunks,), (self.threads,),
                       (self.x, self.y, self.dy, self.partials) + self.args + (np.int32(self.pixels_per_chunk),),
                       shared_mem=4 * (self.threads // self.filters) * self.width)
        self._sum((-(-self.width // 128),), (128,),
                  (self.partials, np.int32(self.chunks), np.int32(self.filters), self.grad_w, self.grad_b))
