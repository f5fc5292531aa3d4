"""The engine's own batch-norm kernels (training, NHWC), in place of cuDNN's graphs: the `batchnorm=engine` toggle.

Forward, two launches: `bn_stats` sums x - x[0, c] and its square per channel
(reductions.py's column tiles and one-launch ending: partial sums per row
chunk, the block drawing the last ticket adds them in a fixed order, so the
result is the same bits every run and no memset is needed). That block then
writes the batch mean and inverse standard deviation, moves the running
statistics and leaves scale = gamma / std beside the mean and beta.
`bn_apply` computes y = act((x - mean) scale + beta [+ residual]) and, where
the activation's gradient is needed later, its bit mask (8 channels a byte,
as cuDNN's fused backward reads it). Where |mean| is large against the std,
shifting by one sample of the channel keeps the variance's digits, and the
centred form keeps y's: scale x + (beta - mean scale) would subtract two
large terms.

Backward, two launches: `bn_grad_sums` takes dz = dy where the activation
passed the gradient (the mask, or y without one), and sums dbeta = sum dz and
dgamma = sum dz x^ the same way (writing dz where a residual's gradient needs
it); `bn_dx` then computes dx = gamma / std (dz - (dbeta + x^ dgamma) / M).

Why: cuDNN's batch norm is a runtime-compiled graph per shape (about a second
to build each candidate on a fresh machine) and a memset beside each launch
(issue 38's profile: 834 us of a ResNet-50 step in ~106 launches and 120
memsets).
"""
from __future__ import annotations

import numpy as np

from ..runtime.kernels import get_kernel, launch_shape
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
// Per channel of x (rows x CHANNELS): batch mean and inverse std, the running statistics moved toward them
// (the variance unbiased, torch's convention), and what bn_apply reads: scale, mean and beta (CHANNELS each).
extern "C" __global__ void bn_stats(const ELEM_T* x, const float* gamma, const float* beta, float* running_mean,
                                    float* running_var, float* saved_mean, float* saved_inv_std, float* sums,
                                    float* affine, float* partials, unsigned int* counters, int rows,
                                    int rows_per_chunk, int tile_cols, float eps, float momentum) {
    extern __shared__ float lane_sums[];   // shifted sums, then their squares: blockDim.x each
    const int cols = CHANNELS;
    const ColumnTile t = column_tile(rows, rows_per_chunk, tile_cols);
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
    if (!finish_column_sums<2>(t, cols, tile_cols, s, lane_sums, partials, counters, out)) return;
    if (threadIdx.x >= tile_cols || t.col >= cols) return;   // the owners: each just wrote its column's sums
    const int c = t.col;
    const float n = (float)rows, d_mean = sums[c] / n;
    const float var = fmaxf(sums[cols + c] / n - d_mean * d_mean, 0.f);
    const float mean = shift + d_mean, inv_std = 1.f / sqrtf(var + eps);
    saved_mean[c] = mean;
    saved_inv_std[c] = inv_std;
    const float scale = gamma[c] * inv_std;
    affine[c] = scale;
    affine[cols + c] = mean;
    affine[2 * cols + c] = beta[c];
    running_mean[c] = (1.f - momentum) * running_mean[c] + momentum * mean;
    running_var[c] = (1.f - momentum) * running_var[c] + momentum * var * n / fmaxf(n - 1.f, 1.f);
}
// y = act((x - mean) scale + beta [+ residual]); with MASK also the bits of where act passes the gradient.
extern "C" __global__ void bn_apply(const ELEM_T* x, const float* affine, const ELEM_T* residual, ELEM_T* y,
                                    unsigned char* mask, long long n) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long start = (long long)blockIdx.x * blockDim.x; start < n; start += stride) {   // uniform per block
        const long long i = start + threadIdx.x;
        bool passes = false;
        if (i < n) {
            const int c = (int)(i % CHANNELS);
            float v = (load_f(x, i) - affine[CHANNELS + c]) * affine[c] + affine[2 * CHANNELS + c];
            if (HAS_RESIDUAL) v += load_f(residual, i);
            v = activate(v);
            store_f(y, i, v);
            passes = passes_gradient(v);
        }
        if (MASK) write_mask_bit(mask, i, n, passes);
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
// dgamma = sum dz x^ and dbeta = sum dz per channel; dz itself into dz where write_dz (a residual reads it).
extern "C" __global__ void bn_grad_sums(const ELEM_T* dy, const ELEM_T* x, const ELEM_T* y, const unsigned char* mask,
                                        const float* mean, const float* inv_std, float* dgamma, float* dbeta,
                                        ELEM_T* dz, int write_dz, float* partials, unsigned int* counters, int rows,
                                        int rows_per_chunk, int tile_cols) {
    extern __shared__ float lane_sums[];   // dz x^ sums, then dz sums: blockDim.x each
    const int cols = CHANNELS;
    const ColumnTile t = column_tile(rows, rows_per_chunk, tile_cols);
    float s[2] = {0.f, 0.f};
    if (t.col < cols) {
        const float m = mean[t.col], r_std = inv_std[t.col];
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
    finish_column_sums<2>(t, cols, tile_cols, s, lane_sums, partials, counters, out);
}
// dx = gamma / std (dz - (dbeta + x^ dgamma) / M), M = rows (the batch statistics' count).
extern "C" __global__ void bn_dx(const ELEM_T* dy, const ELEM_T* x, const ELEM_T* y, const unsigned char* mask,
                                 const float* gamma, const float* mean, const float* inv_std, const float* dgamma,
                                 const float* dbeta, ELEM_T* dx, long long n, float inv_count) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += stride) {
        const int c = (int)(i % CHANNELS);
        const float r_std = inv_std[c], x_hat = (load_f(x, i) - mean[c]) * r_std;
        const float d = through_activation(dy, y, mask, i);
        store_f(dx, i, gamma[c] * r_std * (d - (dbeta[c] + x_hat * dgamma[c]) * inv_count));
    }
}
"""


class _Passes:
    """What both directions share: the column-sum pass's grid and workspace over x (rows x channels), and the
    element-wise pass's launch shape, fixed at build so that a step only launches."""

    def __init__(self, backend, allocator, who: str, defines: dict, x, mask):
        if bool(defines["MASK"]) != (mask is not None):
            raise ValueError(f"{who}: MASK={defines['MASK']} but mask is {'given' if mask is not None else None}")
        channels = x.shape[-1]
        self.n, self.rows = x.size, x.size // channels   # M = N*H*W, the batch statistics' count
        self.plan = plan_chunks(backend, self.rows, channels)
        self.partials, self.counters = self.plan.workspace(allocator, channels, sums=2)
        self.grid, self.block = launch_shape(self.n)

    def sums_tail(self) -> tuple:
        """The column-sum kernels' last arguments but their own: workspace, rows, chunk rows, tile width."""
        plan = self.plan
        return (self.partials, self.counters, np.int32(self.rows), np.int32(plan.rows_per_chunk),
                np.int32(plan.tile_cols))


