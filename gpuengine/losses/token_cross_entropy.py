"""Token cross-entropy: softmax over the vocabulary at every position, mean over the counted tokens.

Logits z (B, T, V), targets (B, T) token ids stored as float32. With N the
number of target tokens that are not the padding id (all B*T without one),
L = -(1/N) sum over counted tokens of log softmax(z)[target], and the gradient
is dL/dz = (softmax(z) - onehot(target)) / N on counted tokens, zero on padded
ones (torch's cross_entropy with ignore_index, reduction "mean"). N changes
from batch to batch, so on a GPU it is counted on the device first (one block,
a fixed order) and every later kernel reads 1/N there: a captured step stays
right for any batch. Rows are one warp each, as in cross_entropy.py; the
per-block loss sums are booked into the loss history by StepState.book_partials
(one warp, in order), scaled there by the device's 1/N.
"""
from __future__ import annotations

import numpy as np

from .. import checks
from ..data.checks import check_ids
from ..runtime.backend import widen
from ..runtime.kernels import ctype, get_kernel

_SOURCE = r"""
extern "C" __global__ void count_tokens(const float* t, int rows, int pad_id, float* inv_count) {
    float n = 0.f;
    for (int r = threadIdx.x; r < rows; r += blockDim.x) n += ((int)t[r] != pad_id) ? 1.f : 0.f;
    const float s = block_sum(warp_sum(n));
    if (threadIdx.x == 0) inv_count[0] = s > 0.f ? 1.f / s : 0.f;   // an all-padding batch contributes nothing
}
extern "C" __global__ void token_xent(const ELEM_T* z, const float* t, ELEM_T* dz, float* partials, int rows,
                                      int classes, int pad_id, const float* inv_count) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const float scale = inv_count[0];
    float loss = 0.f;
    for (long long row = (long long)blockIdx.x * warps + warp; row < rows; row += (long long)gridDim.x * warps) {
        const long long base = row * classes;
        const int target = (int)t[row];
        if (target == pad_id) {
            for (int k = lane; k < classes; k += 32) store_f(dz, base + k, 0.f);
            continue;
        }
        float m, log_sum;
        row_log_softmax(z, base, classes, lane, m, log_sum);
        for (int k = lane; k < classes; k += 32) {
            const float log_p = load_f(z, base + k) - m - log_sum;
            store_f(dz, base + k, scale * (expf(log_p) - (k == target ? 1.f : 0.f)));
            if (k == target) loss -= log_p;
        }
    }
    const float total = block_sum(warp_sum(loss));
    if (threadIdx.x == 0) partials[blockIdx.x] = total;
}
"""
_THREADS = 256
_COUNT_THREADS = 1024   # the count's one block: as many loads in flight as a block holds
_MAX_BLOCKS = 1024


class TokenCrossEntropy:
    """Mean cross-entropy of (B, T, V) logits against (B, T) float32 token ids; `pad_id` tokens ignored."""

    name = "token_cross_entropy"

    def __init__(self, pad_id: int | None = None):
        if pad_id is not None and not (checks.is_whole(pad_id) and pad_id >= 0):
            checks.refuse("pad_id", pad_id, "a token id (a whole number >= 0), or None for no padding")
        self.pad_id = None if pad_id is None else int(pad_id)

    def target_shape(self, output_shape: tuple) -> tuple:
        """Per-sample targets: one id per position of the (T, V) logits."""
        if len(output_shape) != 2:
            raise ValueError(f"token cross-entropy takes (positions, vocabulary) logits, got {tuple(output_shape)}")
        return tuple(output_shape[:1])

    def check_targets(self, t, output_shape: tuple):
        """Target ids index the logits' vocabulary: whole numbers in range, or the padding id."""
        check_ids(t, "targets", output_shape[-1], "token ids into the vocabulary of the logits", self.pad_id)

    def build(self, ctx, z, target, state):
        if z.ndim != 3 or target.shape != z.shape[:2]:
            raise ValueError(f"token cross-entropy: logits {z.shape} must be (batch, positions, vocabulary) and "
                             f"targets {target.shape} (batch, positions)")
        self.backend, self.z, self.target, self.state = ctx.backend, z, target, state
        self.rows, self.classes = z.shape[0] * z.shape[1], z.shape[2]
        self.dz = ctx.allocator.zeros(z.shape, z.dtype, "activations")
        self._pad = np.int32(-1 if self.pad_id is None else self.pad_id)
        if self.backend.is_gpu:
            self.blocks = min(-(-self.rows // (_THREADS // 32)), _MAX_BLOCKS)
            self.partials = ctx.allocator.zeros((self.blocks,), np.float32, "workspace")
            self.inv_count = ctx.allocator.zeros((1,), np.float32, "workspace")
            self._count = get_kernel(_SOURCE, "count_tokens", ELEM_T=ctype(z.dtype))
            self._rows_kernel = get_kernel(_SOURCE, "token_xent", ELEM_T=ctype(z.dtype))
        return self.dz

    def forward_backward(self):
        if not self.backend.is_gpu:
            self._forward_backward_numpy()
            return
        self._count((1,), (_COUNT_THREADS,), (self.target, np.int32(self.rows), self._pad, self.inv_count))
        self._rows_kernel((self.blocks,), (_THREADS,), (self.z, self.target, self.dz, self.partials,
                                                         np.int32(self.rows), np.int32(self.classes), self._pad,
                                                         self.inv_count))
        self.state.book_partials(self.partials, self.blocks, device_scale=self.inv_count)

    def _forward_backward_numpy(self):
        z = widen(self.z).reshape(self.rows, self.classes)
        ids = self.target.reshape(-1).astype(np.int64)
        counted = ids != int(self._pad)
        scale = 1.0 / counted.sum() if counted.any() else 0.0
        shifted = z - z.max(axis=1, keepdims=True)
        log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        grad = np.exp(log_p)
        rows = np.flatnonzero(counted)
        grad[rows, ids[rows]] -= 1.0
        grad[~counted] = 0.0
        self.dz.reshape(self.rows, self.classes)[...] = (scale * grad).astype(self.dz.dtype)
        loss = -float(log_p[rows, ids[rows]].sum()) * scale
        self.state.add_loss_host(int(self.state.step[0]), loss)
