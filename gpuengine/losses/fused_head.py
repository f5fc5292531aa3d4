"""Fused regression head: tanh -> Dense(H -> 1) -> MSE, forward and backward.

The seed-000 MLP ends in `tanh -> Linear(1000, 1) -> MSE`. Run as separate
layers that is seven passes over the (B, H) hidden activations (tanh, GEMV,
dW2, dh, tanh backward, db1, and tanh's output written once). Fused it is two:
pass 1 (a warp per row) reads z and computes h = tanh(z), y = h.w2 + b2 and the
loss gradient d = 2 (y - t) / B; pass 2 (a thread per column) reads z again
and writes dz = d w2 (1 - h^2), summing dW2 = sum d h and the previous dense
layer's bias gradient db1 = sum dz per chunk of rows. A third tiny kernel adds
the chunks (no atomics: the same result every run) and books the loss. dz is
written over z, which nothing needs afterwards: one (B, H) buffer, not two.
Inference uses pass 1 alone. `model/passes.py` decides when the pattern applies.

z may also come batch-innermost (stored (H, B): the TF32 program's Dense over
the batch writes it so, layers/dense.py says why), and then without the
Dense's bias b1 (cuBLASLt adds a bias along the batch there, not along H):
the head adds b1 as it reads z. Pass 1 then gives a row to a lane, 32 rows to
a block whose warps split the columns, and pass 2 a column and a chunk of rows
to a warp, lanes along the rows: both read along memory, and dz lands over z
batch-innermost too.
"""
from __future__ import annotations

import numpy as np

from ..runtime.backend import widen
from ..runtime.kernels import ctype, get_kernel

