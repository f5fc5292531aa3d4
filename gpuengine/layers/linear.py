"""Position-wise linear layer: y = x W^T + b on the last axis of (..., in) samples (torch's nn.Linear).

The Transformer's feed-forward layers and its projection to the vocabulary act
on every position alike (Vaswani et al. 2017, section 3.3), so a batch of
(T, in) samples is one (B*T, in) matrix: one cuBLASLt GEMM with the bias in its
epilogue forward, two GEMMs backward with the bias gradient in the weight
gradient's epilogue (bias_grad auto or epilogue) or as a column sum (sum), as in
dense.py (which takes flat samples only). Under a post-LN LayerNorm that sums
this layer's output into the residual, that LayerNorm's backward sums the bias
gradient instead (layernorm.py), and the weight gradient runs without it.
"""
from __future__ import annotations

import numpy as np

from .. import checks
from ..ops.gemm import Gemm, weight_gradients
from ..runtime.params import ParamSpec
from .base import BuildContext, Layer


class Linear(Layer):
    relu_epilogue = False   # set by a program whose ReLU after this layer runs in the GEMM's epilogue
    bias_grad_by_reader = False   # set by a program whose LayerNorm above sums this layer's bias gradient
    wiring = ("relu_epilogue", "bias_grad_by_reader")

    def __init__(self, units: int, name: str = ""):
        self.units, self.name = checks.whole("Linear units", units), name

    def param_specs(self, input_shape):
        fan_in = input_shape[-1]
        return [ParamSpec(f"{self.name}.weight", (self.units, fan_in), "glorot", fan_in, self.units),
                ParamSpec(f"{self.name}.bias", (self.units,), "zeros")]

    def output_bias(self) -> str:
        """The parameter added last, whose gradient is the output gradient's column sum."""
        return f"{self.name}.bias"

    def output_shape(self, input_shape):
        if len(input_shape) < 1:
            raise ValueError(f"{self.name}: Linear needs samples with a feature axis")
        return tuple(input_shape[:-1]) + (self.units,)

    def forward_flops(self, input_shape):
        return 2 * int(np.prod(input_shape)) * self.units

    def build_forward(self, ctx: BuildContext, x):
        self.x = x.reshape(-1, x.shape[-1])
        self.weight = ctx.params.compute_view(f"{self.name}.weight")
        self.out = ctx.allocator.zeros(x.shape[:-1] + (self.units,), ctx.policy.compute_dtype, "activations")
        self._forward = Gemm(ctx.backend, ctx.policy, self.out.reshape(-1, self.units), self.x, self.weight.T,
                             ctx.params.compute_view(f"{self.name}.bias"), ctx.allocator, relu=self.relu_epilogue)
        self._grad_w = self._grad_b = self._grad_x = None
        self._input_shape = x.shape
        return self.out

    def build_backward(self, ctx: BuildContext, dy, needs_input_grad: bool):
        dy = dy.reshape(-1, self.units)
        grad_b = None if self.bias_grad_by_reader else ctx.params.grad_view(self.output_bias())
        self._grad_w, self._grad_b = weight_gradients(
            ctx.backend, ctx.policy, ctx.allocator, ctx.params.grad_view(f"{self.name}.weight"), grad_b, dy, self.x,
            ctx.bias_grad_in_epilogue(token_major=True), ctx.sums)
        if not needs_input_grad:
            return None
        dx = ctx.allocator.zeros(self._input_shape, ctx.policy.compute_dtype, "activations")
        self._grad_x = Gemm(ctx.backend, ctx.policy, dx.reshape(self.x.shape), dy, self.weight,
                            allocator=ctx.allocator)
        return dx

    def forward(self):
        self._forward.run()

    def backward(self):
        self._grad_w.run()
        if self._grad_b is not None:
            self._grad_b.run()
        if self._grad_x is not None:
            self._grad_x.run()

    def release(self):
        for gemm in (self._forward, self._grad_w, self._grad_x):
            if gemm is not None:
                gemm.free()
