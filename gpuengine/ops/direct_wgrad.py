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
written. The kernels are compiled for the layer's geometry (constant
divisions, unrolled taps).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..runtime.kernels import ctype, get_kernel, multiprocessor_count

_SOURCE = r"""
// The geometry is compiled in (IN_H, IN_W, CHANNELS, OUT_H, OUT_W, WIN_H, WIN_W, STRIDE_H, STRIDE_W,
// PAD_TOP, PAD_LEFT, FILTERS): the tap loops unroll and index arithmetic divides by constants.
#define TAPS (WIN_H * WIN_W * CHANNELS)
#define WIDTH (FILTERS * (TAPS + 1))
// With a max pool after the convolution (POOL_H > 0: POOL_H x POOL_W windows, stride the window, no padding),
// dy and y are the pool's output gradient and output, and argmax where each window's max was: a pixel's
// gradient is its window's where it won (and, with the ReLU, where that max is positive), so the pool's
// backward never writes the convolution's full-size gradient.
extern "C" __global__ void direct_wgrad_partials(const ELEM_T* x, const ELEM_T* y, const ELEM_T* dy,
                                                 const int* argmax, float* partials, int pixels,
                                                 int pixels_per_chunk) {
    extern __shared__ float sums[];   // [lane][filter][TAPS + 1]
    const int lanes = blockDim.x / FILTERS;   // the block is a whole number of lanes
    const int f = threadIdx.x % FILTERS, lane = threadIdx.x / FILTERS;
    float acc[TAPS + 1];
    #pragma unroll
    for (int t = 0; t <= TAPS; ++t) acc[t] = 0.f;
    const int first = blockIdx.x * pixels_per_chunk;
    const int last = min(pixels, first + pixels_per_chunk);
    for (int p = first + lane; p < last; p += lanes) {
        const int ow = p % OUT_W, oh = p / OUT_W % OUT_H, b = p / (OUT_W * OUT_H);
        float g = 0.f;
#if POOL_H > 0
        const int ph = oh / POOL_H, pw = ow / POOL_W;   // floor mode: the last rows may be in no window
        if (ph < POOLED_H && pw < POOLED_W) {
            const int w = ((b * POOLED_H + ph) * POOLED_W + pw) * FILTERS + f;
            if (argmax[w] == (oh % POOL_H) * POOL_W + ow % POOL_W && (!HAS_RELU || load_f(y, w) > 0.f))
                g = load_f(dy, w);
        }
#else
        const int o = p * FILTERS + f;
        g = load_f(dy, o);
        if (HAS_RELU && !(load_f(y, o) > 0.f)) g = 0.f;
#endif
        acc[TAPS] += g;
        #pragma unroll
        for (int i = 0; i < WIN_H; ++i) {
            const int row = oh * STRIDE_H - PAD_TOP + i;
            #pragma unroll
            for (int j = 0; j < WIN_W; ++j) {
                const int col = ow * STRIDE_W - PAD_LEFT + j;
                const bool inside = row >= 0 && row < IN_H && col >= 0 && col < IN_W;
                const int at = ((b * IN_H + row) * IN_W + col) * CHANNELS;
                #pragma unroll
                for (int c = 0; c < CHANNELS; ++c)
                    if (inside) acc[(i * WIN_W + j) * CHANNELS + c] += g * load_f(x, at + c);
            }
        }
    }
    #pragma unroll
    for (int t = 0; t <= TAPS; ++t) sums[lane * WIDTH + f * (TAPS + 1) + t] = acc[t];
    __syncthreads();
    for (int v = threadIdx.x; v < WIDTH; v += blockDim.x) {
        float s = 0.f;
        for (int l = 0; l < lanes; ++l) s += sums[l * WIDTH + v];
        partials[(long long)blockIdx.x * WIDTH + v] = s;
    }
}
// dw and db from the chunks' partials: each value (a filter's tap, or its bias) is one warp's, lane l adding
// chunks l, l + 32, ..., then the lanes meeting by shuffles in a fixed order (the same result every run). Why a
// warp: one thread adding every chunk in one chain was latency-bound, 16.6 us of an 86 us H100 CNN step.
extern "C" __global__ void direct_wgrad_sum(const float* partials, int chunks, float* dw, float* db) {
    const int v = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
    if (v >= WIDTH) return;   // a whole warp leaves: the shuffles below have every lane
    float s = 0.f;
    #pragma unroll 4
    for (int c = lane; c < chunks; c += 32) s += partials[(long long)c * WIDTH + v];
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane != 0) return;
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


def pool_fits(window) -> bool:
    """Whether a max pool's window lets the kernel read the pool's gradient itself: each pixel in at most one
    window (stride the window) and no padding."""
    return tuple(window.stride) == tuple(window.kernel) and not any(window.pads)


def kernel_defines(window, input_shape, filters: int, dtype, relu: bool, has_bias: bool, pool=None) -> dict:
    """The kernels' compile-time defines for a convolution's window over (H, W, C) samples of `dtype`, and the
    window of the max pool after it whose gradient the kernel reads (`pool`, pool_fits), if any."""
    h, w, channels = input_shape
    (kh, kw), (out_h, out_w) = window.kernel, window.output_hw
    (pool_h, pool_w), (pooled_h, pooled_w) = (pool.kernel, pool.output_hw) if pool is not None else ((0, 0), (0, 0))
    return dict(ELEM_T=ctype(dtype), IN_H=h, IN_W=w, CHANNELS=channels, OUT_H=out_h, OUT_W=out_w, WIN_H=kh,
                WIN_W=kw, STRIDE_H=window.stride[0], STRIDE_W=window.stride[1], PAD_TOP=window.pads[0],
                PAD_LEFT=window.pads[2], FILTERS=filters, HAS_RELU=int(relu), HAS_BIAS=int(has_bias),
                POOL_H=pool_h, POOL_W=pool_w, POOLED_H=pooled_h, POOLED_W=pooled_w)


@dataclass(frozen=True)
class PooledGradient:
    """A max pool's output gradient handed to the convolution below it in place of the pool's input gradient
    (the pool's backward then writes nothing): what direct_wgrad_partials reads with POOL_H > 0."""

    dy: object        # (N, pooled H, pooled W, filters)
    out: object       # the pool's output, same shape
    argmax: object    # int32, same shape: the window offset of each max
    window: object    # the pool's resolved window (pool_fits)


class DirectWeightGrad:
    """dw (K, kh, kw, C) and db (K,) of y = [relu](conv(x, w) + b), from dy (or a PooledGradient), in two kernel
    launches."""

    def __init__(self, ctx, window, x, y, dy, grad_w, grad_b, relu: bool):
        n, _, _, channels = x.shape
        filters = y.shape[3]   # y: the convolution's output
        pool = dy if isinstance(dy, PooledGradient) else None
        if pool is not None:
            y, dy, self.argmax = pool.out, pool.dy, pool.argmax
        else:
            self.argmax = dy   # unread without a pool
        (kh, kw), (out_h, out_w) = window.kernel, window.output_hw
        self.x, self.y, self.dy, self.grad_w = x, y, dy, grad_w
        self.grad_b = grad_b if grad_b is not None else grad_w   # unread without a bias
        self.filters = filters
        self.threads = filters * (_THREADS // filters)
        self.width = filters * (kh * kw * channels + 1)
        self.pixels = n * out_h * out_w
        target_chunks = _BLOCKS_PER_SM * multiprocessor_count()
        self.pixels_per_chunk = max(_THREADS // filters, -(-self.pixels // target_chunks))
        self.chunks = -(-self.pixels // self.pixels_per_chunk)
        self.partials = ctx.allocator.zeros((self.chunks, self.width), np.float32, "workspace")
        defines = kernel_defines(window, x.shape[1:], filters, x.dtype, relu, grad_b is not None,
                                 pool.window if pool is not None else None)
        self._partials = get_kernel(_SOURCE, "direct_wgrad_partials", **defines)
        self._sum = get_kernel(_SOURCE, "direct_wgrad_sum", **defines)

    def run(self):
        self._partials((self.chunks,), (self.threads,),
                       (self.x, self.y, self.dy, self.argmax, self.partials, np.int32(self.pixels),
                        np.int32(self.pixels_per_chunk)),
                       shared_mem=4 * (self.threads // self.filters) * self.width)
        self._sum((-(-self.width * 32 // _THREADS),), (_THREADS,),   # a warp per value
                  (self.partials, np.int32(self.chunks), self.grad_w, self.grad_b))