_SOURCE = r"""

// Pass 1, one warp per row and every row at once (a memory-bound pass needs
// thousands of warps in flight): y = tanh(z) . w2 + b2. Training writes
// d = dL/dy and the row's squared error; inference writes y.
extern "C" __global__ void head_rows(const ELEM_T* z, const float* w2, const float* b2, const float* target,
                                     float* out, float* sq_err, int rows, int hidden, float grad_scale,
                                     int training) {
    extern __shared__ float w[];
    for (int c = threadIdx.x; c < hidden; c += blockDim.x) w[c] = w2[c];
    __syncthreads();
    const int lane = threadIdx.x & 31;
    const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;
    const ELEM_T* zr = z + row * hidden;
    float dot = 0.f;
    #pragma unroll 8
    for (int c = lane; c < hidden; c += 32) dot += tanhf(load_f(zr, c)) * w[c];
    const float y = warp_sum(dot) + b2[0];
    if (lane != 0) return;
    if (training) {
        const float diff = y - target[row];
        out[row] = grad_scale * diff;
        sq_err[row] = diff * diff;
    } else {
        out[row] = y;
    }
}

// Pass 2, one thread per column over a chunk of rows: dz = d w2 (1 - h^2), and the
// chunk's column sums of dz (db1) and d h (dW2). Coalesced along the row.
extern "C" __global__ void head_columns(const ELEM_T* z, ELEM_T* dz, const float* d, const float* w2,
                                        float* partials, int rows, int hidden, int rows_per_chunk) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= hidden) return;
    const int chunk = blockIdx.y;
    const float wc = w2[c];
    const long long first = (long long)chunk * rows_per_chunk;
    const long long last = min((long long)rows, first + rows_per_chunk);
    float sum_dz = 0.f, sum_dw = 0.f;
    #pragma unroll 8
    for (long long r = first; r < last; ++r) {
        const long long i = r * hidden + c;
        const float h = tanhf(load_f(z, i));
        const float dr = d[r];
        const float g = dr * wc * (1.f - h * h);
        store_f(dz, i, g);
        sum_dz += g;
        sum_dw += dr * h;
    }
    partials[(long long)chunk * 2 * hidden + c] = sum_dz;
    partials[(long long)chunk * 2 * hidden + hidden + c] = sum_dw;
}

// Pass 1 on batch-innermost z (z[c * rows + r]): a lane per row, the block's 32 warps each over every
// 32nd column, their dots added in a fixed order. Training only.
extern "C" __global__ void head_rows_t(const ELEM_T* z, const float* b1, const float* w2, const float* b2,
                                       const float* target, float* out, float* sq_err, int rows, int hidden,
                                       float grad_scale) {
    __shared__ float dots[32][33];
    const long long r = (long long)blockIdx.x * 32 + threadIdx.x;
    float dot = 0.f;
    if (r < rows) {
        #pragma unroll 4
        for (int c = threadIdx.y; c < hidden; c += 32)
            dot += tanhf(load_f(z, (long long)c * rows + r) + b1[c]) * w2[c];
    }
    dots[threadIdx.y][threadIdx.x] = dot;
    __syncthreads();
    if (threadIdx.y != 0 || r >= rows) return;
    float y = b2[0];
    for (int k = 0; k < 32; ++k) y += dots[k][threadIdx.x];
    const float diff = y - target[r];
    out[r] = grad_scale * diff;
    sq_err[r] = diff * diff;
}

// Pass 2 on batch-innermost z: a warp per column and chunk of rows, lanes along the rows. dz = d w2 (1 - h^2)
// over z, and the chunk's sums of dz (db1) and d h (dW2), each added across the warp in a fixed order.
extern "C" __global__ void head_columns_t(const ELEM_T* z, ELEM_T* dz, const float* d, const float* w2,
                                          float* partials, int rows, int hidden, int rows_per_chunk,
                                          const float* b1) {
    const int c = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (c >= hidden) return;
    const int lane = threadIdx.x & 31, chunk = blockIdx.y;
    const float wc = w2[c], bc = b1[c];
    const long long first = (long long)chunk * rows_per_chunk, base = (long long)c * rows;
    const long long last = min((long long)rows, first + rows_per_chunk);
    float sum_dz = 0.f, sum_dw = 0.f;
    #pragma unroll 4
    for (long long r = first + lane; r < last; r += 32) {
        const float h = tanhf(load_f(z, base + r) + bc);
        const float dr = d[r];
        const float g = dr * wc * (1.f - h * h);
        store_f(dz, base + r, g);
        sum_dz += g;
        sum_dw += dr * h;
    }
    sum_dz = warp_sum(sum_dz);
    sum_dw = warp_sum(sum_dw);
    if (lane != 0) return;
    partials[(long long)chunk * 2 * hidden + c] = sum_dz;
    partials[(long long)chunk * 2 * hidden + hidden + c] = sum_dw;
}

// Pass 3: add the chunks (32 row lanes per column, then shared memory) into db1 and
// dW2; the last block sums d (db2) and the squared errors (the batch loss).
extern "C" __global__ void head_reduce(const float* partials, const float* d, const float* sq_err, int chunks,
                                       int rows, int hidden, float* db1, float* dw2, float* db2, float loss_scale,
                                       const long long* step, long long steps_per_epoch, float* history,
                                       long long capacity, long long* diverged) {
    __shared__ float lanes[2][32][33];
    const int lane = threadIdx.y * 32 + threadIdx.x;   // blockDim = (32, 32): a warp per threadIdx.y
    if (blockIdx.x == gridDim.x - 1) {
        float a = 0.f, b = 0.f;
        for (int r = lane; r < rows; r += 1024) { a += d[r]; b += sq_err[r]; }
        a = warp_sum(a);
        b = warp_sum(b);
        if (threadIdx.x == 0) { lanes[0][threadIdx.y][0] = a; lanes[1][threadIdx.y][0] = b; }
        __syncthreads();
        if (lane == 0) {
            a = 0.f; b = 0.f;
            for (int y = 0; y < 32; ++y) { a += lanes[0][y][0]; b += lanes[1][y][0]; }
            db2[0] = a;
            book_loss_value(step, steps_per_epoch, history, capacity, diverged, b * loss_scale);
        }
        return;
    }
    const int width = 2 * hidden;
    const int c = blockIdx.x * 32 + threadIdx.x;
    float s = 0.f;
    if (c < width)
        for (int k = threadIdx.y; k < chunks; k += 32) s += partials[(long long)k * width + c];
    lanes[0][threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y != 0 || c >= width) return;
    for (int y = 1; y < 32; ++y) s += lanes[0][y][threadIdx.x];
    if (c < hidden) db1[c] = s;
    else dw2[c - hidden] = s;
}
"""
ROWS_PER_CHUNK = 32   # rows per pass-2 thread: enough threads in flight, few partial sums
ROWS_PER_WARP = 256   # batch-innermost pass 2: rows per warp, 8 a lane (8000 rows: 32 chunks, 32,000 warps)
_COLUMN_WARPS = 8     # batch-innermost pass 2: columns per block
_ROWS_PER_BLOCK = 8   # pass 1: warps (rows) per block, sharing one staged copy of w2
_COLUMN_THREADS = 128
MAX_HIDDEN = 8 * 1024   # w2 is staged in shared memory (32 KB of the 48 KB default)


def fits(hidden: int) -> bool:
    return 1 <= hidden <= MAX_HIDDEN


