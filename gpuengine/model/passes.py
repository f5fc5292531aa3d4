"""Fusion passes: patterns in a network that a program replaces with one fused kernel.

`tanh_linear_mse_head`: a network ending ... Dense(H) -> tanh -> Dense(1) with
an MSE loss (seed note 000's regression MLP) trains through
`losses/fused_head.py`'s TanhLinearMSEHead, which computes the last two layers,
the loss and their gradients in two passes instead of five kernels; inference
uses its forward pass alone. A pass only finds its pattern: the programs
(`program.py`) decide whether to apply it (`fuse=True`, the default).
"""
from __future__ import annotations

from ..layers.activations import Activation
from ..layers.dense import Dense
from ..losses.fused_head import fits
from ..losses.mse import MSELoss
from .network import Network, Node


def tanh_linear_mse_head(net: Network) -> list[Node] | None:
    """The nodes Dense(H) -> tanh -> Dense(1) ending `net` as a chain under an MSE loss, else None."""
    if not isinstance(net.loss, MSELoss):
        return None
    tail = net.chain_tail(3)
    if tail is None:
        return None
    prev, act, last = (n.layer for n in tail)
    fused = (isinstance(prev, Dense) and isinstance(act, Activation) and act.kind == "tanh"
             and isinstance(last, Dense) and last.units == 1 and fits(prev.units))
    return tail if fused else None
