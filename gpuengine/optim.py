"""Adam (Kingma & Ba 2015) as one fused kernel over the flat parameter buffer.

m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
The step t is read from the device step counter (step_state.py), so the bias
correction is right on every replay of a captured graph; the learning rate is
read from a device scalar too, so setting `lr` later reaches captured graphs. Under bf16 the same
pass refreshes the bf16 compute copy of the weights. Same update as
torch.optim.Adam (eps added after the square root, no weight decay).

Under bf16 a training program's convolutions leave their weight gradients in
bf16 scratches, widened into the fp32 master gradients by a launch of their
own (ops/widen.py: 40 us and 141 MB a ResNet-50 CIFAR step on an H200, and
Adam then reads the widened 4 bytes a value again). Given those (scratch,
master) pairs (`narrow`), a large buffer's update reads each such gradient
from its scratch instead: one block a row of a table that cuts the flat
buffer into chunks, each naming where its gradient is (`gradient_rows`). The
master gradients of those weights are then not written by a step; the
trainer widens them only when they are read (FlatParameters.grads_dict).
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

// The step's bias corrections, from the device step counter (right on every replay of a captured step).
__device__ __forceinline__ void bias_corrections(const long long* step, float b1, float b2, float& bc1, float& bc2) {
    const float t = (float)(step[0] + 1);
    bc1 = 1.f - powf(b1, t);
    bc2 = 1.f - powf(b2, t);
}

// Four neighbouring elements from i as 16-byte loads and stores: scalar ones left the update at 2.2 TB/s on an H100.
__device__ __forceinline__ void adam_four(float* p, float4 gq, float* m, float* v, COPY_T* copy, long long i,
                                          float b1, float b2, float eps, float lr, float bc1, float bc2) {
    float4 pq = *reinterpret_cast<float4*>(p + i), mq = *reinterpret_cast<float4*>(m + i);
    float4 vq = *reinterpret_cast<float4*>(v + i);
    adam_one(pq.x, gq.x, mq.x, vq.x, b1, b2, eps, lr, bc1, bc2);
    adam_one(pq.y, gq.y, mq.y, vq.y, b1, b2, eps, lr, bc1, bc2);
    adam_one(pq.z, gq.z, mq.z, vq.z, b1, b2, eps, lr, bc1, bc2);
    adam_one(pq.w, gq.w, mq.w, vq.w, b1, b2, eps, lr, bc1, bc2);
    *reinterpret_cast<float4*>(p + i) = pq; *reinterpret_cast<float4*>(m + i) = mq;
    *reinterpret_cast<float4*>(v + i) = vq;
    if (HAS_COPY) {
        store_f(copy, i, pq.x); store_f(copy, i + 1, pq.y); store_f(copy, i + 2, pq.z); store_f(copy, i + 3, pq.w);
    }
}

__device__ __forceinline__ void adam_at(float* p, float g, float* m, float* v, COPY_T* copy, long long i,
                                        float b1, float b2, float eps, float lr, float bc1, float bc2) {
    float pi = p[i], mi = m[i], vi = v[i];
    adam_one(pi, g, mi, vi, b1, b2, eps, lr, bc1, bc2);
    p[i] = pi; m[i] = mi; v[i] = vi;
    if (HAS_COPY) store_f(copy, i, pi);
}

extern "C" __global__ void adam(float* p, const float* g, float* m, float* v, COPY_T* copy, const long long* step,
                                const float* lr_ptr, float b1, float b2, float eps, long long n) {
    const float lr = lr_ptr[0];
    float bc1, bc2;
    bias_corrections(step, b1, b2, bc1, bc2);
    const long long first = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    const long long stride = (long long)gridDim.x * blockDim.x, quads = VECTOR ? n / 4 : 0;
    for (long long q = first; q < quads; q += stride)
        adam_four(p, reinterpret_cast<const float4*>(g)[q], m, v, copy, 4 * q, b1, b2, eps, lr, bc1, bc2);
    for (long long i = 4 * quads + first; i < n; i += stride)
        adam_at(p, g[i], m, v, copy, i, b1, b2, eps, lr, bc1, bc2);
}

// Block b updates row b of the table, (first, count, narrow): `count` elements from `first`, each gradient read
// from the bf16 array at address `narrow` (its k-th value for element first + k) where that is not 0, from g
// otherwise. Rows start on multiples of four elements and narrow arrays on 8-byte boundaries (gradient_rows).
extern "C" __global__ void adam_rows(float* p, const float* g, float* m, float* v, COPY_T* copy, const long long* rows,
                                     const long long* step, const float* lr_ptr, float b1, float b2, float eps) {
    const float lr = lr_ptr[0];
    float bc1, bc2;
    bias_corrections(step, b1, b2, bc1, bc2);
    const long long* row = rows + 3 * (long long)blockIdx.x;
    const long long first = row[0], count = row[1], quads = count / 4;
    const bf16_t* narrow = reinterpret_cast<const bf16_t*>(row[2]);
    for (long long q = threadIdx.x; q < quads; q += blockDim.x) {
        float4 gq;
        if (narrow) {
            const Pack<bf16_t, 4> s = load_pack<bf16_t, 4>(narrow, 4 * q);
            gq = make_float4(bf16_to_float(s.v[0]), bf16_to_float(s.v[1]), bf16_to_float(s.v[2]),
                             bf16_to_float(s.v[3]));
        } else {
            gq = *reinterpret_cast<const float4*>(g + first + 4 * q);
        }
        adam_four(p, gq, m, v, copy, first + 4 * q, b1, b2, eps, lr, bc1, bc2);
    }
    for (long long k = 4 * quads + threadIdx.x; k < count; k += blockDim.x)
        adam_at(p, narrow ? bf16_to_float(narrow[k]) : g[first + k], m, v, copy, first + k, b1, b2, eps, lr, bc1, bc2);
}
"""

