"""Losses, each fused with its own gradient: `build(ctx, y, target, state)`, then `forward_backward()` per step."""
from .cross_entropy import SoftmaxCrossEntropy
from .mse import MSELoss
from .token_cross_entropy import TokenCrossEntropy

__all__ = ["MSELoss", "SoftmaxCrossEntropy", "TokenCrossEntropy"]
