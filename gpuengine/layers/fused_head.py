"""Fused regression head: tanh -> Dense(H -> 1) -> MSE, forward and backward.

The seed-000 MLP ends in `tanh -> Linear(1000, 1) -> MSE`. Run as separate
layers that is six passes over the (B, H) hidden activations (tanh, GEMV,
dW2, dh, tanh backward, db1). Fused, one warp owns one row: it reads the
pre-activation z once, computes h = tanh(z), y = h.w2 + b2 and the loss
gradient d = 2 (y - t) / B, and writes dz = d w2 (1 - h^2) in the same pass,
while accumulating dW2 = sum d h, db2 = sum d and the previous dense layer's
bias gradient db1 = sum dz. Per-block partial sums (no global atomics) are
added by a second tiny kernel, which also books the loss. Inference uses the
forward half alone. `fusion.py` decides when the pattern applies.
"""
from __future__ import annotations

import numpy as np

from ..backend import widen
from ..kernels import ctype, get_kernel, multiprocessor_count

_SOURCE = r"""
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

extern "C" __global__ void head_train(const ELEM_T* z, ELEM_T* dz, const float* w2, const float* b2, const float* target,
                                      float* partials, int rows, int hidden, float grad_scale) {
    extern __shared__ float acc[];            // [db1 (H) | dW2 (H) | db2 | squared error]
    const int width = 2 * hidden + 2;
    for (int i = threadIdx.x; i < width; i += blockDim.x) acc[i] = 0.f;
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    float w[HEAD_COLS], db1[HEAD_COLS], dw2[HEAD_COLS];
    #pragma unroll
    for (int j = 0; j < HEAD_COLS; ++j) {
        int c = lane + 32 * j;
        w[j] = c < hidden ? w2[c] : 0.f;
        db1[j] = 0.f; dw2[j] = 0.f;
    }
    const float bias2 = b2[0];
    float dsum = 0.f, sq = 0.f;
    for (long long row = (long long)blockIdx.x * warps + warp; row < rows; row += (long long)gridDim.x * warps) {
        const long long base = row * hidden;
        float h[HEAD_COLS];
        float dot = 0.f;
        #pragma unroll
        for (int j = 0; j < HEAD_COLS; ++j) {
            int c = lane + 32 * j;
            h[j] = c < hidden ? tanhf(load_f(z, base + c)) : 0.f;
            dot += h[j] * w[j];
        }
        const float diff = warp_sum(dot) + bias2 - target[row];
        const float d = grad_scale * diff;
        dsum += d;
        sq += diff * diff;
        #pragma unroll
        for (int j = 0; j < HEAD_COLS; ++j) {
            int c = lane + 32 * j;
            if (c < hidden) {
                float g = d * w[j] * (1.f - h[j] * h[j]);
                store_f(dz, base + c, g);
                db1[j] += g;
                dw2[j] += d * h[j];
            }
        }
    }
    #pragma unroll
    for (int j = 0; j < HEAD_COLS; ++j) {
        int c = lane + 32 * j;
        if (c < hidden) { atomicAdd(&acc[c], db1[j]); atomicAdd(&acc[hidden + c], dw2[j]); }
    }
    if (lane == 0) { atomicAdd(&acc[2 * hidden], dsum); atomicAdd(&acc[2 * hidden + 1], sq); }
    __syncthreads();
    for (int i = threadIdx.x; i < width; i += blockDim.x) partials[(long long)blockIdx.x * width + i] = acc[i];
}

extern "C" __global__ void head_reduce(const float* partials, int blocks, int hidden, float* db1, float* dw2,
                                       float* db2, float loss_scale, const long long* step,
                                       long long steps_per_epoch, float* history, long long capacity) {
    const int width = 2 * hidden + 2;
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= width) return;
    float s = 0.f;
    for (int b = 0; b < blocks; ++b) s += partials[(long long)b * width + c];
    if (c < hidden) db1[c] = s;
    else if (c < 2 * hidden) dw2[c - hidden] = s;
    else if (c == 2 * hidden) db2[0] = s;
    else history[(step[0] / steps_per_epoch) % capacity] += s * loss_scale;
}

extern "C" __global__ void head_infer(const ELEM_T* z, const float* w2, const float* b2, float* y, int rows, int hidden) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    float w[HEAD_COLS];
    #pragma unroll
    for (int j = 0; j < HEAD_COLS; ++j) { int c = lane + 32 * j; w[j] = c < hidden ? w2[c] : 0.f; }
    for (long long row = (long long)blockIdx.x * warps + warp; row < rows; row += (long long)gridDim.x * warps) {
        float dot = 0.f;
        #pragma unroll
        for (int j = 0; j < HEAD_COLS; ++j) {
            int c = lane + 32 * j;
            if (c < hidden) dot += tanhf(load_f(z, row * hidden + c)) * w[j];
        }
        dot = warp_sum(dot);
        if (lane == 0) y[row] = dot + b2[0];
    }
}
"""
_THREADS = 256
MAX_HIDDEN = 32 * 64   # registers per lane bound the fused width


