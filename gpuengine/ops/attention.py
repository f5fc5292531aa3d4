"""The attention core, softmax(Q K^T / sqrt(d_head) [+ causal mask]) V: its layout and the NumPy strategy.

Vaswani et al. 2017, section 3.2.1. Q, K, V and the output are `Heads`: a
(batch, heads, positions, d_head) tensor stored in a block of columns of a
row-major (batch * positions, width) buffer, the layout the projections' GEMMs
write (several heads side by side in one row; self-attention's Q, K and V in
one (B*T, 3d) buffer). The NumPy strategy below computes the formula directly
(CI checks every layer with it); on a GPU `cudnn_attention.FusedAttention` runs
cuDNN's fused flash-attention graphs (the layer picks one: layers/attention.py). Backward, with P the softmax:
dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(dP * P)), dQ = s dS K, dK = s dS^T Q.
The causal mask lets query position i see key positions j <= i (decoder
self-attention); encoder and cross-attention use none.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..runtime.backend import widen


@dataclass(frozen=True)
class Heads:
    """Columns [column, column + heads * d_head) of `buffer` (batch * positions, width) as (B, H, S, d_head)."""

    buffer: object
    column: int
    batch: int
    positions: int
    heads: int
    d_head: int

    def __post_init__(self):
        rows, width = self.buffer.shape
        if rows != self.batch * self.positions or self.column + self.heads * self.d_head > width:
            raise ValueError(f"heads ({self.batch}, {self.heads}, {self.positions}, {self.d_head}) at column "
                             f"{self.column} do not fit a buffer of shape {self.buffer.shape}")

    @property
    def block(self):
        """The (batch * positions, heads * d_head) view of the buffer these heads live in."""
        return self.buffer[:, self.column:self.column + self.heads * self.d_head]

    @property
    def dims(self) -> tuple:
        return (self.batch, self.heads, self.positions, self.d_head)

    @property
    def strides(self) -> tuple:
        """Element strides of (B, H, S, d_head) in the buffer."""
        width = self.buffer.shape[1]
        return (self.positions * width, self.d_head, width, 1)

    def like(self, buffer) -> "Heads":
        """The same heads in another buffer of the same layout (a cast copy, a gradient)."""
        return Heads(buffer, self.column, self.batch, self.positions, self.heads, self.d_head)

    def read(self) -> np.ndarray:
        """NumPy: a (B, H, S, d_head) copy in float32 (float64 stays float64)."""
        return widen(self.block).reshape(self.batch, self.positions, self.heads, self.d_head).transpose(0, 2, 1, 3)

    def write(self, value: np.ndarray):
        """NumPy: store a (B, H, S, d_head) array into the heads' columns."""
        rows = value.transpose(0, 2, 1, 3).reshape(self.batch * self.positions, self.heads * self.d_head)
        self.block[...] = rows.astype(self.buffer.dtype)


def attention_scale(d_head: int) -> float:
    return 1.0 / float(np.sqrt(d_head))


def causal_mask(queries: int, keys: int) -> np.ndarray:
    """True where query i may not see key j (j > i)."""
    return np.triu(np.ones((queries, keys), bool), k=1)


class NumpyAttention:
    """The formula in NumPy, keeping the softmax for backward."""

    def __init__(self, q: Heads, k: Heads, v: Heads, out: Heads, causal: bool):
        self.q, self.k, self.v, self.out, self.causal = q, k, v, out, causal
        self.scale = attention_scale(q.d_head)

    def build_backward(self, d_out: Heads, dq: Heads, dk: Heads, dv: Heads):
        self.d_out, self.dq, self.dk, self.dv = d_out, dq, dk, dv

    def forward(self):
        scores = self.scale * np.einsum("bhqd,bhkd->bhqk", self.q.read(), self.k.read())
        if self.causal:
            scores = np.where(causal_mask(scores.shape[2], scores.shape[3]), -np.inf, scores)
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        self.p = scores / scores.sum(axis=-1, keepdims=True)
        self.out.write(np.einsum("bhqk,bhkd->bhqd", self.p, self.v.read()))

    def backward(self):
        d_out, p = self.d_out.read(), self.p
        self.dv.write(np.einsum("bhqk,bhqd->bhkd", p, d_out))
        dp = np.einsum("bhqd,bhkd->bhqk", d_out, self.v.read())
        ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
        self.dq.write(self.scale * np.einsum("bhqk,bhkd->bhqd", ds, self.k.read()))
        self.dk.write(self.scale * np.einsum("bhqk,bhqd->bhkd", ds, self.q.read()))


def attention_flops(queries: int, keys: int, heads: int, d_head: int, causal: bool) -> int:
    """Forward multiply-adds x2 per sample of Q K^T and P V (a causal mask halves the useful work)."""
    flops = 2 * 2 * queries * keys * heads * d_head
    return flops // 2 if causal else flops
