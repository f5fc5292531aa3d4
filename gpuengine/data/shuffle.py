"""Per-epoch shuffles computed, not stored: a keyed Feistel permutation.

Row `i` of epoch `e` is `permute(i)`: a 4-round Feistel network on the smallest
even number of bits covering n, with cycle walking to stay below n (Black &
Rogaway 2002, "Ciphers with arbitrary finite domains"). Each index is computed
independently, so the device gather kernel shuffles inside a captured graph
with no host work and no sort, and the host-streamed loader computes the very
same order with NumPy: resident and streamed data see identical batches.
"""
from __future__ import annotations

import numpy as np

# CUDA: included in the gather kernels' sources.
DEVICE_SOURCE = r"""
__device__ __forceinline__ unsigned int mix32(unsigned int x) {
    x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16; return x;
}
__device__ __forceinline__ unsigned int epoch_key(unsigned int seed, unsigned int epoch) {
    return mix32(seed * 0x9e3779b1u ^ mix32(epoch + 0x632be5abu));
}
__device__ unsigned int feistel_permute(unsigned int i, unsigned int n, unsigned int half_bits, unsigned int key) {
    const unsigned int mask = (1u << half_bits) - 1u;
    unsigned int x = i;
    do {
        unsigned int l = x >> half_bits, r = x & mask;
        #pragma unroll
        for (unsigned int k = 0; k < 4; ++k) {
            unsigned int f = mix32(r ^ (key + k * 0x9e3779b9u)) & mask;
            unsigned int nl = r; r = l ^ f; l = nl;
        }
        x = (l << half_bits) | r;
    } while (x >= n);
    return x;
}
"""

_U32 = np.uint32


def _mix32(x: np.ndarray) -> np.ndarray:
    x = x.astype(_U32)
    x ^= x >> _U32(16)
    x *= _U32(0x7FEB352D)
    x ^= x >> _U32(15)
    x *= _U32(0x846CA68B)
    x ^= x >> _U32(16)
    return x


def half_bits(n: int) -> int:
    if n < 1 or n >= 1 << 31:
        raise ValueError(f"shuffle domain must be 1..2^31-1, got {n}")
    bits = max(2, int(n - 1).bit_length())
    return (bits + 1) // 2


def epoch_key(seed: int, epoch: int) -> int:
    with np.errstate(over="ignore"):
        seed_mix = np.array([seed & 0xFFFFFFFF], _U32) * _U32(0x9E3779B1)
        inner = _mix32(np.array([(epoch + 0x632BE5AB) & 0xFFFFFFFF], _U32))
        return int(_mix32(seed_mix ^ inner)[0])


def permute(indices: np.ndarray, n: int, key: int) -> np.ndarray:
    """The epoch permutation applied to `indices` (each < n)."""
    half = half_bits(n)
    mask = _U32((1 << half) - 1)
    x = np.asarray(indices, dtype=_U32).copy()
    pending = np.ones(x.shape, bool)
    with np.errstate(over="ignore"):
        while pending.any():
            xs = x[pending]
            left, right = xs >> _U32(half), xs & mask
            for k in range(4):
                f = _mix32(right ^ _U32((key + k * 0x9E3779B9) & 0xFFFFFFFF)) & mask
                left, right = right, left ^ f
            xs = (left << _U32(half)) | right
            x[pending] = xs
            pending[pending] = xs >= n
    return x.astype(np.int64)


def epoch_order(n: int, seed: int, epoch: int) -> np.ndarray:
    """The full shuffled order of epoch `epoch`."""
    return permute(np.arange(n), n, epoch_key(seed, epoch))


def batch_rows(n: int, seed: int, step: int, batch: int, steps_per_epoch: int, rank: int = 0,
               world: int = 1, lo: int = 0, hi: int | None = None) -> np.ndarray:
    """Dataset rows of global training step `step`: rank `rank`'s slice of `batch` rows of the global batch
    of `batch * world` rows (data parallel: the same permutation on every rank, each takes its own part).
    `lo`, `hi`: only batch positions lo..hi-1 (a loader worker's share of the batch)."""
    hi = batch if hi is None else hi
    if not 0 <= lo <= hi <= batch:
        raise ValueError(f"batch positions {lo}..{hi} are not within a batch of {batch}")
    epoch, position = divmod(step, steps_per_epoch)
    first = position * batch * world + rank * batch
    return permute(np.arange(first + lo, first + hi), n, epoch_key(seed, epoch))
