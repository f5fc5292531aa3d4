"""The layer interface: forward and backward side by side, on static buffers.

Layers are wired once at build time: `build_forward` receives the input buffer
and returns the output buffer it will write; `build_backward` receives the
gradient buffer of its output and returns the gradient buffer of its input (or
None where nobody needs it). `forward()` and `backward()` then take no
arguments and allocate nothing, so a whole step can be captured in a CUDA graph
and replayed with the same addresses.

A layer of several inputs (a residual add) sets `arity`; its shape methods
take one per-sample shape per input, `build_forward` one buffer per input, and
`build_backward` gets one needs-gradient flag per input and returns one
gradient buffer (or None) per input.

`backward()` computes the input gradients (and, for most layers, the
parameter gradients too); a layer may leave its parameter gradients to
`backward_params()`, which the program runs right after `backward()`.
(Running those on a second stream beside the input-gradient chain was
measured on an H100 for ResNet-50: 36-38k samples/s against 45k on one
stream, so everything runs on the engine stream.)
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

from ..runtime.params import FlatParameters, ParamSpec


@dataclass
class BuildContext:
    """What a layer needs to allocate and find its parameters."""

    backend: object
    policy: object
    allocator: object
    params: FlatParameters | None
    batch: int
    training: bool = True   # False: an inference program (BatchNorm then uses its running statistics)
    deterministic: bool = True   # the config's toggle: cuDNN graphs keep to engines that give the same bits
    batchnorm: str = "cudnn"     # the config's toggle: batch norm as cuDNN graphs, the engine's kernels, or by map
    bias_grad: str = "auto"      # the config's toggle: bias gradients by layer, by a column sum or in the wgrad GEMM
    widening: object = None      # a training program's ops.widen.Widening: bf16 weight gradients widened at once
    sums: object = None          # a training program's ops.partial_sums.PartialSums: column sums finished at once
    batch_innermost_input: object = None   # the data's offer: a call giving the batch's x stored (features, batch)
                                           # by its gather, or None (ResidentDataset.batch_innermost_input)

    def bias_grad_in_epilogue(self, token_major: bool) -> bool:
        """Whether a bias gradient comes from the weight-gradient GEMM's epilogue: as toggled, or under auto for the
        token-major layers (Linear, attention), where it measured faster and a flat Dense head slower (docs/seeds.md,
        'Bias gradients')."""
        return self.bias_grad == "epilogue" or (self.bias_grad == "auto" and token_major)


class Layer:
    """Base layer: no parameters, identity shapes."""

    name: str = ""
    arity: int = 1   # how many earlier outputs the layer reads
    # Attributes a program sets on its own copy when it fuses the layer with a neighbour (model/passes.py); their
    # unfused values are class attributes of the layer.
    wiring: tuple[str, ...] = ()

    def unwired_copy(self) -> "Layer":
        """A shallow copy with every wiring attribute at its class's unfused value: each program wires its own."""
        fresh = copy.copy(self)
        for name in self.wiring:
            fresh.__dict__.pop(name, None)
        return fresh

    def param_specs(self, *input_shapes: tuple) -> list[ParamSpec]:
        return []

    def buffer_specs(self, *input_shapes: tuple) -> list[ParamSpec]:
        """State the layer keeps but nobody trains (running statistics)."""
        return []

    def output_shape(self, input_shape: tuple) -> tuple:
        """Per-sample output shape for a per-sample input shape."""
        return input_shape

    def build_forward(self, ctx: BuildContext, x):
        raise NotImplementedError

    def build_backward(self, ctx: BuildContext, dy, needs_input_grad: bool):
        raise NotImplementedError

    def forward(self):
        raise NotImplementedError

    def backward(self):
        raise NotImplementedError

    def backward_params(self):
        """Parameter gradients left out of backward(); reads only what backward() and forward() wrote."""

    def release(self):
        """Free library plans the layer holds (cuDNN graphs are cached process-wide and stay)."""

    def check_data(self, x) -> None:
        """Refuse, on the host, network input the layer cannot read (token ids out of range): called with the
        whole host array by the trainer and the predictor, for a node that reads the network's input."""

    def forward_flops(self, *input_shapes: tuple) -> int:
        """Multiply-adds x2 per sample of the forward pass (for fraction-of-peak reports)."""
        return 0

    def __repr__(self):
        return f"{type(self).__name__}({self.name})"
