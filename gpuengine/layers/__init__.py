"""Layers: each with forward and backward side by side."""
from .activations import Activation, ReLU, ReLU6, Tanh
from .adaptive_pool import AdaptiveAveragePool2D
from .base import BuildContext, Layer
from .batchnorm import BatchNorm2D
from .conv import Conv2D
from .cross_entropy import SoftmaxCrossEntropy
from .dense import Dense
from .dropout import Dropout
from .flatten import Flatten
from .losses import MSELoss
from .merge import Add
from .pooling import GlobalAveragePool2D, MaxPool2D

__all__ = ["Activation", "AdaptiveAveragePool2D", "Add", "BatchNorm2D", "BuildContext", "Conv2D", "Dense", "Dropout",
           "Flatten", "GlobalAveragePool2D", "Layer", "MSELoss", "MaxPool2D", "ReLU", "ReLU6", "SoftmaxCrossEntropy",
           "Tanh"]
