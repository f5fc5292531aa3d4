"""cuDNN frontend's fused attention (flash attention) graphs, forward and backward, with the casts around them.

cuDNN's SDPA engines take bf16 or fp16 only. Under bf16 they run on the layer's
own buffers. Under fp32 and tf32 they run seed note 004's way: Q, K, V are cast
down to bf16 twins, the bf16 forward graph runs, O is cast up; backward casts
dO down, runs the bf16 backward graph on the forward's twins of Q, K, V, O and
its softmax statistics, and casts dQ, dK, dV up. Both graphs are keyed by one
helper on the graph's own dtype (bf16), never the layer's: the note's
fp32 backward looked up its graph under fp32 while the forward had stored it
under bf16, and never found it. cuDNN docs, "Scaled Dot Product Attention",
and the frontend's samples/python (sdpa, sdpa backward). The causal mask is a
top-left diagonal band with right bound 0; the backward graph is asked for its
deterministic algorithm, so a replayed step computes what the eager one did.
"""
from __future__ import annotations

import numpy as np

from ..runtime.backend import bfloat16_dtype
from ..runtime.kernels import ctype, get_kernel, packed_launch
from .attention import Heads, attention_scale
from .cudnn import BoundGraph, TensorSpec, runtime_for

GRAPH_PRECISION = "bf16"   # the fused engines' I/O dtype: the key of both graphs, in every precision mode

_CAST_SOURCE = r"""
// VEC values a thread: one vector load, one vector store.
extern "C" __global__ void cast(const SRC_T* src, DST_T* dst, long long packs) {
    for (long long n = blockIdx.x * (long long)blockDim.x + threadIdx.x; n < packs;
         n += (long long)gridDim.x * blockDim.x) {
        const Pack<SRC_T, VEC> a = load_pack<SRC_T, VEC>(src, n * VEC);
        Pack<DST_T, VEC> b;
        #pragma unroll
        for (int k = 0; k < VEC; ++k) store_f(b.v, k, load_f(a.v, k));
        store_pack(dst, n * VEC, b);
    }
}
"""


class Cast:
    """dst = src converted element-wise (float32 <-> bf16), whole buffers of one shape."""

    def __init__(self, src, dst):
        if src.shape != dst.shape:
            raise ValueError(f"cast of {src.shape} into {dst.shape}")
        self.src, self.dst = src, dst
        width, self._grid, self._block, self._packs = packed_launch(src.size, src, dst)
        self._kernel = get_kernel(_CAST_SOURCE, "cast", SRC_T=ctype(src.dtype), DST_T=ctype(dst.dtype), VEC=width)

    def run(self):
        self._kernel(self._grid, self._block, (self.src, self.dst, self._packs))


def _spec(heads: Heads) -> TensorSpec:
    return TensorSpec(heads.dims, heads.strides, heads.buffer.dtype.name)


def _stats_spec(q: Heads) -> TensorSpec:
    b, h, s, _ = q.dims
    return TensorSpec((b, h, s, 1), (h * s, s, 1, 1), "float32")


def attention_graph_key(op: str, causal: bool, scale: float, **tensors: TensorSpec) -> tuple:
    """One key shape for forward and backward, always on the graph's dtype (the note's cache-key fix)."""
    return (op, GRAPH_PRECISION, ("causal", causal), ("scale", scale)) + tuple(sorted(tensors.items()))


def _mask(causal: bool) -> dict:
    return {"diagonal_band_right_bound": 0} if causal else {}


def sdpa_forward(runtime, q: Heads, k: Heads, v: Heads, out: Heads, stats, causal: bool, allocator=None):
    """O and the softmax statistics (B, H, S_q, 1, float32) of bf16 Q, K, V, as one bound graph."""
    scale = attention_scale(q.d_head)
    specs = {"q": _spec(q), "k": _spec(k), "v": _spec(v), "o": _spec(out), "stats": _stats_spec(q)}

    def define(g):
        t = {name: specs[name].make(g, name) for name in ("q", "k", "v")}
        o, lse = g.sdpa(name="sdpa", q=t["q"], k=t["k"], v=t["v"], attn_scale=scale, generate_stats=True,
                        **_mask(causal))
        specs["o"].mark_output(o)
        specs["stats"].mark_output(lse)
        return t | {"o": o, "stats": lse}

    graph = runtime.graph(attention_graph_key("sdpa_fwd", causal, scale, **specs), bfloat16_dtype(),
                          GRAPH_PRECISION, define)
    buffers = {"q": q.block, "k": k.block, "v": v.block, "o": out.block, "stats": stats}
    return BoundGraph(runtime, graph, buffers, allocator)