class BatchNormForward:
    """BN training forward [+ residual] [+ activation] into y, two launches; `run()` like a bound cuDNN graph.

    `mask` (with an activation): a uint8 buffer of mask_shape(x.shape) that gets its gradient's bits."""

    def __init__(self, backend, allocator, defines: dict, x, gamma, beta, running_mean, running_var, y, saved_mean,
                 saved_inv_std, epsilon: float, momentum: float, residual=None, mask=None):
        self.passes = _Passes(backend, allocator, "BatchNormForward", defines, x, mask)
        channels = x.shape[-1]
        self.sums = allocator.zeros((2 * channels,), np.float32, "workspace")
        self.affine = allocator.zeros((3 * channels,), np.float32, "workspace")   # scale, mean, beta
        self._stats_args = (x, gamma, beta, running_mean, running_var, saved_mean, saved_inv_std, self.sums,
                            self.affine, *self.passes.sums_tail(), np.float32(epsilon), np.float32(momentum))
        self._apply_args = (x, self.affine, x if residual is None else residual, y, y if mask is None else mask,
                            np.int64(self.passes.n))
        self._stats = get_kernel(_SOURCE, "bn_stats", **defines)
        self._apply = get_kernel(_SOURCE, "bn_apply", **defines)

    def run(self):
        passes = self.passes
        passes.plan.launch(self._stats, self._stats_args, sums=2)
        self._apply(passes.grid, passes.block, self._apply_args)


class BatchNormBackward:
    """[dz = act'(dy)] -> BN backward into dx, dgamma, dbeta, two launches (one without dx); `run()`.

    The activation's gradient comes from `mask` (MASK) or from the forward's output `y`; `dz` given: written."""

    def __init__(self, backend, allocator, defines: dict, dy, x, y, gamma, saved_mean, saved_inv_std, dx, dgamma,
                 dbeta, mask=None, dz=None):
        self.passes = passes = _Passes(backend, allocator, "BatchNormBackward", defines, x, mask)
        mask = y if mask is None else mask
        self._sums_args = (dy, x, y, mask, saved_mean, saved_inv_std, dgamma, dbeta, dy if dz is None else dz,
                           np.int32(dz is not None), *passes.sums_tail())
        self._dx_args = None if dx is None else (dy, x, y, mask, gamma, saved_mean, saved_inv_std, dgamma, dbeta, dx,
                                                 np.int64(passes.n), np.float32(1.0 / passes.rows))
        self._sums = get_kernel(_SOURCE, "bn_grad_sums", **defines)
        self._dx = get_kernel(_SOURCE, "bn_dx", **defines)

    def run(self):
        passes = self.passes
        passes.plan.launch(self._sums, self._sums_args, sums=2)
        if self._dx_args is not None:
            self._dx(passes.grid, passes.block, self._dx_args)
