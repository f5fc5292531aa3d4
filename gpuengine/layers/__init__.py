"""Layers: each with forward and backward side by side."""
from .activations import Activation, ReLU, Tanh
from .base import BuildContext, Layer
from .dense import Dense
from .losses import MSELoss

__all__ = ["Activation", "BuildContext", "Dense", "Layer", "MSELoss", "ReLU", "Tanh"]
