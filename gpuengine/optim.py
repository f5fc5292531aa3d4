"""Adam (Kingma & Ba 2015) as one fused kernel over the flat parameter buffer.

m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
The step t is read from the device step counter (step_state.py), so the bias
correction is right on every replay of a captured graph; the learning rate is
read from a device scalar too, so setting `lr` later reaches captured graphs. Under bf16 the same
pass refreshes the bf16 compute copy of the weights. Same update as
torch.optim.Adam (eps added after the square root, no weight decay).
"""
from __future__ import annotations

import numpy as np

from . import checks
from .runtime.kernels import ctype, get_kernel

_SOURCE = r"""
extern "C" __global__ void adam(float* p, const float* g, float* m, float* v, COPY_T* copy, const long long* step,
                                const float* lr_ptr, float b1, float b2, float eps, long long n) {
    const float t = (float)(step[0] + 1), lr = lr_ptr[0];
    const float bc1 = 1.f - powf(b1, t), bc2 = 1.f - powf(b2, t);
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        float gi = g[i];
        float mi = b1 * m[i] + (1.f - b1) * gi;
        float vi = b2 * v[i] + (1.f - b2) * gi * gi;
        m[i] = mi; v[i] = vi;
        float pi = p[i] - lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
        p[i] = pi;
        if (HAS_COPY) store_f(copy, i, pi);
    }
}
"""


class Adam:
    def __init__(self, backend, allocator, params, state, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8):
        self.backend, self.params, self.state = backend, params, state
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            checks.refuse("betas", betas, "a pair (b1, b2) of finite numbers >= 0.0 and < 1.0")
        self.b1, self.b2 = (checks.number(f"betas[{k}]", b, at_least=0.0, below=1.0) for k, b in enumerate(betas))
        self.eps = checks.number("eps", eps, above=0.0)
        self._lr_device = allocator.zeros((1,), np.float32, "workspace")   # a scalar, like the step counter
        self.lr = lr
        self.has_copy = params.compute is not params.master
        if backend.is_gpu:
            copy_dtype = params.compute.dtype if self.has_copy else np.float32
            self._kernel = get_kernel(_SOURCE, "adam", COPY_T=ctype(copy_dtype), HAS_COPY=int(self.has_copy))
            self._blocks = min(-(-params.size // 256), 4096)

    @property
    def lr(self) -> float:
        return self._lr

    @lr.setter
    def lr(self, value: float):
        """Validate, then write the device scalar on the engine stream (ordered before later launches)."""
        self._lr = checks.number("lr", value, above=0.0)   # lr=inf trains to NaN as surely as lr=nan
        with self.backend.activate():
            self.backend.upload(self._lr_device, np.array([self._lr], np.float32))

    def step(self):
        p = self.params
        if not self.backend.is_gpu:
            self._step_numpy()
            return
        self._kernel((self._blocks,), (256,),
                     (p.master, p.grad, p.moment1, p.moment2, p.compute, self.state.step, self._lr_device,
                      np.float32(self.b1), np.float32(self.b2), np.float32(self.eps), np.int64(p.size)))

    def _step_numpy(self):
        p = self.params
        t = float(self.state.step[0] + 1)
        g = p.grad
        p.moment1 *= self.b1
        p.moment1 += (1 - self.b1) * g
        p.moment2 *= self.b2
        p.moment2 += (1 - self.b2) * g * g
        m_hat = p.moment1 / (1 - self.b1 ** t)
        v_hat = p.moment2 / (1 - self.b2 ** t)
        p.master -= (self.lr * m_hat / (np.sqrt(v_hat) + self.eps)).astype(p.master.dtype)
        if self.has_copy:
            p.compute[...] = p.master.astype(p.compute.dtype)
