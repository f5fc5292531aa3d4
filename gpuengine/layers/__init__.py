"""Layers: each with forward and backward side by side."""
from .activations import Activation, ReLU, Tanh
from .base import BuildContext, Layer
from .conv import Conv2D
from .cross_entropy import SoftmaxCrossEntropy
from .dense import Dense
from .flatten import Flatten
from .losses import MSELoss
from .pooling import MaxPool2D

__all__ = ["Activation", "BuildContext", "Conv2D", "Dense", "Flatten", "Layer", "MSELoss", "MaxPool2D", "ReLU",
           "SoftmaxCrossEntropy", "Tanh"]
