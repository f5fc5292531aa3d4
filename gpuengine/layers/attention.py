"""Multi-head attention (Vaswani et al. 2017, section 3.2.2) with torch's nn.MultiheadAttention parameters.

Self-attention (one input x of shape (T, d)) projects Q, K and V with one
GEMM into a (B*T, 3d) buffer, the three blocks of `in_proj_weight` (3d, d)
stacked as torch stacks them; cross-attention (inputs: the decoder's x (T, d)
and the encoder's memory (S, d)) projects Q from x and K, V from the memory
with the weight's first block and its last two. The heads are column blocks of
those buffers (ops/attention.py's Heads), so no transpose is ever made; the
attention core is the backend's strategy (`make_attention` below), and
`out_proj` maps the heads' concatenation back to d. All projections are
cuBLASLt GEMMs (ops/gemm.py), biases in the epilogue forward and their
gradients in the weight gradients' epilogues backward (bias_grad). The causal
mask belongs to the decoder's self-attention.
"""
from __future__ import annotations

from .. import checks
from ..ops.attention import Heads, NumpyAttention, attention_flops
from ..ops.gemm import Gemm, weight_gradients
from ..runtime.params import ParamSpec
from .base import BuildContext, Layer


def make_attention(ctx: BuildContext, q: Heads, k: Heads, v: Heads, out: Heads, causal: bool):
    """The backend's strategy: cuDNN's fused graphs on a GPU, the formula on NumPy."""
    if ctx.backend.is_gpu:
        from ..ops.cudnn_attention import FusedAttention   # imports the cuDNN frontend: GPU machines only
        return FusedAttention(ctx.backend, ctx.policy, ctx.allocator, q, k, v, out, causal, ctx.deterministic)
    return NumpyAttention(q, k, v, out, causal)


class _Projection:
    """out = x @ W[rows]^T + b[rows] (a block of the stacked in-projection) and its backward."""

    def __init__(self, ctx: BuildContext, x, out, names: tuple[str, str], rows: slice = slice(None)):
        self.ctx, self.x, self.out, self.names, self.rows = ctx, x, out, names, rows
        weight, bias = (ctx.params.compute_view(n)[rows] for n in names)
        self.weight = weight
        self.forward = Gemm(ctx.backend, ctx.policy, out, x, weight.T, bias, ctx.allocator)

    def build_backward(self, d_out, needs_input_grad: bool, bias: bool = True):
        """bias False: the bias gradient is summed elsewhere (a LayerNorm above, model/passes.py)."""
        ctx = self.ctx
        # Gradient views are taken here, not in __init__: inference-only parameters have none.
        weight_name, bias_name = self.names
        grad_w = ctx.params.grad_view(weight_name)[self.rows]
        grad_b = ctx.params.grad_view(bias_name)[self.rows] if bias else None
        self._gw, self._gb = weight_gradients(ctx.backend, ctx.policy, ctx.allocator, grad_w, grad_b, d_out,
                                              self.x, ctx.bias_grad_in_epilogue(token_major=True), ctx.sums)
        self.dx = self._gx = None
        if needs_input_grad:
            self.dx = ctx.allocator.zeros(self.x.shape, ctx.policy.compute_dtype, "activations")
            self._gx = Gemm(ctx.backend, ctx.policy, self.dx, d_out, self.weight, allocator=ctx.allocator)
        return self.dx

    def backward(self):
        self._gw.run()
        if self._gb is not None:
            self._gb.run()
        if self._gx is not None:
            self._gx.run()

    def gemms(self):
        return [g for g in (self.forward, getattr(self, "_gw", None), getattr(self, "_gx", None)) if g is not None]