def fits(hidden: int) -> bool:
    return 1 <= hidden <= MAX_HIDDEN


class TanhLinearMSEHead:
    """The fused tail of a dense regressor: z (B, H) -> loss, dz, dW2, db2 and db1."""

    name = "tanh_linear_mse_head"

    def __init__(self, dense_name: str, prev_dense_name: str):
        self.dense_name = dense_name            # the Dense(H -> 1) this head replaces
        self.prev_dense_name = prev_dense_name  # the Dense whose bias gradient it also produces

    def build(self, ctx, z, target, state):
        rows, hidden = z.shape
        if target.shape != (rows, 1):
            raise ValueError(f"fused head: target {target.shape}, expected ({rows}, 1)")
        if not fits(hidden):
            raise ValueError(f"fused head supports hidden widths 1..{MAX_HIDDEN}, got {hidden}")
        self.backend, self.z, self.target, self.state = ctx.backend, z, target, state
        p = ctx.params
        self.w2 = p.master_view(f"{self.dense_name}.weight").reshape(hidden)
        self.b2 = p.master_view(f"{self.dense_name}.bias")
        self.grad_w2 = p.grad_view(f"{self.dense_name}.weight").reshape(hidden)
        self.grad_b2 = p.grad_view(f"{self.dense_name}.bias")
        self.grad_b1 = p.grad_view(f"{self.prev_dense_name}.bias")
        self.dz = ctx.allocator.zeros(z.shape, z.dtype, "activations")
        self.rows, self.hidden = rows, hidden
        self._grad_scale = np.float32(2.0 / rows)
        self._loss_scale = np.float32(1.0 / rows)
        if self.backend.is_gpu:
            defines = dict(ELEM_T=ctype(z.dtype), HEAD_COLS=-(-hidden // 32))
            self._train = get_kernel(_SOURCE, "head_train", **defines)
            self._reduce = get_kernel(_SOURCE, "head_reduce", **defines)
            warps_per_block = _THREADS // 32
            self.blocks = max(1, min(-(-rows // warps_per_block), 2 * multiprocessor_count()))
            self.partials = ctx.allocator.zeros((self.blocks, 2 * hidden + 2), np.float32, "workspace")
        return self.dz

    def forward_backward(self):
        if not self.backend.is_gpu:
            self._forward_backward_numpy()
            return
        width = 2 * self.hidden + 2
        self._train((self.blocks,), (_THREADS,),
                    (self.z, self.dz, self.w2, self.b2, self.target, self.partials,
                     np.int32(self.rows), np.int32(self.hidden), self._grad_scale),
                    shared_mem=4 * width)
        self._reduce((-(-width // 256),), (256,),
                     (self.partials, np.int32(self.blocks), np.int32(self.hidden), self.grad_b1, self.grad_w2,
                      self.grad_b2, self._loss_scale) + self.state.kernel_args())

    def _forward_backward_numpy(self):
        h = np.tanh(widen(self.z))
        y = h @ self.w2 + self.b2[0]
        diff = y - self.target[:, 0]
        d = self._grad_scale * diff
        dz = (d[:, None] * self.w2[None, :]) * (1.0 - h * h)
        self.dz[...] = dz.astype(self.dz.dtype)
        self.grad_b1[...] = dz.sum(axis=0)
        self.grad_w2[...] = d @ h
        self.grad_b2[...] = d.sum()
        self.state.add_loss_host(int(self.state.step[0]), float((diff * diff).sum()) * float(self._loss_scale))


class TanhLinearOutput:
    """Inference half of the head: y = tanh(z) . w2 + b2, one warp per row."""

    def __init__(self, backend, params, dense_name: str, z, y):
        rows, hidden = z.shape
        if y.shape != (rows, 1) or y.dtype != np.float32:
            raise ValueError(f"fused output: y must be float32 ({rows}, 1), got {y.dtype} {y.shape}")
        self.backend, self.z, self.y = backend, z, y
        self.w2 = params.master_view(f"{dense_name}.weight").reshape(hidden)
        self.b2 = params.master_view(f"{dense_name}.bias")
        self.rows, self.hidden = rows, hidden
        if backend.is_gpu:
            self._kernel = get_kernel(_SOURCE, "head_infer", ELEM_T=ctype(z.dtype), HEAD_COLS=-(-hidden // 32))
            self.blocks = max(1, min(-(-rows // (_THREADS // 32)), 8 * multiprocessor_count()))

    def run(self):
        if not self.backend.is_gpu:
            self.y[:, 0] = np.tanh(widen(self.z)) @ self.w2 + self.b2[0]
            return
        self._kernel((self.blocks,), (_THREADS,),
                     (self.z, self.w2, self.b2, self.y, np.int32(self.rows), np.int32(self.hidden)))
