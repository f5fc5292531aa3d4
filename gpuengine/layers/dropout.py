"""Dropout (Srivastava et al. 2014) with a counter-based RNG whose state lives on the device.

Training: y = x * keep / (1 - p), keep drawn per element with probability
1 - p (inverted dropout, as torch's nn.Dropout); inference, and p = 0: the
identity (the output is the input's buffer, no kernel).

The mask is never stored. Each element's keep bit comes from Philox-4x32-10
(Salmon et al. 2011, "Parallel random numbers: as easy as 1, 2, 3"; Random123)
of the counter (element index, draw number) under the key (seed, a hash of
the layer's name): the first output word u keeps the element when
u >= round(p * 2^32). The draw number is an int64 on the device: forward and
backward read it, and the last kernel of backward advances it, so a captured
CUDA graph replays with a fresh mask each step and the host never touches
it. The NumPy backend computes the same Philox words, so both backends draw
the same masks bit for bit.
"""
from __future__ import annotations

import zlib

import numpy as np

from .. import checks
from ..runtime.backend import widen
from ..runtime.kernels import ctype, get_kernel, launch_shape
from .base import BuildContext, Layer

# Philox-4x32 multipliers and Weyl key increments (Random123).
_M0, _M1, _W0, _W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85
ROUNDS = 10

_SOURCE = r"""
__device__ __forceinline__ unsigned int philox_word(unsigned int c0, unsigned int c1, unsigned int c2,
                                                    unsigned int c3, unsigned int k0, unsigned int k1) {
    #pragma unroll
    for (int r = 0; r < 10; ++r) {
        if (r) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
        const unsigned int hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        const unsigned int hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        c0 = hi1 ^ c1 ^ k0; c1 = lo1; c2 = hi0 ^ c3 ^ k1; c3 = lo0;
    }
    return c0;
}
// out = in * keep * scale; the same kernel masks x forward and dy backward.
extern "C" __global__ void dropout_mask(const ELEM_T* in, ELEM_T* out, const long long* draw, unsigned int k0,
                                        unsigned int k1, unsigned int threshold, float scale, long long n) {
    const unsigned long long d = (unsigned long long)draw[0];
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const unsigned int u = philox_word((unsigned int)i, (unsigned int)(i >> 32), (unsigned int)d,
                                           (unsigned int)(d >> 32), k0, k1);
        store_f(out, i, u >= threshold ? load_f(in, i) * scale : 0.f);
    }
}
extern "C" __global__ void dropout_advance(long long* draw) { draw[0] += 1; }
"""


def philox_words(counters: tuple, key: tuple) -> np.ndarray:
    """The first Philox-4x32-10 output word for each counter (c0, c1, c2, c3: uint32 arrays or scalars)."""
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) & 0xFFFFFFFF for c in counters)
    c0, c1, c2, c3 = np.broadcast_arrays(c0, c1, c2, c3)
    k0, k1 = (int(k) & 0xFFFFFFFF for k in key)
    for r in range(ROUNDS):
        if r:
            k0, k1 = (k0 + _W0) & 0xFFFFFFFF, (k1 + _W1) & 0xFFFFFFFF
        p0, p1 = c0 * _M0, c2 * _M1   # exact in uint64: both factors are below 2^32
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & 0xFFFFFFFF, (p0 >> 32) ^ c3 ^ k1, p0 & 0xFFFFFFFF
    return c0.astype(np.uint32)


def keep_threshold(p: float) -> int:
    """u >= this keeps an element: P(keep) = 1 - p, to 2^-32."""
    return min(int(round(p * 2.0 ** 32)), 2 ** 32 - 1)


class Dropout(Layer):
    """Inverted dropout with rate p in [0, 1); `seed` and the layer's name pick its random stream."""

    def __init__(self, p: float = 0.5, seed: int = 0, name: str = ""):
        p = checks.number("Dropout p", p, at_least=0.0, below=1.0)
        self.p, self.seed, self.name = p, checks.seed("Dropout seed", seed), name

    @property
    def key(self) -> tuple[int, int]:
        return self.seed & 0xFFFFFFFF, zlib.crc32(self.name.encode())

    def build_forward(self, ctx: BuildContext, x):
        self.backend, self.x = ctx.backend, x
        self.active = ctx.training and self.p > 0
        if not self.active:
            self.out = x
            return x
        self.out = ctx.allocator.zeros(x.shape, x.dtype, "activations")
        self.draw = ctx.allocator.zeros((1,), np.int64, "workspace")   # which mask the step uses
        self.scale = np.float32(1.0 / (1.0 - self.p))
        self.threshold = keep_threshold(self.p)
        if ctx.backend.is_gpu:
            self._mask = get_kernel(_SOURCE, "dropout_mask", ELEM_T=ctype(x.dtype))
            self._advance = get_kernel(_SOURCE, "dropout_advance", ELEM_T=ctype(x.dtype))   # one module, one compile
        return self.out

    def build_backward(self, ctx: BuildContext, dy, needs_input_grad: bool):
        self.dy = dy
        if not needs_input_grad:
            self.dx = None
        elif not self.active:
            self.dx = dy
        else:
            self.dx = ctx.allocator.zeros(self.x.shape, self.x.dtype, "activations")
        return self.dx

    def _apply(self, source, target):
        if self.backend.is_gpu:
            grid, block = launch_shape(source.size)
            self._mask(grid, block, (source, target, self.draw, np.uint32(self.key[0]), np.uint32(self.key[1]),
                                     np.uint32(self.threshold), self.scale, np.int64(source.size)))
            return
        target[...] = np.where(self.keep_mask(), widen(source) * self.scale, 0.0).reshape(target.shape)

    def keep_mask(self) -> np.ndarray:
        """NumPy backend: this step's keep bits, flat (the GPU kernel draws the same)."""
        index = np.arange(self.x.size, dtype=np.uint64)
        draw = int(self.draw[0]) & 0xFFFFFFFFFFFFFFFF
        words = philox_words((index, index >> 32, draw & 0xFFFFFFFF, draw >> 32), self.key)
        return (words >= self.threshold).reshape(self.x.shape)

    def forward(self):
        if self.active:
            self._apply(self.x, self.out)

    def backward(self):
        """The input gradient under this step's mask, then the next step's draw."""
        if not self.active:
            return
        if self.dx is not None:
            self._apply(self.dy, self.dx)
        if self.backend.is_gpu:
            self._advance((1,), (1,), (self.draw,))
        else:
            self.draw[0] += 1
