"""The engine's own batch-norm kernels (training, NHWC), in place of cuDNN's graphs: the `batchnorm=engine` toggle.

Forward, one launch (`bn_forward`): each block sums x - x[0, c] and its square
over its rows of its column tile (reductions.py's column tiles and one-launch
ending: partial sums per row chunk, the block drawing the tile's last ticket
adds them in a fixed order, so the result is the same bits every run). That
block writes the batch mean and inverse standard deviation and moves the
running statistics; the tile's other blocks wait for it (`tile_barrier`),
then every block computes y = act((x - mean) gamma / std + beta [+ residual])
over its own rows, mostly still in L2, and, where the activation's gradient is
needed later, its bit mask (8 channels a byte, as cuDNN's fused backward reads
it). Where |mean| is large against the std, shifting by one sample of the
channel keeps the variance's digits, and the centred form keeps y's.

Backward, one launch (`bn_backward`): dz = dy where the activation passed the
gradient (the mask, or y without one; written where a residual's gradient
needs it), dbeta = sum dz and dgamma = sum dz x^ the same way, then after the
tile's barrier dx = gamma / std (dz - (dbeta + x^ dgamma) / M).

Why: cuDNN's batch norm is a runtime-compiled graph per shape (about a second
to build each candidate on a fresh machine) and a memset beside each launch
(an H200 profile of ResNet-50 bf16: 792 us of the step in 106 launches and 89
us in 107 memsets). The first version, two launches each way, made the H100's
step 3.6-6.4% slower than cuDNN's.
"""
from __future__ import annotations

import numpy as np

from ..runtime.kernels import get_kernel
from .reductions import COLUMN_TILE_SOURCE, plan_chunks

# The activations batch norm fuses and the bit mask of their gradient; the layer's element-wise kernels share it.
ACTIVATION_SOURCE = r"""
__device__ __forceinline__ float activate(float v) {
    return ACT == 0 ? v : ACT == 1 ? fmaxf(v, 0.f) : fminf(fmaxf(v, 0.f), 6.f);
}
// Where the activation passes the gradient on: y > 0 (ReLU), 0 < y < 6 (ReLU6).
__device__ __forceinline__ bool passes_gradient(float y) { return y > 0.f && (ACT != 2 || y < 6.f); }
// Element i's bit of the mask, 8 channels a byte: a warp's ballot over 32 consecutive elements is 4 mask bytes
// (little-endian: bit j of byte k is element 8k+j). Every lane of the warp calls it, i < n or not.
__device__ __forceinline__ void write_mask_bit(unsigned char* mask, long long i, long long n, bool passes) {
    const unsigned int bits = __ballot_sync(0xffffffffu, passes);
    if ((threadIdx.x & 31) == 0 && i < n) {   // i is a multiple of 32 here: a whole word, or the last bytes
        if (i + 32 <= n) *(unsigned int*)(mask + i / 8) = bits;
        else for (int k = 0; i + 8 * k < n; ++k) mask[i / 8 + k] = (unsigned char)(bits >> (8 * k));
    }
}
"""

