"""Dense (fully connected) layer: y = x W^T + b, torch's (out, in) weight layout.

Forward is one cuBLASLt GEMM with the bias added in its epilogue. Backward is
two GEMMs (dW = dy^T x, dx = dy W; dx only where the layer below needs it) and
db as a column sum (bias_grad auto or sum), or in the dW GEMM's epilogue
(bias_grad=epilogue, slower on the CNN's head in bf16), unless a
fused consumer already produced db (see `fused_head.py`), in which case
`bias_grad_fused` skips it. With `batch_innermost` (a TF32 program sets it
on a Dense over the batch that feeds the fused head) the layer writes its
output batch-innermost, (units, batch), without its bias (the head adds it:
cuBLASLt's bias epilogue runs along the batch in that layout), the head
writes dy so over it, and x comes batch-innermost too, from the gather's
pass where the data offers it (data/gather.py) or copied as the forward pass
begins: dW's GEMM then reads both operands K-major (ops/transpose.py says
why). Where a second x would not leave the device room for the rest of the
set-up (the largest batches: runtime/memory.py's `fits`), dW reads x as it
is.
"""
from __future__ import annotations

from .. import checks
from ..ops.gemm import Gemm, weight_gradients
from ..ops.transpose import Transpose
from ..runtime.params import ParamSpec
from .base import BuildContext, Layer


class Dense(Layer):
    bias_grad_fused = False   # set by a fusion that computes db itself
    relu_epilogue = False     # set by a program whose ReLU after this layer runs in the GEMM's epilogue
    batch_innermost = False   # set by a program that hands this layer a batch-innermost dy and no dx to make
    wiring = ("bias_grad_fused", "relu_epilogue", "batch_innermost")

    def __init__(self, units: int, name: str = ""):
        self.units = checks.whole("Dense units", units)
        self.name = name

    def _in_features(self, input_shape):
        if len(input_shape) != 1:
            raise ValueError(f"{self.name}: Dense takes flat (features,) samples, got per-sample shape {input_shape}")
        return input_shape[0]

    def param_specs(self, input_shape):
        fan_in = self._in_features(input_shape)
        return [ParamSpec(f"{self.name}.weight", (self.units, fan_in), "glorot", fan_in, self.units),
                ParamSpec(f"{self.name}.bias", (self.units,), "zeros")]

    def output_shape(self, input_shape):
        self._in_features(input_shape)
        return (self.units,)

    def forward_flops(self, input_shape):
        return 2 * self._in_features(input_shape) * self.units

    def build_forward(self, ctx: BuildContext, x):
        self.x = x
        self.weight = ctx.params.compute_view(f"{self.name}.weight")
        if self.batch_innermost:
            if self.relu_epilogue:
                raise ValueError(f"{self.name}: batch_innermost output leaves its bias to the fused head; no ReLU here")
            # (units, batch) = W x^T: cuBLASLt's bias epilogue would run along the batch, so the head adds b
            out_t = ctx.allocator.zeros((self.units, ctx.batch), ctx.policy.compute_dtype, "activations")
            self.out = out_t.T
            self._forward = Gemm(ctx.backend, ctx.policy, out_t, self.weight, x.T, allocator=ctx.allocator)
        else:
            self.out = ctx.allocator.zeros((ctx.batch, self.units), ctx.policy.compute_dtype, "activations")
            self._forward = Gemm(ctx.backend, ctx.policy, self.out, x, self.weight.T,
                                 ctx.params.compute_view(f"{self.name}.bias"), ctx.allocator, relu=self.relu_epilogue)
        self._grad_w = self._grad_b = self._grad_x = self._x_copy = None   # inference builds no backward
        return self.out

    def build_backward(self, ctx: BuildContext, dy, needs_input_grad: bool):
        grad_w = ctx.params.grad_view(f"{self.name}.weight")
        grad_b = None if self.bias_grad_fused else ctx.params.grad_view(f"{self.name}.bias")
        x = self.x
        if self.batch_innermost:
            if needs_input_grad or dy.strides[0] != dy.itemsize:
                raise ValueError(f"{self.name}: batch_innermost takes a batch-innermost dy and makes no dx; got dy "
                                 f"strides {dy.strides}, needs_input_grad={needs_input_grad}")
            # the program sets batch_innermost on a Dense over the batch itself: its gather may write x so too
            x_t = ctx.batch_innermost_input() if ctx.batch_innermost_input is not None else None
            if x_t is None and ctx.allocator.fits(self.x.nbytes):   # copied here, as the forward pass begins
                x_t = ctx.allocator.zeros(self.x.shape[::-1], self.x.dtype, "activations")
                self._x_copy = Transpose(ctx.backend, self.x, x_t)
            if x_t is not None:   # else no room for a second x: dW reads x as it is, one operand K-major
                x = x_t.T
        self._grad_w, self._grad_b = weight_gradients(ctx.backend, ctx.policy, ctx.allocator, grad_w, grad_b, dy,
                                                      x, ctx.bias_grad_in_epilogue(token_major=False), ctx.sums)
        if needs_input_grad:
            dx = ctx.allocator.zeros(self.x.shape, ctx.policy.compute_dtype, "activations")
            self._grad_x = Gemm(ctx.backend, ctx.policy, dx, dy, self.weight, allocator=ctx.allocator)
            return dx
        return None

    def forward(self):
        if self._x_copy is not None:
            self._x_copy.run()
        self._forward.run()

    def release(self):
        for gemm in (self._forward, self._grad_w, self._grad_x):
            if gemm is not None:
                gemm.free()

    def backward(self):
        self._grad_w.run()
        if self._grad_b is not None:
            self._grad_b.run()
        if self._grad_x is not None:
            self._grad_x.run()
