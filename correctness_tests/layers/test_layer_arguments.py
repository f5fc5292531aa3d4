"""Layer constructors refuse a bad size or setting at once, naming the argument, the value and what is accepted.

Dense(2.5) and Dense(True) were accepted (True as one unit); a float or bool
size now fails where the layer is made, before any network or buffer exists.
Sizes are whole numbers: NumPy integers pass, floats and bools do not.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

from gpuengine.checks import ArgumentError
from gpuengine.layers import (Activation, BatchNorm2D, Conv2D, Dense, Dropout, LayerNorm, Linear, MaxPool2D,
    MultiHeadAttention, TokenEmbedding)

BAD = [
    (lambda: Dense(2.5), "Dense units=2.5", "a whole number >= 1"),
    (lambda: Dense(True), "Dense units=True", "a whole number >= 1"),
    (lambda: Dense(0), "Dense units=0", "a whole number >= 1"),
    (lambda: Dense("4"), "Dense units='4'", "a whole number >= 1"),
    (lambda: Linear(-3), "Linear units=-3", "a whole number >= 1"),
    (lambda: Linear(np.float32(4)), "Linear units=np.float32(4.0)", "a whole number >= 1"),
    (lambda: TokenEmbedding(32.0, 16, 0, 8), "TokenEmbedding vocab=32.0", "a whole number >= 1"),
    (lambda: TokenEmbedding(32, 16, -1, 8), "TokenEmbedding start=-1", "a whole number >= 0"),
    (lambda: TokenEmbedding(32, False, 0, 8), "TokenEmbedding d_model=False", "a whole number >= 1"),
    (lambda: MultiHeadAttention(1.5), "MultiHeadAttention heads=1.5", "a whole number >= 1"),
    (lambda: MultiHeadAttention(2, causal="yes"), "MultiHeadAttention causal='yes'", "True or False"),
    (lambda: Conv2D(True), "Conv2D filters=True", "a whole number >= 1"),
    (lambda: LayerNorm(float("inf")), "LayerNorm epsilon=inf", "a finite number > 0.0"),
    (lambda: LayerNorm("1e-5"), "LayerNorm epsilon='1e-5'", "a finite number > 0.0"),
    (lambda: BatchNorm2D(momentum=float("nan")), "BatchNorm2D momentum=nan", "a finite number >= 0.0 and <= 1.0"),
    (lambda: Dropout(0.1, seed=-1), "Dropout seed=-1", "a whole number >= 0"),
    (lambda: Activation("gelu"), "Activation kind='gelu'", "one of 'tanh', 'relu', 'relu6'"),
]


@pytest.mark.parametrize("make, given, allowed", BAD, ids=[b[1] for b in BAD])
def test_a_bad_layer_argument_is_refused_naming_it_its_value_and_what_is_accepted(make, given, allowed):
    with pytest.raises(ArgumentError, match=f"^{re.escape(given)} is not accepted; use {re.escape(allowed)}"):
        make()


def test_pool_padding_is_checked_when_the_layer_is_made():
    """As Conv2D's: a bad padding used to surface only once the layer met an input shape."""
    with pytest.raises(ValueError, match=r"^MaxPool2D: padding must be 'valid', 'same', or pixels >= 0 .*got 'full'$"):
        MaxPool2D(2, padding="full")


def test_argument_errors_are_value_and_type_errors():
    """A caller that caught the raw TypeError of a wrong type, or the ValueError of a bad value, still catches it."""
    for error in (ValueError, TypeError):
        with pytest.raises(error):
            Dense(2.5)


def test_numpy_whole_numbers_are_sizes():
    layer = Dense(np.int64(4))
    assert layer.units == 4 and type(layer.units) is int
    assert TokenEmbedding(np.int32(32), np.int16(16), np.uint8(0), 8).vocab == 32
