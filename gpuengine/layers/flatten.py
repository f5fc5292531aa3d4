"""Flatten: (H, W, C) samples as (H*W*C,) rows, a view of the same memory in NHWC order.

No copy and no kernel in either direction: the output is the input's buffer
and the input gradient is the output gradient's buffer, reshaped. A dense layer
after it therefore sees features in (h, w, c) order; torch flattens NCHW maps
in (c, h, w) order, so a torch twin permutes that dense layer's weight columns
(gpuengine/reference/torch_cnn.py).
"""
from __future__ import annotations

import numpy as np

from .base import BuildContext, Layer


def _as_view(a, shape, what: str):
    if not a.flags.c_contiguous:
        raise ValueError(f"{what} must be contiguous for Flatten to stay a view")
    return a.reshape(shape)


class Flatten(Layer):
    def __init__(self, name: str = ""):
        self.name = name

    def output_shape(self, input_shape):
        return (int(np.prod(input_shape)),)

    def build_forward(self, ctx: BuildContext, x):
        self.x = x
        return _as_view(x, (x.shape[0], -1), f"{self.name}: the input")

    def build_backward(self, ctx: BuildContext, dy, needs_input_grad: bool):
        return _as_view(dy, self.x.shape, f"{self.name}: the output gradient") if needs_input_grad else None

    def forward(self):
        """Nothing to compute: the output is the input's memory."""

    def backward(self):
        """Nothing to compute: the input gradient is the output gradient's memory."""
