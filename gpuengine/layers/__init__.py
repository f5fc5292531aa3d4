"""Layers: each with forward and backward side by side."""
from .activations import Activation, ReLU, Tanh
from .base import BuildContext, Layer
from .batchnorm import BatchNorm2D
from .conv import Conv2D
from .cross_entropy import SoftmaxCrossEntropy
from .dense import Dense
from .flatten import Flatten
from .losses import MSELoss
from .merge import Add
from .pooling import GlobalAveragePool2D, MaxPool2D

__all__ = ["Activation", "Add", "BatchNorm2D", "BuildContext", "Conv2D", "Dense", "Flatten", "GlobalAveragePool2D",
           "Layer", "MSELoss", "MaxPool2D", "ReLU", "SoftmaxCrossEntropy", "Tanh"]
