"""Token embedding scaled by sqrt(d_model) (Vaswani et al. 2017, section 3.4), with its scatter-add gradient.

The network's input row holds token ids as numbers (the source and the shifted
target side by side, see data/formats/token_corpus.py); an embedding reads the `length`
ids starting at column `start` and writes (length, d_model) vectors
y[t] = sqrt(d) W[id_t]. Its weight gradient is a scatter-add,
dW[v] = sqrt(d) sum over tokens t with id_t = v of dy[t]: on a GPU one block per
vocabulary row lists the matching tokens and sums their gradients in token
order, so the result is the same every run (no atomics); the forward takes a
block a token. (A first version had every thread walk all tokens: 2.3 ms of
the 5.9 ms seq-384 step on an H100.) Ids are not differentiable: the
layer gives no input gradient (a graph that asks for one fails when built,
naming the node). Ids travel in the compute dtype; bf16 holds
every integer up to 256 exactly, so a larger vocabulary is refused under bf16.
"""
from __future__ import annotations

import math

import numpy as np

from .. import checks
from ..data.checks import check_ids
from ..runtime.backend import widen
from ..runtime.kernels import ctype, get_kernel
from ..runtime.params import ParamSpec
from .base import BuildContext, Layer
from .positional import device_table

_SOURCE = r"""
extern "C" __global__ void embed(const ID_T* ids, const ELEM_T* weight, const float* table, ELEM_T* out,
                                 int row_len, int start, int length, int dim, float scale, long long tokens) {
    // A block a token (batch row * length + position): its id read and placed once, its row copied by the threads.
    // With POSITIONS 1 the positional table's row is added, to the row rounded to ELEM_T as the unfused embedding
    // writes it, so the sum is the positional encoding's bits.
    for (long long token = blockIdx.x; token < tokens; token += gridDim.x) {
        const long long b = token / length;
        const int position = (int)(token - b * length);
        const int id = (int)load_f(ids, b * row_len + start + position);
        for (int c = threadIdx.x; c < dim; c += blockDim.x) {
            ELEM_T e;
            store_f(&e, 0, scale * load_f(weight, (long long)id * dim + c));
            const float y = POSITIONS ? load_f(&e, 0) + table[(long long)position * dim + c] : load_f(&e, 0);
            store_f(out, token * dim + c, y);
        }
    }
}
extern "C" __global__ void embed_grad(const ID_T* ids, const ELEM_T* dy, float* dweight, int row_len, int start,
                                      int length, int dim, float scale, long long tokens) {
    // One block per vocabulary row. It scans the ids a chunk of THREADS * GRAD_SPAN tokens at a time, each thread
    // a span of GRAD_SPAN neighbouring tokens (one division a span, its loads in flight together), lists the
    // chunk's matching tokens in token order (a scan of the threads' counts), and each thread adds their gradients
    // for its columns in that order: a fixed order, so the sum is the same every run (no atomics), and only the
    // matches are read.
    __shared__ int matches[THREADS * GRAD_SPAN];
    __shared__ int warp_counts[THREADS / 32];
    const int v = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float acc[COLS_PER_THREAD];
    for (int j = 0; j < COLS_PER_THREAD; ++j) acc[j] = 0.f;
    for (long long base = 0; base < tokens; base += THREADS * GRAD_SPAN) {
        const long long first = base + (long long)threadIdx.x * GRAD_SPAN;
        unsigned int hits = 0u;   // bit s: token first + s is a v
        if (first < tokens) {
            long long b = first / length;
            int position = (int)(first - b * length);
            #pragma unroll
            for (int s = 0; s < GRAD_SPAN; ++s) {
                if (first + s < tokens && (int)load_f(ids, b * row_len + start + position) == v) hits |= 1u << s;
                if (++position == length) { position = 0; ++b; }
            }
        }
        const int count = __popc(hits);
        int offset = count;   // the warp's inclusive scan of its threads' counts
        #pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int n = __shfl_up_sync(0xffffffffu, offset, o);
            if (lane >= o) offset += n;
        }
        if (lane == 31) warp_counts[warp] = offset;
        __syncthreads();
        int total = 0;
        offset -= count;
        for (int w = 0; w < THREADS / 32; ++w) {
            offset += w < warp ? warp_counts[w] : 0;
            total += warp_counts[w];
        }
        for (unsigned int h = hits; h; h &= h - 1u) matches[offset++] = threadIdx.x * GRAD_SPAN + __ffs(h) - 1;
        __syncthreads();
        for (int m0 = 0; m0 < total; m0 += MATCH_BATCH) {
            // MATCH_BATCH matches' loads in flight together, then added in token order: one at a time, each add
            // waited for its load before the next load issued
            float got[MATCH_BATCH][COLS_PER_THREAD];
            #pragma unroll
            for (int i = 0; i < MATCH_BATCH; ++i) {
                const long long row = m0 + i < total ? (base + matches[m0 + i]) * dim : 0;
                #pragma unroll
                for (int j = 0; j < COLS_PER_THREAD; ++j) {
                    const int c = threadIdx.x + j * THREADS;
                    got[i][j] = m0 + i < total && c < dim ? load_f(dy, row + c) : 0.f;
                }
            }
            #pragma unroll
            for (int i = 0; i < MATCH_BATCH; ++i)
                #pragma unroll
                for (int j = 0; j < COLS_PER_THREAD; ++j)
                    if (m0 + i < total) acc[j] += got[i][j];   // no + 0.f past the last: -0.f stays -0.f
        }
        __syncthreads();   // the next chunk rewrites matches and warp_counts
    }
    for (int j = 0; j < COLS_PER_THREAD; ++j) {
        const int c = threadIdx.x + j * THREADS;
        if (c < dim) dweight[(long long)v * dim + c] = scale * acc[j];
    }
}
"""
BF16_EXACT_IDS = 256   # bf16 has 8 significant bits: every integer up to 2^8 is exact
GRAD_THREADS = 256     # threads of a gradient block
GRAD_SPAN = 8          # neighbouring tokens a gradient thread checks in a chunk (at most 32: a bit each)
MATCH_BATCH = 8        # matching tokens whose gradient rows a thread loads before adding them
EMBED_THREADS = 128    # threads of a forward block: a token's row of d_model values
_MAX_EMBED_BLOCKS = 1 << 20   # the forward's grid; its loop covers more tokens


