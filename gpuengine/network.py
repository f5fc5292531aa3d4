"""A network: a sequence of layers and a loss, built into static training and
inference programs for one batch size.

`Sequential` only describes the network (layers, loss, per-sample input shape).
`build_training` wires it onto buffers: forward chain, loss (or a fused head
where `fused_head.py`'s pattern applies), backward chain; `build_inference`
wires the forward chain alone. Both allocate everything up front.
"""
from __future__ import annotations

import copy

import numpy as np

from .layers.activations import Activation
from .layers.base import BuildContext, Layer
from .layers.dense import Dense
from .layers.fused_head import TanhLinearMSEHead, TanhLinearOutput, fits
from .layers.losses import MSELoss
from .params import ParamSpec


class Sequential:
    def __init__(self, layers: list[Layer], loss, input_shape: tuple):
        if not layers:
            raise ValueError("a network needs at least one layer")
        self.layers, self.loss, self.input_shape = list(layers), loss, tuple(input_shape)
        counts: dict[str, int] = {}
        for layer in self.layers:
            if not layer.name:
                prefix = type(layer).__name__.lower()
                counts[prefix] = counts.get(prefix, 0) + 1
                layer.name = f"{prefix}{counts[prefix]}"
        self.shapes = [self.input_shape]
        for layer in self.layers:
            self.shapes.append(layer.output_shape(self.shapes[-1]))

    @property
    def output_shape(self) -> tuple:
        return self.shapes[-1]

    def param_specs(self) -> list[ParamSpec]:
        return [s for layer, shape in zip(self.layers, self.shapes) for s in layer.param_specs(shape)]

    def parameter_count(self) -> int:
        return sum(s.size for s in self.param_specs())

    def forward_flops_per_sample(self) -> int:
        return sum(layer.forward_flops(shape) for layer, shape in zip(self.layers, self.shapes))

    def train_flops_per_sample(self) -> int:
        """Forward + weight gradients + input gradients except the first layer's (x needs none)."""
        flops = [layer.forward_flops(shape) for layer, shape in zip(self.layers, self.shapes)]
        return sum(flops) * 3 - flops[0]

    def fused_head_pattern(self) -> bool:
        """... Dense(H) -> tanh -> Dense(1) with MSE: the fused regression head applies."""
        if len(self.layers) < 3 or not isinstance(self.loss, MSELoss):
            return False
        prev, act, last = self.layers[-3:]
        return (isinstance(prev, Dense) and isinstance(act, Activation) and act.kind == "tanh"
                and isinstance(last, Dense) and last.units == 1 and fits(prev.units))


def _fresh_copies(layers: list[Layer]) -> list[Layer]:
    """Each program wires its own shallow copies, so training and inference can coexist."""
    fresh = [copy.copy(layer) for layer in layers]
    for layer in fresh:
        if isinstance(layer, Dense):
            layer.bias_grad_fused = False
    return fresh


def _build_forward_chain(net: Sequential, ctx: BuildContext, batch_x, fuse: bool):
    """(fused?, the layers run one by one, their last output); the fused tail is left to the caller."""
    fused = fuse and net.fused_head_pattern()
    body = _fresh_copies(net.layers[:-2] if fused else net.layers)
    x = batch_x
    for layer in body:
        x = layer.build_forward(ctx, x)
    return fused, body, x


class TrainingProgram:
    """The static buffers and calls of one training step (without data and optimizer)."""

    def __init__(self, net: Sequential, ctx: BuildContext, batch_x, batch_t, state, fuse: bool = True):
        self.fused, body, x = _build_forward_chain(net, ctx, batch_x, fuse)
        self.body = body
        if self.fused:
            body[-1].bias_grad_fused = True   # the head computes db of the dense layer feeding it
            self.loss = TanhLinearMSEHead(net.layers[-1].name, body[-1].name)
        else:
            self.loss = copy.copy(net.loss)   # a loss holds its buffers: one per program
        dy = self.loss.build(ctx, x, batch_t, state)
        for i in reversed(range(len(body))):
            dy = body[i].build_backward(ctx, dy, needs_input_grad=i > 0)

    def forward(self):
        for layer in self.body:
            layer.forward()

    def loss_and_backward(self):
        self.loss.forward_backward()
        for layer in reversed(self.body):
            layer.backward()


class InferenceProgram:
    """Forward chain into a float32 (B, outputs) result; the tanh->Dense(1) tail fused."""

    def __init__(self, net: Sequential, ctx: BuildContext, batch_x, fuse: bool = True):
        self.fused, self.body, x = _build_forward_chain(net, ctx, batch_x, fuse)
        self.y = ctx.allocator.zeros((ctx.batch,) + net.output_shape, np.float32, "activations")
        self._tail = TanhLinearOutput(ctx.backend, ctx.params, net.layers[-1].name, x, self.y) if self.fused else None
        self._last = x
        self._xp = ctx.backend.xp

    def release(self):
        for layer in self.body:
            layer.release()

    def run(self):
        for layer in self.body:
            layer.forward()
        if self._tail is not None:
            self._tail.run()
        else:
            self._xp.copyto(self.y, self._last, casting="unsafe")
        return self.y