def sdpa_backward(runtime, q: Heads, k: Heads, v: Heads, out: Heads, stats, d_out: Heads, dq: Heads, dk: Heads,
                  dv: Heads, causal: bool, allocator=None):
    """dQ, dK, dV (bf16) from the forward's bf16 Q, K, V, O, its statistics and dO, as one bound graph."""
    scale = attention_scale(q.d_head)
    specs = {"q": _spec(q), "k": _spec(k), "v": _spec(v), "o": _spec(out), "stats": _stats_spec(q),
             "d_o": _spec(d_out), "dq": _spec(dq), "dk": _spec(dk), "dv": _spec(dv)}

    def define(g):
        t = {name: specs[name].make(g, name) for name in ("q", "k", "v", "o", "stats", "d_o")}
        grads = g.sdpa_backward(name="sdpa_bwd", q=t["q"], k=t["k"], v=t["v"], o=t["o"], dO=t["d_o"],
                                stats=t["stats"], attn_scale=scale,
                                use_deterministic_algorithm=runtime.deterministic, **_mask(causal))
        for name, tensor in zip(("dq", "dk", "dv"), grads):
            specs[name].mark_output(tensor)
        return t | dict(zip(("dq", "dk", "dv"), grads))

    graph = runtime.graph(attention_graph_key("sdpa_bwd", causal, scale, **specs), bfloat16_dtype(),
                          GRAPH_PRECISION, define)
    buffers = {"q": q.block, "k": k.block, "v": v.block, "o": out.block, "stats": stats, "d_o": d_out.block,
               "dq": dq.block, "dk": dk.block, "dv": dv.block}
    return BoundGraph(runtime, graph, buffers, allocator)


class _Bf16Twins:
    """A bf16 twin of each distinct float32 buffer behind some heads (Q, K, V share one under self-attention)."""

    def __init__(self, allocator, heads: list[Heads], category: str):
        self.twins: dict[int, object] = {}
        self.pairs = []
        for h in heads:
            if id(h.buffer) not in self.twins:
                twin = allocator.zeros(h.buffer.shape, bfloat16_dtype(), category)
                self.twins[id(h.buffer)] = twin
                self.pairs.append((h.buffer, twin))

    def of(self, heads: Heads) -> Heads:
        return heads.like(self.twins[id(heads.buffer)])


class FusedAttention:
    """The GPU attention strategy: fused cuDNN graphs, natively under bf16, between casts under fp32/tf32."""

    def __init__(self, backend, policy, allocator, q: Heads, k: Heads, v: Heads, out: Heads, causal: bool,
                 deterministic: bool = True):
        self.runtime, self.allocator, self.causal = runtime_for(backend, deterministic), allocator, causal
        self.native = policy.compute_dtype == bfloat16_dtype()
        if self.native:
            self.q, self.k, self.v, self.out = q, k, v, out
            self._down, self._up = [], []
        else:
            inputs = _Bf16Twins(allocator, [q, k, v], "activations")
            outputs = _Bf16Twins(allocator, [out], "activations")
            self.q, self.k, self.v, self.out = inputs.of(q), inputs.of(k), inputs.of(v), outputs.of(out)
            self._down = [Cast(src, twin) for src, twin in inputs.pairs]
            self._up = [Cast(twin, dst) for dst, twin in outputs.pairs]
        b, h, s, _ = q.dims
        self.stats = allocator.zeros((b, h, s, 1), np.float32, "activations")
        self._forward = sdpa_forward(self.runtime, self.q, self.k, self.v, self.out, self.stats, causal, allocator)

    def build_backward(self, d_out: Heads, dq: Heads, dk: Heads, dv: Heads):
        if self.native:
            self._grad_down, self._grad_up = [], []
            twins = (d_out, dq, dk, dv)
        else:
            down = _Bf16Twins(self.allocator, [d_out], "activations")
            up = _Bf16Twins(self.allocator, [dq, dk, dv], "activations")
            twins = (down.of(d_out), up.of(dq), up.of(dk), up.of(dv))
            self._grad_down = [Cast(src, twin) for src, twin in down.pairs]
            self._grad_up = [Cast(twin, dst) for dst, twin in up.pairs]
        self._backward = sdpa_backward(self.runtime, self.q, self.k, self.v, self.out, self.stats, *twins,
                                       self.causal, self.allocator)

    def forward(self):
        for cast in self._down:
            cast.run()
        self._forward.run()
        for cast in self._up:
            cast.run()

    def backward(self):
        for cast in self._grad_down:
            cast.run()
        self._backward.run()
        for cast in self._grad_up:
            cast.run()