class TokenEmbedding(Layer):
    """Ids in columns [start, start + length) of each input row -> (length, d_model) scaled embeddings."""

    adds_positions = False   # set by a program: the positional encoding above is added here (positional.py)
    wiring = ("adds_positions",)

    def __init__(self, vocab: int, d_model: int, start: int, length: int, name: str = ""):
        self.vocab = checks.whole("TokenEmbedding vocab", vocab)
        self.d_model = checks.whole("TokenEmbedding d_model", d_model)
        self.start = checks.whole("TokenEmbedding start", start, 0)
        self.length = checks.whole("TokenEmbedding length", length)
        self.name = name
        self.scale = math.sqrt(d_model)

    def _row_len(self, input_shape) -> int:
        if len(input_shape) != 1 or input_shape[0] < self.start + self.length:
            raise ValueError(f"{self.name}: reads ids {self.start}..{self.start + self.length - 1} of a flat row, "
                             f"got per-sample shape {tuple(input_shape)}")
        return input_shape[0]

    def param_specs(self, input_shape):
        self._row_len(input_shape)
        return [ParamSpec(f"{self.name}.weight", (self.vocab, self.d_model), "glorot", self.vocab, self.d_model)]

    def output_shape(self, input_shape):
        self._row_len(input_shape)
        return (self.length, self.d_model)

    def check_data(self, x):
        """Ids outside the table would read past it on a GPU (and wrap around on NumPy): refused at entry."""
        end = self.start + self.length
        check_ids(x[:, self.start:end], "inputs", self.vocab, f"{self.name} reads columns {self.start}..{end - 1} "
                  "of each input row as token ids", offset=(0, self.start))

    def build_forward(self, ctx: BuildContext, x):
        if ctx.policy.compute_dtype.itemsize == 2 and self.vocab > BF16_EXACT_IDS + 1:
            raise ValueError(f"{self.name}: vocabulary {self.vocab} has ids bf16 cannot hold exactly "
                             f"(at most {BF16_EXACT_IDS + 1} ids under bf16)")
        self.backend, self.ids, self.row_len = ctx.backend, x, x.shape[1]
        self.weight = ctx.params.compute_view(f"{self.name}.weight")
        self.out = ctx.allocator.zeros((ctx.batch, self.length, self.d_model), ctx.policy.compute_dtype, "activations")
        self.table = None
        if self.adds_positions:
            self.table = device_table(ctx, (self.length, self.d_model), self.out.dtype)
        tokens = self.out.size // self.d_model
        table = self.weight if self.table is None else self.table   # unread without POSITIONS
        # a launch's grid, block and arguments, fixed with the buffers: a step only launches
        self._embed_launch = ((min(tokens, _MAX_EMBED_BLOCKS),), (EMBED_THREADS,),
                              (self.ids, self.weight, table, self.out) + self._args() + (np.int64(tokens),))
        if ctx.backend.is_gpu:
            self._embed = get_kernel(_SOURCE, "embed", **self.kernel_defines(x.dtype, self.out.dtype))
        return self.out

    def build_backward(self, ctx: BuildContext, dy, needs_input_grad: bool):
        self.dy, self.dweight = dy, ctx.params.grad_view(f"{self.name}.weight")
        self._grad_launch = ((self.vocab,), (GRAD_THREADS,),
                             (self.ids, dy, self.dweight) + self._args() + (np.int64(dy.size // self.d_model),))
        if ctx.backend.is_gpu:
            self._grad = get_kernel(_SOURCE, "embed_grad", **self.kernel_defines(self.ids.dtype, dy.dtype))
        return None

    def kernel_defines(self, id_dtype, elem_dtype) -> dict:
        """Both kernels compile from one source, so each needs every name the source uses."""
        return dict(ID_T=ctype(id_dtype), ELEM_T=ctype(elem_dtype), THREADS=GRAD_THREADS, GRAD_SPAN=GRAD_SPAN,
                    MATCH_BATCH=MATCH_BATCH, COLS_PER_THREAD=-(-self.d_model // GRAD_THREADS),
                    POSITIONS=int(self.adds_positions))

    def _token_ids(self) -> np.ndarray:
        return widen(self.ids[:, self.start:self.start + self.length]).astype(np.int64)

    def _args(self):
        return (np.int32(self.row_len), np.int32(self.start), np.int32(self.length), np.int32(self.d_model),
                np.float32(self.scale))

    def forward(self):
        if not self.backend.is_gpu:
            self.out[...] = (self.scale * widen(self.weight)[self._token_ids()]).astype(self.out.dtype)
            if self.table is not None:   # as the positional encoding adds it
                self.out[...] = (widen(self.out) + self.table).astype(self.out.dtype)
            return
        self._embed(*self._embed_launch)

    def backward(self):
        if not self.backend.is_gpu:
            grad = np.zeros(self.dweight.shape, self.dweight.dtype)
            np.add.at(grad, self._token_ids().ravel(), widen(self.dy).reshape(-1, self.d_model))
            self.dweight[...] = self.scale * grad
            return
        self._grad(*self._grad_launch)

    def forward_flops(self, input_shape):
        return 0   # a gather, no multiply-adds