class MultiHeadAttention(Layer):
    """Self-attention (arity 1) or cross-attention (arity 2: queries' input, then memory); causal optional."""

    bias_grad_by_reader = False   # set by a program whose LayerNorm above sums the output projection's bias gradient
    wiring = ("bias_grad_by_reader",)

    def __init__(self, heads: int, causal: bool = False, cross: bool = False, name: str = ""):
        heads = checks.whole("MultiHeadAttention heads", heads)
        causal, cross = checks.flag("MultiHeadAttention causal", causal), checks.flag("MultiHeadAttention cross", cross)
        if causal and cross:
            raise ValueError("a causal mask belongs to self-attention; cross-attention sees the whole memory")
        self.heads, self.causal, self.cross, self.name = heads, causal, cross, name
        self.arity = 2 if cross else 1

    def output_bias(self) -> str:
        """The parameter added last, whose gradient is the output gradient's column sum."""
        return f"{self.name}.out_proj.bias"

    def _d_model(self, *shapes) -> int:
        d = shapes[0][-1]
        if any(len(s) != 2 or s[-1] != d for s in shapes):
            raise ValueError(f"{self.name}: attention takes (positions, d_model) inputs of one d_model, got "
                             f"{', '.join(str(tuple(s)) for s in shapes)}")
        if d % self.heads:
            raise ValueError(f"{self.name}: d_model {d} is not a multiple of {self.heads} heads")
        return d

    def param_specs(self, *shapes):
        d = self._d_model(*shapes)
        # torch draws in_proj_weight with xavier_uniform_ over the stacked (3d, d) matrix: fan_out 3d.
        return [ParamSpec(f"{self.name}.in_proj_weight", (3 * d, d), "glorot", d, 3 * d),
                ParamSpec(f"{self.name}.in_proj_bias", (3 * d,), "zeros"),
                ParamSpec(f"{self.name}.out_proj.weight", (d, d), "glorot", d, d),
                ParamSpec(f"{self.name}.out_proj.bias", (d,), "zeros")]

    def output_shape(self, *shapes):
        self._d_model(*shapes)
        return tuple(shapes[0])

    def forward_flops(self, *shapes):
        d = self._d_model(*shapes)
        queries, keys = shapes[0][0], shapes[-1][0]
        projections = 2 * queries * d * d * 2 + 2 * keys * d * 2 * d   # Q and out; K and V
        return projections + attention_flops(queries, keys, self.heads, d // self.heads, self.causal)

    def build_forward(self, ctx: BuildContext, x, memory=None):
        batch, queries, d = x.shape
        memory = x if memory is None else memory
        keys, d_head = memory.shape[1], d // self.heads
        self.ctx, self.x2, self.m2 = ctx, x.reshape(-1, d), memory.reshape(-1, d)
        in_proj = (f"{self.name}.in_proj_weight", f"{self.name}.in_proj_bias")
        dtype = ctx.policy.compute_dtype
        if self.cross:
            self.q_buf = ctx.allocator.zeros((batch * queries, d), dtype, "activations")
            self.kv_buf = ctx.allocator.zeros((batch * keys, 2 * d), dtype, "activations")
            self._projections = [_Projection(ctx, self.x2, self.q_buf, in_proj, slice(None, d)),
                                 _Projection(ctx, self.m2, self.kv_buf, in_proj, slice(d, None))]
            q = Heads(self.q_buf, 0, batch, queries, self.heads, d_head)
            k, v = (Heads(self.kv_buf, c, batch, keys, self.heads, d_head) for c in (0, d))
        else:
            self.qkv_buf = ctx.allocator.zeros((batch * queries, 3 * d), dtype, "activations")
            self._projections = [_Projection(ctx, self.x2, self.qkv_buf, in_proj)]
            q, k, v = (Heads(self.qkv_buf, c, batch, queries, self.heads, d_head) for c in (0, d, 2 * d))
        self.q, self.k, self.v = q, k, v
        self.context = ctx.allocator.zeros((batch * queries, d), dtype, "activations")
        self.heads_out = Heads(self.context, 0, batch, queries, self.heads, d_head)
        self._core = make_attention(ctx, q, k, v, self.heads_out, self.causal)
        self.out = ctx.allocator.zeros(x.shape, dtype, "activations")
        self._out_proj = _Projection(ctx, self.context, self.out.reshape(-1, d),
                                     (f"{self.name}.out_proj.weight", f"{self.name}.out_proj.bias"))
        return self.out

    def build_backward(self, ctx: BuildContext, dy, needs_input_grad):
        needs = (needs_input_grad,) if not self.cross else tuple(needs_input_grad)
        d = self.x2.shape[1]
        d_context = self._out_proj.build_backward(dy.reshape(-1, d), True, bias=not self.bias_grad_by_reader)
        d_heads_out = self.heads_out.like(d_context)
        dtype = ctx.policy.compute_dtype
        if self.cross:
            dq_buf = ctx.allocator.zeros(self.q_buf.shape, dtype, "activations")
            dkv_buf = ctx.allocator.zeros(self.kv_buf.shape, dtype, "activations")
            self._core.build_backward(d_heads_out, self.q.like(dq_buf), self.k.like(dkv_buf), self.v.like(dkv_buf))
            dx = self._projections[0].build_backward(dq_buf, needs[0])
            dm = self._projections[1].build_backward(dkv_buf, needs[1])
            return (None if dx is None else dx.reshape(dy.shape),
                    None if dm is None else dm.reshape(dy.shape[0], -1, d))
        dqkv_buf = ctx.allocator.zeros(self.qkv_buf.shape, dtype, "activations")
        self._core.build_backward(d_heads_out, *(h.like(dqkv_buf) for h in (self.q, self.k, self.v)))
        dx = self._projections[0].build_backward(dqkv_buf, needs[0])
        return None if dx is None else dx.reshape(dy.shape)

    def forward(self):
        for projection in self._projections:
            projection.forward.run()
        self._core.forward()
        self._out_proj.forward.run()

    def backward(self):
        self._out_proj.backward()
        self._core.backward()
        for projection in self._projections:
            projection.backward()

    def release(self):
        for projection in self._projections + [self._out_proj]:
            for gemm in projection.gemms():
                gemm.free()
