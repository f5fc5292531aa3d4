"""Losses, each fused with its own gradient: one pass writes dL/dy and the loss.

MSE: L = mean((y - t)^2) over batch and outputs; dL/dy = 2 (y - t) / (B * O).
Each block writes its partial sum of squares; StepState.book_partials adds them
in a fixed order into the epoch's slot of the device loss history (no atomics:
the same loss every run), so the host never reads a loss inside a step.
"""
from __future__ import annotations

import numpy as np

from ..runtime.backend import widen
from ..runtime.kernels import ctype, get_kernel

_SOURCE = r"""
extern "C" __global__ void mse(const ELEM_T* y, const float* t, ELEM_T* dy, long long n, float grad_scale,
                               float* partials) {
    float local = 0.f;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        float diff = load_f(y, i) - t[i];
        store_f(dy, i, grad_scale * diff);
        local += diff * diff;
    }
    const float total = block_sum(warp_sum(local));
    if (threadIdx.x == 0) partials[blockIdx.x] = total;
}
"""


class MSELoss:
    """Mean squared error over a (B, O) prediction and a float32 (B, O) target."""

    name = "mse"

    def build(self, ctx, y, target, state):
        if y.shape != target.shape:
            raise ValueError(f"MSE: prediction {y.shape} and target {target.shape} differ")
        self.backend, self.y, self.target, self.state = ctx.backend, y, target, state
        self.dy = ctx.allocator.zeros(y.shape, y.dtype, "activations")
        n = y.size
        self._n = n
        self._grad_scale = np.float32(2.0 / n)
        self._loss_scale = np.float32(1.0 / n)
        if self.backend.is_gpu:
            self._kernel = get_kernel(_SOURCE, "mse", ELEM_T=ctype(y.dtype))
            self._blocks = min(-(-n // 256), 1024)
            self.partials = ctx.allocator.zeros((self._blocks,), np.float32, "workspace")
        return self.dy

    def forward_backward(self):
        if not self.backend.is_gpu:
            diff = widen(self.y) - self.target
            self.dy[...] = (self._grad_scale * diff).astype(self.dy.dtype)
            self.state.add_loss_host(int(self.state.step[0]), float((diff * diff).sum()) * float(self._loss_scale))
            return
        self._kernel((self._blocks,), (256,), (self.y, self.target, self.dy, np.int64(self._n), self._grad_scale,
                                               self.partials))
        self.state.book_partials(self.partials, self._blocks, self._loss_scale)
