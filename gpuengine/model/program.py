"""A network (`network.py`) built into static training and inference programs for one batch size.

`TrainingProgram` wires the forward pass node by node in topological order,
the loss (or the fused regression head where `passes.py` finds its pattern
at the network's end), then the backward pass in reverse order: each node's output
gradient is the sum of what its readers hand back. One reader's gradient is
used as it is; several (a residual block's input, read by the branch and the
shortcut) are added by one `GradientSum` pass just before the node's backward,
or by the node's backward itself where it can (a LayerNorm's one launch, the
engine's batch-norm kernel).
A max pool over the first convolution (`passes.py`) runs with it as one
forward kernel and hands its output gradient to that convolution's weight
gradient (ops/conv_pool.py, ops/direct_wgrad.py), on a GPU. A ReLU that
only reads a Dense or Linear layer runs in that layer's GEMM epilogue, and a
residual Add that only a LayerNorm reads is summed by that LayerNorm, which
also sums the last bias gradient of a Linear layer or attention only that Add
reads; a token embedding adds the positional encoding over it. In TF32 a
Dense over the batch that feeds the fused head writes z batch-innermost, the
head reads it and writes dz so, and the Dense copies x so too where the
device has room: its weight gradient then reads both K-major (layers/dense.py).
`InferenceProgram` wires the forward pass alone. Both allocate everything up
front, so their calls can be captured in a CUDA graph.
"""
from __future__ import annotations

import copy
import dataclasses

import numpy as np

from ..layers.base import BuildContext
from ..layers.merge import GradientSum
from ..losses.fused_head import TanhLinearMSEHead, TanhLinearOutput
from ..ops.conv_pool import ConvPoolForward
from ..ops.partial_sums import PartialSums
from ..ops.widen import Widening
from .network import INPUT, Network, NetworkError
from .passes import (adds_into_layernorms, biases_under_layernorms, biases_under_relus, pools_over_direct_wgrad,
                     positions_over_embeddings, relus_after_gemms, tanh_linear_mse_head)

__all__ = ["InferenceProgram", "TrainingProgram"]


class _ForwardWiring:
    """The forward pass of every node but a fused tail's last two: layers in order and their outputs."""

    def __init__(self, net: Network, ctx: BuildContext, batch_x, fuse: bool):
        self.tail = tanh_linear_mse_head(net) if fuse else None
        self.fused = self.tail is not None
        skipped = {n.name for n in self.tail[1:]} if self.fused else set()
        self.nodes = [n for n in net.nodes if n.name not in skipped]
        self.layers = {n.name: n.layer.unwired_copy() for n in self.nodes}   # training and inference coexist
        for relu, below in (relus_after_gemms(net) if fuse else {}).items():
            if relu in self.layers and below in self.layers:
                self.layers[below].relu_epilogue = self.layers[relu].applied_by_input = True
        for relu, below in (biases_under_relus(net) if fuse else {}).items():
            if self.layers[relu].applied_by_input:
                self.layers[below].bias_grad_by_reader = True
                self.layers[relu].bias_of = self.layers[below].output_bias()
        for norm, below in (adds_into_layernorms(net) if fuse else {}).items():
            if norm in self.layers and below in self.layers:
                self.layers[below].summed_by_reader = True
                self.layers[norm].residual = self.layers[below]
        for norm, below in (biases_under_layernorms(net) if fuse else {}).items():
            if self.layers[norm].residual is not None and below in self.layers:
                self.layers[below].bias_grad_by_reader = True
                self.layers[norm].bias_of = self.layers[below].output_bias()
        for positions, below in (positions_over_embeddings(net) if fuse else {}).items():
            if positions in self.layers and below in self.layers:
                self.layers[below].adds_positions = self.layers[positions].added_by_input = True
        if self.fused and ctx.training and ctx.policy.tf32 and tuple(self.tail[0].inputs) == (INPUT,):
            # TF32 GEMMs read K-major tiles: z, dz and a copy of x batch-innermost give dW its K-major operands
            # (a Dense over the batch itself makes no dx, which would read dz the other way)
            self.layers[self.tail[0].name].batch_innermost = True
        self.outputs = {INPUT: batch_x}
        for node in self.nodes:
            inputs = [self.outputs[i] for i in node.inputs]
            self.outputs[node.name] = self.layers[node.name].build_forward(ctx, *inputs)
        self.last = self.outputs[self.nodes[-1].name]