# Below this, four elements a thread leave too few threads to hide each one's latency: the CNN's 31,530
# parameters in 31 blocks made its 86 us step 2.5% slower (H100, f5ef9c9).
_VECTOR_MIN = 1 << 18
ROW = 8192   # elements a block of adam_rows updates: 32 a thread (the grid-stride kernel gives ResNet-50 ~22)


def gradient_rows(size: int, narrow: list[tuple[int, int, int]], row: int = ROW) -> list[tuple[int, int, int]]:
    """adam_rows' table: (first, count, address) rows covering elements 0 .. size-1 in order, each at most `row`
    long and starting on a multiple of four. The spans of `narrow`, (first, count, address of a bf16 array),
    read their gradient from that array (a row's address advanced to its own first value), the rest from the
    float32 gradient (address 0); a span starts on a multiple of four and overlaps no other."""
    rows, at = [], 0

    def cut(first: int, count: int, address: int):
        for start in range(0, count, row):
            rows.append((first + start, min(row, count - start), address + 2 * start if address else 0))
    for first, count, address in sorted(narrow):
        if first % 4 or first < at or count < 1 or first + count > size:
            raise ValueError(f"a bf16 gradient span of {count} elements at {first} does not fit the flat buffer "
                             f"of {size} (spans start on a multiple of 4, in order, the last ending at {at})")
        lead = min(-at % 4, first - at)   # a gap's first row starts on a multiple of four: its lead alone
        cut(at, lead, 0)
        cut(at + lead, first - at - lead, 0)
        cut(first, count, address)
        at = first + count
    lead = min(-at % 4, size - at)
    cut(at, lead, 0)
    cut(at + lead, size - at - lead, 0)
    return rows


class Adam:
    def __init__(self, backend, allocator, params, state, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 narrow=()):
        """narrow: (bf16 scratch, float32 master gradient view) pairs whose gradients a large buffer's update
        reads from the scratch (the module's docstring); `reads_narrow` says whether it does, and then the
        master gradients of those pairs are not written by a step."""
        self.backend, self.params, self.state = backend, params, state
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            checks.refuse("betas", betas, "a pair (b1, b2) of finite numbers >= 0.0 and < 1.0")
        self.b1, self.b2 = (checks.number(f"betas[{k}]", b, at_least=0.0, below=1.0) for k, b in enumerate(betas))
        self.eps = checks.number("eps", eps, above=0.0)
        self._lr_device = allocator.zeros((1,), np.float32, "workspace")   # a scalar, like the step counter
        self.lr = lr
        self.has_copy = params.compute is not params.master
        self.vector = False   # whether the kernel moves four elements a thread (large, 16-byte aligned buffers)
        self.reads_narrow = False
        if backend.is_gpu:
            copy_dtype = params.compute.dtype if self.has_copy else np.float32
            buffers = (params.master, params.grad, params.moment1, params.moment2)
            self.vector = params.size >= _VECTOR_MIN and all(b.data.ptr % 16 == 0 for b in buffers)
            spans = [(self._offset(master), scratch.size, int(scratch.data.ptr)) for scratch, master in narrow]
            self.reads_narrow = self.vector and bool(spans) and all(f % 4 == 0 and a % 8 == 0 for f, _, a in spans)
            defines = dict(COPY_T=ctype(copy_dtype), HAS_COPY=int(self.has_copy), VECTOR=int(self.vector))
            if self.reads_narrow:
                self._rows = allocator.table(gradient_rows(params.size, spans))
                self._kernel = get_kernel(_SOURCE, "adam_rows", **defines)
            else:
                self._kernel = get_kernel(_SOURCE, "adam", **defines)
                self._blocks = min(-(-params.size // (4 * 256 if self.vector else 256)), 4096)

    def _offset(self, master) -> int:
        """Where a master gradient view starts in the flat gradient buffer, in elements."""
        offset, rest = divmod(int(master.data.ptr) - int(self.params.grad.data.ptr), 4)
        if rest or master.dtype != np.float32 or not 0 <= offset <= self.params.size - master.size:
            raise ValueError(f"a master gradient of {master.dtype} {master.shape} outside the flat float32 gradients")
        return offset

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
        scalars = (np.float32(self.b1), np.float32(self.b2), np.float32(self.eps))
        if self.reads_narrow:
            self._kernel((len(self._rows),), (256,), (p.master, p.grad, p.moment1, p.moment2, p.compute, self._rows,
                                                      self.state.step, self._lr_device, *scalars))
        else:
            self._kernel((self._blocks,), (256,), (p.master, p.grad, p.moment1, p.moment2, p.compute,
                                                   self.state.step, self._lr_device, *scalars, np.int64(p.size)))

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