class TanhLinearMSEHead:
    """The fused tail of a dense regressor: z (B, H) -> loss, dz, dW2, db2 and db1; with `batch_innermost`, z and
    dz are the (B, H) views of (H, B) buffers, as the Dense below writes z then, without its bias b1."""

    name = "tanh_linear_mse_head"

    def __init__(self, dense_name: str, prev_dense_name: str, batch_innermost: bool = False):
        self.dense_name = dense_name            # the Dense(H -> 1) this head replaces
        self.prev_dense_name = prev_dense_name  # the Dense whose bias gradient it also produces
        self.batch_innermost = batch_innermost  # that Dense's word: z batch-innermost and without its bias

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
        # dz overwrites z: pass 2 reads each element (tanh) before the same thread writes it, pass 1 has
        # finished by then, and nothing after the head reads z (the output of the Dense before it).
        self.dz = z
        self.rows, self.hidden = rows, hidden
        layout = (z.itemsize, z.itemsize * rows) if self.batch_innermost else (z.itemsize * hidden, z.itemsize)
        if z.strides != layout:
            raise ValueError(f"fused head: z {z.shape} has strides {z.strides}; "
                             f"{'batch-innermost' if self.batch_innermost else 'row-major'} z has {layout}")
        self.b1 = p.master_view(f"{self.prev_dense_name}.bias") if self.batch_innermost else None   # added as read
        self._grad_scale = np.float32(2.0 / rows)
        self._loss_scale = np.float32(1.0 / rows)
        if self.backend.is_gpu:
            elem = ctype(z.dtype)
            if self.batch_innermost:
                self._rows = get_kernel(_SOURCE, "head_rows_t", ELEM_T=elem)
                self._columns = get_kernel(_SOURCE, "head_columns_t", ELEM_T=elem)
            else:
                self._rows = get_kernel(_SOURCE, "head_rows", ELEM_T=elem)
                self._columns = get_kernel(_SOURCE, "head_columns", ELEM_T=elem)
            self._reduce = get_kernel(_SOURCE, "head_reduce", ELEM_T=elem)
            self._chunk_rows = ROWS_PER_WARP if self.batch_innermost else ROWS_PER_CHUNK
            self.chunks = -(-rows // self._chunk_rows)
            self.d = ctx.allocator.zeros((rows,), np.float32, "workspace")
            self.sq_err = ctx.allocator.zeros((rows,), np.float32, "workspace")
            self.partials = ctx.allocator.zeros((self.chunks, 2 * hidden), np.float32, "workspace")
        return self.dz

    def forward_backward(self):
        if not self.backend.is_gpu:
            self._forward_backward_numpy()
            return
        rows, hidden = np.int32(self.rows), np.int32(self.hidden)
        columns_args = (self.z, self.dz, self.d, self.w2, self.partials, rows, hidden, np.int32(self._chunk_rows))
        if self.batch_innermost:
            self._rows((-(-self.rows // 32),), (32, 32), (self.z, self.b1, self.w2, self.b2, self.target, self.d,
                                                         self.sq_err, rows, hidden, self._grad_scale))
            self._columns((-(-self.hidden // _COLUMN_WARPS), self.chunks), (32 * _COLUMN_WARPS,),
                          columns_args + (self.b1,))
        else:
            self._rows((-(-self.rows // _ROWS_PER_BLOCK),), (32 * _ROWS_PER_BLOCK,),
                       (self.z, self.w2, self.b2, self.target, self.d, self.sq_err, rows, hidden, self._grad_scale,
                        np.int32(1)), shared_mem=4 * self.hidden)
            self._columns((-(-self.hidden // _COLUMN_THREADS), self.chunks), (_COLUMN_THREADS,), columns_args)
        self._reduce((-(-2 * self.hidden // 32) + 1,), (32, 32),
                     (self.partials, self.d, self.sq_err, np.int32(self.chunks), rows, hidden, self.grad_b1,
                      self.grad_w2, self.grad_b2, self._loss_scale) + self.state.kernel_args())

    def _forward_backward_numpy(self):
        h = np.tanh(widen(self.z) + (self.b1 if self.batch_innermost else 0.0))
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
    """Inference half of the head: y = tanh(z) . w2 + b2 (pass 1 alone)."""

    def __init__(self, backend, params, dense_name: str, z, y):
        rows, hidden = z.shape
        if y.shape != (rows, 1) or y.dtype != np.float32:
            raise ValueError(f"fused output: y must be float32 ({rows}, 1), got {y.dtype} {y.shape}")
        self.backend, self.z, self.y = backend, z, y
        self.w2 = params.master_view(f"{dense_name}.weight").reshape(hidden)
        self.b2 = params.master_view(f"{dense_name}.bias")
        self.rows, self.hidden = rows, hidden
        if backend.is_gpu:
            self._kernel = get_kernel(_SOURCE, "head_rows", ELEM_T=ctype(z.dtype))

    def run(self):
        if not self.backend.is_gpu:
            self.y[:, 0] = np.tanh(widen(self.z)) @ self.w2 + self.b2[0]
            return
        # In inference mode head_rows reads no target and writes no squared errors.
        self._kernel((-(-self.rows // _ROWS_PER_BLOCK),), (32 * _ROWS_PER_BLOCK,),
                     (self.z, self.w2, self.b2, self.b2, self.y, self.y, np.int32(self.rows), np.int32(self.hidden),
                      np.float32(0), np.int32(0)), shared_mem=4 * self.hidden)