class TrainingProgram:
    """The static buffers and calls of one training step (without data and optimizer)."""

    def __init__(self, net: Network, ctx: BuildContext, batch_x, batch_t, state, fuse: bool = True,
                 each_step: bool = False):
        """each_step: the gradients are sent as each backward step writes them (data parallel, through
        loss_and_backward's after_params), so the column sums end in their own kernels, not in one launch after."""
        wiring = _ForwardWiring(net, ctx, batch_x, fuse)
        self.fused, self.nodes, self.layers = wiring.fused, wiring.nodes, wiring.layers
        if self.fused:
            head_input = wiring.layers[wiring.tail[0].name]
            head_input.bias_grad_fused = True   # the head computes db of the dense layer feeding it
            self.loss = TanhLinearMSEHead(wiring.tail[-1].name, head_input.name, head_input.batch_innermost)
        else:
            self.loss = copy.copy(net.loss)   # a loss holds its buffers: one per program
        pooled = pools_over_direct_wgrad(net, self.layers, ctx.backend.is_gpu) if fuse else set()
        self._forward_runs = self._forward_calls(pooled)
        grads = {self.nodes[-1].name: [self.loss.build(ctx, wiring.last, batch_t, state)]}
        self.widening = Widening(ctx.backend, ctx.allocator)
        self.sums = PartialSums(ctx.backend, ctx.allocator)
        # the backward layers hand them their bf16 gradients and their blocks' partial column sums
        ctx = dataclasses.replace(ctx, widening=self.widening, sums=None if each_step else self.sums)
        self._backward = []   # (gradient sum or None, layer, node name), in the order they run
        for node in reversed(self.nodes):
            self.widening.step = self.sums.step = len(self._backward)
            layer, parts = self.layers[node.name], grads.pop(node.name)
            summed = GradientSum(ctx, parts) if len(parts) > 1 else None
            dy = summed.out if summed else parts[0]
            if fuse and "gradient_sum" in layer.wiring:   # LayerNorm, BatchNorm2D: may add dy's parts themselves
                layer.gradient_sum = summed
            needs = tuple(i != INPUT for i in node.inputs)
            if node.name in pooled:   # the convolution below reads dy itself
                result = layer.build_backward_pooled(ctx, dy)
            else:
                result = layer.build_backward(ctx, dy, needs[0] if layer.arity == 1 else needs)
            for source, need, dx in zip(node.inputs, needs, (result,) if layer.arity == 1 else result):
                if need and dx is None:
                    raise NetworkError(f"node {node.name!r} returned no gradient for its input {source!r}")
                if need:
                    grads.setdefault(source, []).append(dx)
            self._backward.append((summed, layer, node.name))
        self.widening.build()
        self.sums.build()

    @property
    def backward_nodes(self) -> list[str]:
        """Node names in the order backward runs them (data parallel: which step completes which gradient)."""
        return [name for _, _, name in self._backward]

    @property
    def body(self) -> list:
        """The layers run one by one in the forward pass, in order."""
        return [self.layers[n.name] for n in self.nodes]

    def _forward_calls(self, pooled: set[str]) -> list:
        """Each node's forward in order; a pool in `pooled` and the convolution below it as one ConvPoolForward
        (the convolution's own output is then never written: nothing reads it)."""
        convs = {node.inputs[0] for node in self.nodes if node.name in pooled}   # run by their pool's call
        return [ConvPoolForward(self.layers[node.inputs[0]], self.layers[node.name]).run if node.name in pooled
                else self.layers[node.name].forward for node in self.nodes if node.name not in convs]

    def forward(self):
        for run in self._forward_runs:
            run()

    def loss_and_backward(self, after_params=None, widen: bool = True):
        """after_params(i), if given, runs once backward step i has written its parameters' gradients (each
        step's bf16 weight gradients widened and its partial sums finished right after it); without it each of those
        takes one launch after the backward pass. widen=False leaves the bf16 weight gradients in their scratches
        (an optimizer that reads them there: optim.py)."""
        self.loss.forward_backward()
        for index, (summed, layer, _) in enumerate(self._backward):
            if summed is not None:
                summed.run()
            layer.backward()
            layer.backward_params()
            if after_params is not None:
                self.widening.run_step(index)
                self.sums.run_step(index)
                after_params(index)
        if after_params is None:
            if widen:
                self.widening.run()
            self.sums.run()


class InferenceProgram:
    """Forward pass into a float32 (B, outputs) result; the tanh->Dense(1) tail fused."""

    def __init__(self, net: Network, ctx: BuildContext, batch_x, fuse: bool = True):
        wiring = _ForwardWiring(net, ctx, batch_x, fuse)
        self.fused, self.body = wiring.fused, [wiring.layers[n.name] for n in wiring.nodes]
        self.y = ctx.allocator.zeros((ctx.batch,) + net.output_shape, np.float32, "activations")
        self._tail = (TanhLinearOutput(ctx.backend, ctx.params, wiring.tail[-1].name, wiring.last, self.y)
                      if self.fused else None)
        self._last = wiring.last
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