_SOURCE = COLUMN_TILE_SOURCE + ACTIVATION_SOURCE + r"""
// Blocks of one column tile meet here after its sums: the block that drew the last ticket (`last`, it wrote the
// tile's statistics) publishes them by moving the tile's generation on; the others wait for that. The grid is
// at most two blocks an SM (plan_chunks) and __launch_bounds__ keeps two resident, so no block waits on one that
// cannot start. `seen` is the generation read before the block's ticket, so no memset and no reset is needed.
__device__ __forceinline__ void tile_barrier(unsigned int* generations, unsigned int seen, bool last) {
    __syncthreads();   // the last block's owners wrote the statistics
    if (threadIdx.x == 0) {
        if (last) {
            __threadfence();
            atomicAdd(generations + blockIdx.x, 1u);
        } else {
            while (*(volatile unsigned int*)(generations + blockIdx.x) == seen) __nanosleep(64);
            __threadfence();
        }
    }
    __syncthreads();
}
// The generation of this block's tile, read by thread 0 before any ticket is drawn (the fence orders them).
__device__ __forceinline__ unsigned int tile_generation(const unsigned int* generations) {
    unsigned int seen = 0u;
    if (threadIdx.x == 0 && gridDim.y > 1) {
        seen = *(volatile const unsigned int*)(generations + blockIdx.x);
        __threadfence();
    }
    return seen;
}
// One byte of the mask for every 8 elements: the lanes of a warp hold consecutive elements, 8 to a byte (CHANNELS
// is a multiple of 8 where there is a mask), and the byte's first lane writes it where its element is in range.
__device__ __forceinline__ void write_mask_byte(unsigned char* mask, long long i, bool valid, bool passes) {
    const int lane = threadIdx.x & 31, warp_start = threadIdx.x - lane;
    const int lanes = min(32, (int)blockDim.x - warp_start);
    const unsigned int bits = __ballot_sync(lanes == 32 ? 0xffffffffu : (1u << lanes) - 1u, passes && valid);
    if ((lane & 7) == 0 && valid) mask[i >> 3] = (unsigned char)(bits >> lane);
}
// BN training forward in one launch: per channel of x (rows x CHANNELS) the shifted sums, the batch mean and
// inverse std (running statistics moved toward them, the variance unbiased as torch's), then over the block's
// own rows y = act((x - mean) scale + beta [+ residual]) and, with MASK, where act passes the gradient.
extern "C" __global__ void __launch_bounds__(256, 2)
bn_forward(const ELEM_T* x, const float* gamma, const float* beta, float* running_mean, float* running_var,
           float* saved_mean, float* saved_inv_std, float* sums, const ELEM_T* residual, ELEM_T* y,
           unsigned char* mask, float* partials, unsigned int* counters, unsigned int* generations, int rows,
           int rows_per_chunk, int tile_cols, float eps, float momentum) {
    extern __shared__ float lane_sums[];   // shifted sums, then their squares: blockDim.x each
    const int cols = CHANNELS;
    const ColumnTile t = column_tile(rows, rows_per_chunk, tile_cols);
    const unsigned int seen = tile_generation(generations);
    const float shift = t.col < cols ? load_f(x, t.col) : 0.f;
    float s[2] = {0.f, 0.f};
    if (t.col < cols) {
        #pragma unroll 4
        for (long long r = t.first; r < t.stop; r += t.step) {
            const float d = load_f(x, r * cols + t.col) - shift;
            s[0] += d;
            s[1] += d * d;
        }
    }
    float* const out[2] = {sums, sums + cols};
    const bool last = finish_column_sums<2>(t, cols, tile_cols, s, lane_sums, partials, counters, out);
    if (last && threadIdx.x < tile_cols && t.col < cols) {   // the owners: each just wrote its column's sums
        const int c = t.col;
        const float n = (float)rows, d_mean = sums[c] / n;
        const float var = fmaxf(sums[cols + c] / n - d_mean * d_mean, 0.f);
        const float mean = shift + d_mean, inv_std = 1.f / sqrtf(var + eps);
        saved_mean[c] = mean;
        saved_inv_std[c] = inv_std;
        running_mean[c] = (1.f - momentum) * running_mean[c] + momentum * mean;
        running_var[c] = (1.f - momentum) * running_var[c] + momentum * var * n / fmaxf(n - 1.f, 1.f);
    }
    if (gridDim.y > 1) tile_barrier(generations, seen, last);
    else __syncthreads();
    const bool own = t.col < cols;
    const float scale = own ? gamma[t.col] * *(volatile const float*)(saved_inv_std + t.col) : 0.f;
    const float mean = own ? *(volatile const float*)(saved_mean + t.col) : 0.f;
    const float b = own ? beta[t.col] : 0.f;
    const long long start = t.first - threadIdx.x / tile_cols;
    for (long long r0 = start; r0 < t.stop; r0 += t.step) {   // the same trips in every thread: MASK's ballot
        const long long r = r0 + threadIdx.x / tile_cols, i = r * cols + t.col;
        const bool valid = own && r < t.stop;
        bool passes = false;
        if (valid) {
            float v = (load_f(x, i) - mean) * scale + b;
            if (HAS_RESIDUAL) v += load_f(residual, i);
            v = activate(v);
            store_f(y, i, v);
            passes = passes_gradient(v);
        }
        if (MASK) write_mask_byte(mask, i, valid, passes);
    }
}
// The gradient after the activation: dy where it passed (its mask bit, or y without a mask), else 0.
__device__ __forceinline__ float through_activation(const ELEM_T* dy, const ELEM_T* y, const unsigned char* mask,
                                                    long long i) {
    const float d = load_f(dy, i);
    if (ACT == 0) return d;
    const bool passes = MASK ? (mask[i >> 3] >> (i & 7)) & 1 : passes_gradient(load_f(y, i));
    return passes ? d : 0.f;
}
// BN backward in one launch: dgamma = sum dz x^ and dbeta = sum dz per channel (dz = act'(dy), written to dz
// where write_dz: a residual reads it), then, where dx is wanted, over the block's own rows
// dx = gamma / std (dz - (dbeta + x^ dgamma) / M), M = rows (the batch statistics' count).
extern "C" __global__ void __launch_bounds__(256, 2)
bn_backward(const ELEM_T* dy, const ELEM_T* x, const ELEM_T* y, const unsigned char* mask, const float* gamma,
            const float* mean, const float* inv_std, float* dgamma, float* dbeta, ELEM_T* dz, int write_dz,
            ELEM_T* dx, int write_dx, float* partials, unsigned int* counters, unsigned int* generations, int rows,
            int rows_per_chunk, int tile_cols) {
    extern __shared__ float lane_sums[];   // dz x^ sums, then dz sums: blockDim.x each
    const int cols = CHANNELS;
    const ColumnTile t = column_tile(rows, rows_per_chunk, tile_cols);
    const unsigned int seen = tile_generation(generations);
    const bool own = t.col < cols;
    const float m = own ? mean[t.col] : 0.f, r_std = own ? inv_std[t.col] : 0.f;
    float s[2] = {0.f, 0.f};
    if (own) {
        #pragma unroll 4
        for (long long r = t.first; r < t.stop; r += t.step) {
            const long long i = r * cols + t.col;
            const float d = through_activation(dy, y, mask, i);
            if (write_dz) store_f(dz, i, d);
            s[0] += d * ((load_f(x, i) - m) * r_std);
            s[1] += d;
        }
    }
    float* const out[2] = {dgamma, dbeta};
    const bool last = finish_column_sums<2>(t, cols, tile_cols, s, lane_sums, partials, counters, out);
    if (!write_dx) return;   // no block waits: the sums are all this launch owes
    if (gridDim.y > 1) tile_barrier(generations, seen, last);
    else __syncthreads();
    if (!own) return;
    const float g = *(volatile const float*)(dgamma + t.col), bsum = *(volatile const float*)(dbeta + t.col);
    const float k = gamma[t.col] * r_std, inv_count = 1.f / (float)rows;
    for (long long r = t.first; r < t.stop; r += t.step) {
        const long long i = r * cols + t.col;
        const float x_hat = (load_f(x, i) - m) * r_std;
        store_f(dx, i, k * (through_activation(dy, y, mask, i) - (bsum + x_hat * g) * inv_count));
    }
}
"""


