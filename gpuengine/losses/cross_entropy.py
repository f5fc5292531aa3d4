"""Softmax + cross-entropy fused with its gradient: one pass writes dL/dz and the loss.

For logits z (B, K) and target rows t (one-hot float32, or any rows summing to
1): p = softmax(z), L = -(1/B) sum_b sum_k t_bk log p_bk, and the gradient
collapses to dL/dz = (p - t) / B (seed note 002: neither engine materialises a
softmax Jacobian). log p = z - max - log sum exp(z - max), so no exp overflows.
One warp per row, or one block per row when rows are wide (ImageNet's 1000
classes: a warp walking them took 20 us for 16 rows on an H100); each block
books its rows' loss into a partial sum and a second one-warp kernel
(StepState.book_partials) adds them in a fixed order into the device loss
history, so the loss is the same every run.
"""
from __future__ import annotations

import numpy as np

from ..data.checks import check_probability_rows
from ..runtime.backend import widen
from ..runtime.kernels import ctype, get_kernel

_SOURCE = r"""
extern "C" __global__ void softmax_xent(const ELEM_T* z, const float* t, ELEM_T* dz, float* partials, int rows,
                                        int classes, float grad_scale) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    float loss = 0.f;
    for (long long row = (long long)blockIdx.x * warps + warp; row < rows; row += (long long)gridDim.x * warps) {
        const long long base = row * classes;
        float m, log_sum;
        row_log_softmax(z, base, classes, lane, m, log_sum);
        float row_loss = 0.f;
        for (int k = lane; k < classes; k += 32) {
            const float log_p = load_f(z, base + k) - m - log_sum;
            const float target = t[base + k];
            store_f(dz, base + k, grad_scale * (expf(log_p) - target));
            row_loss -= target * log_p;
        }
        loss += warp_sum(row_loss);
    }
    const float total = block_sum(loss);
    if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

// One block per row, for wide rows: the block's max and sum of exponentials through shared memory.
extern "C" __global__ void softmax_xent_wide(const ELEM_T* z, const float* t, ELEM_T* dz, float* partials,
                                             int classes, float grad_scale) {
    __shared__ float warp_values[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const long long base = (long long)blockIdx.x * classes;
    float m = __int_as_float(0xff800000);   // -inf without math.h under NVRTC
    for (int k = threadIdx.x; k < classes; k += blockDim.x) m = fmaxf(m, load_f(z, base + k));
    m = warp_max(m);
    if (lane == 0) warp_values[warp] = m;
    __syncthreads();
    m = warp_values[0];
    for (int w = 1; w < warps; ++w) m = fmaxf(m, warp_values[w]);
    __syncthreads();   // every thread has read the maxima before they are overwritten
    float s = 0.f;
    for (int k = threadIdx.x; k < classes; k += blockDim.x) s += expf(load_f(z, base + k) - m);
    s = warp_sum(s);
    if (lane == 0) warp_values[warp] = s;
    __syncthreads();
    s = 0.f;
    for (int w = 0; w < warps; ++w) s += warp_values[w];
    const float log_sum = logf(s);
    float row_loss = 0.f;
    for (int k = threadIdx.x; k < classes; k += blockDim.x) {
        const float log_p = load_f(z, base + k) - m - log_sum;
        const float target = t[base + k];
        store_f(dz, base + k, grad_scale * (expf(log_p) - target));
        row_loss -= target * log_p;
    }
    const float total = block_sum(warp_sum(row_loss));
    if (threadIdx.x == 0) partials[blockIdx.x] = total;
}
"""
_THREADS = 256
_MAX_BLOCKS = 1024
_WIDE_CLASSES = 256   # from here a block per row: a warp would walk 8 or more classes per lane, three times


class SoftmaxCrossEntropy:
    """Mean cross-entropy of softmax(logits (B, K)) against float32 target rows (B, K)."""

    name = "softmax_cross_entropy"

    def check_targets(self, t, output_shape: tuple):
        """The loss and its gradient (p - t) / B assume probability rows: a row summing to 5 trains silently wrong."""
        check_probability_rows(t, "targets")

    def build(self, ctx, z, target, state):
        if z.ndim != 2 or z.shape != target.shape:
            raise ValueError(f"softmax cross-entropy: logits {z.shape} and targets {target.shape} must both be "
                             "(batch, classes)")
        self.backend, self.z, self.target, self.state = ctx.backend, z, target, state
        self.rows, self.classes = z.shape
        self.dz = ctx.allocator.zeros(z.shape, z.dtype, "activations")
        self._grad_scale = np.float32(1.0 / self.rows)
        if self.backend.is_gpu:
            wide = self.classes >= _WIDE_CLASSES
            self.blocks = self.rows if wide else min(-(-self.rows // (_THREADS // 32)), _MAX_BLOCKS)
            self.partials = ctx.allocator.zeros((self.blocks,), np.float32, "workspace")
            elem = ctype(z.dtype)
            self._rows_kernel = (get_kernel(_SOURCE, "softmax_xent_wide", ELEM_T=elem) if wide
                                 else get_kernel(_SOURCE, "softmax_xent", ELEM_T=elem))
            # The wide kernel's grid is the rows, so it takes no row count.
            rows = () if wide else (np.int32(self.rows),)
            self._rows_args = (z, target, self.dz, self.partials) + rows + (np.int32(self.classes), self._grad_scale)
        return self.dz

    def forward_backward(self):
        if not self.backend.is_gpu:
            self._forward_backward_numpy()
            return
        self._rows_kernel((self.blocks,), (_THREADS,), self._rows_args)
        self.state.book_partials(self.partials, self.blocks, self._grad_scale)

    def _forward_backward_numpy(self):
        z = widen(self.z)
        shifted = z - z.max(axis=1, keepdims=True)
        log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        self.dz[...] = (self._grad_scale * (np.exp(log_p) - self.target)).astype(self.dz.dtype)
        loss = -float((self.target * log_p).sum()) * float(self._grad_scale)
        self.state.add_loss_host(int(self.state.step[0]), loss)
