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
__device__ __forceinline__ void adam_one(float& p, float g, float& m, float& v, float b1, float b2, float eps,
                                          float lr, float bc1, float bc2) {
    m = b1 * m + (1.f - b1) * g;
    v = b2 * v + (1.f - b2) * g * g;
    p = p - lr * (m / bc1) / (sqrtf(v / bc2) + eps);
}

extern "C" __global__ void adam(float* p, const float* g, float* m, float* v, COPY_T* copy, const long long* step,
                                const float* lr_ptr, float b1, float b2, float eps, long long n) {
    const float t = (float)(step[0] + 1), lr = lr_ptr[0];
    const float bc1 = 1.f - powf(b1, t), bc2 = 1.f - powf(b2, t);
    const long long first = blockIdx.x * (long long)blockDim.x + threadIdx.x, stride = (long long)gridDim.x * blockDim.x;
    // Four elements a thread as 16-byte loads and stores: scalar ones left the update at 2.2 TB/s on an H100.
    const long long quads = VECTOR ? n / 4 : 0;
    for (long long q = first; q < quads; q += stride) {
        float4 pq = reinterpret_cast<float4*>(p)[q], mq = reinterpret_cast<float4*>(m)[q];
        float4 vq = reinterpret_cast<float4*>(v)[q];
        const float4 gq = reinterpret_cast<const float4*>(g)[q];
        adam_one(pq.x, gq.x, mq.x, vq.x, b1, b2, eps, lr, bc1, bc2);
        adam_one(pq.y, gq.y, mq.y, vq.y, b1, b2, eps, lr, bc1, bc2);
        adam_one(pq.z, gq.z, mq.z, vq.z, b1, b2, eps, lr, bc1, bc2);
        adam_one(pq.w, gq.w, mq.w, vq.w, b1, b2, eps, lr, bc1, bc2);
        reinterpret_cast<float4*>(p)[q] = pq; reinterpret_cast<float4*>(m)[q] = mq;
        reinterpret_cast<float4*>(v)[q] = vq;
        if (HAS_COPY) {
            store_f(copy, 4 * q, pq.x); store_f(copy, 4 * q + 1, pq.y);
            store_f(copy, 4 * q + 2, pq.z); store_f(copy, 4 * q + 3, pq.w);
        }
    }
    for (long long i = 4 * quads + first; i < n; i += stride) {
        float pi = p[i], mi = m[i], vi = v[i];
        adam_one(pi, g[i], mi, vi, b1, b2, eps, lr, bc1, bc2);
        p[i] = pi; m[i] = mi; v[i] = vi;
        if (HAS_COPY) store_f(copy, i, pi);
    }
}
"""

# Below this, four elements a thread leave too few threads to hide each one's latency: the CNN's 31,530
# parameters in 31 blocks made its 86 us step 2.5% slower (H100, f5ef9c9).
_VECTOR_MIN = 1 << 18


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
        self.vector = False   # whether the kernel moves four elements a thread (large, 16-byte aligned buffers)
        if backend.is_gpu:
            copy_dtype = params.compute.dtype if self.has_copy else np.float32
            buffers = (params.master, params.grad, params.moment1, params.moment2)
            self.vector = params.size >= _VECTOR_MIN and all(b.data.ptr % 16 == 0 for b in buffers)
            self._kernel = get_kernel(_SOURCE, "adam", COPY_T=ctype(copy_dtype), HAS_COPY=int(self.has_copy),
                                      VECTOR=int(self.vector))
            self._blocks = min(-(-params.size // (4 * 256 if self.vector else 256)), 4096)

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