class _Sums:
    """What both directions share: the grid of their column sums over x (rows x channels), its workspace and each
    tile's generation (tile_barrier), fixed at build so that a step only launches."""

    def __init__(self, backend, allocator, who: str, defines: dict, x, mask):
        if bool(defines["MASK"]) != (mask is not None):
            raise ValueError(f"{who}: MASK={defines['MASK']} but mask is {'given' if mask is not None else None}")
        channels = x.shape[-1]
        self.rows = x.size // channels   # M = N*H*W, the batch statistics' count
        self.plan = plan_chunks(backend, self.rows, channels)
        self.partials, self.counters = self.plan.workspace(allocator, channels, sums=2)
        self.generations = allocator.zeros((self.plan.tiles,), np.uint32, "workspace")

    def tail(self) -> tuple:
        """The kernels' last arguments but their own: workspace, generations, rows, chunk rows, tile width."""
        plan = self.plan
        return (self.partials, self.counters, self.generations, np.int32(self.rows), np.int32(plan.rows_per_chunk),
                np.int32(plan.tile_cols))


class BatchNormForward:
    """BN training forward [+ residual] [+ activation] into y in one launch; `run()` like a bound cuDNN graph.

    `mask` (with an activation): a uint8 buffer of mask_shape(x.shape) that gets its gradient's bits."""

    def __init__(self, backend, allocator, defines: dict, x, gamma, beta, running_mean, running_var, y, saved_mean,
                 saved_inv_std, epsilon: float, momentum: float, residual=None, mask=None):
        self.sums = _Sums(backend, allocator, "BatchNormForward", defines, x, mask)
        scratch = allocator.zeros((2 * x.shape[-1],), np.float32, "workspace")   # the tile's sums
        self._args = (x, gamma, beta, running_mean, running_var, saved_mean, saved_inv_std, scratch,
                      x if residual is None else residual, y, y if mask is None else mask, *self.sums.tail(),
                      np.float32(epsilon), np.float32(momentum))
        self._kernel = get_kernel(_SOURCE, "bn_forward", **defines)

    def run(self):
        self.sums.plan.launch(self._kernel, self._args, sums=2)


class BatchNormBackward:
    """[dz = act'(dy)] -> BN backward into dx, dgamma, dbeta in one launch; `run()`.

    The activation's gradient comes from `mask` (MASK) or from the forward's output `y`; `dz` given: written;
    `dx` None: only the parameters' gradients."""

    def __init__(self, backend, allocator, defines: dict, dy, x, y, gamma, saved_mean, saved_inv_std, dx, dgamma,
                 dbeta, mask=None, dz=None):
        self.sums = _Sums(backend, allocator, "BatchNormBackward", defines, x, mask)
        self._args = (dy, x, y, y if mask is None else mask, gamma, saved_mean, saved_inv_std, dgamma, dbeta,
                      dy if dz is None else dz, np.int32(dz is not None), x if dx is None else dx,
                      np.int32(dx is not None), *self.sums.tail())
        self._kernel = get_kernel(_SOURCE, "bn_backward", **defines)

    def run(self):
        self.sums.plan.launch(self._kernel, self._args, sums=2)
