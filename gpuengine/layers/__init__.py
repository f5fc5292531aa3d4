"""Layers: each with forward and backward side by side."""
from .activations import Activation, ReLU, ReLU6, Tanh
from .adaptive_pool import AdaptiveAveragePool2D, GlobalAveragePool2D
from .attention import MultiHeadAttention
from .base import BuildContext, Layer
from .batchnorm import BatchNorm2D
from .conv import Conv2D
from .dense import Dense
from .dropout import Dropout
from .embedding import TokenEmbedding
from .flatten import Flatten
from .layernorm import LayerNorm
from .linear import Linear
from .merge import Add
from .pooling import MaxPool2D
from .positional import SinusoidalPositionalEncoding

__all__ = ["Activation", "AdaptiveAveragePool2D", "Add", "BatchNorm2D", "BuildContext", "Conv2D", "Dense", "Dropout",
           "Flatten", "GlobalAveragePool2D", "Layer", "LayerNorm", "Linear", "MaxPool2D",
           "MultiHeadAttention", "ReLU", "ReLU6", "SinusoidalPositionalEncoding", "Tanh", "TokenEmbedding"]
