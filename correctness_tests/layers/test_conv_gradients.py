"""Gradient checks of the CNN ops on the NumPy backend in float64 (see gradient_check.py).

Conv2D over strides, padding modes (same, explicit, valid, a 3x3 window on a
padded 2x2 map), with and without bias and with the fused ReLU; MaxPool2D,
non-overlapping and overlapping (ResNet's 3x3/2 with padding); Flatten; the
fused softmax cross-entropy; and the whole MNIST CNN, whose fused and unfused
ReLU must agree. Shape errors name the layer.
"""
from __future__ import annotations

import numpy as np
import pytest

from gpuengine.layers import Conv2D, Flatten, MaxPool2D
from gpuengine.losses import SoftmaxCrossEntropy
from gpuengine.workloads.cnn import CNNShape, build_cnn

from ..gradient_check import assert_not_trivial, check_backward, random_weights
from ..layer_harness import run_layer, run_loss, run_network

BATCH = 3


def images(seed: int, shape=(7, 6, 2)) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((BATCH,) + shape)


# -- convolution -----------------------------------------------------------------------

CONV_CASES = {
    "same-stride1": dict(),
    "same-stride2": dict(stride=2),
    "explicit-stride2": dict(padding=1, stride=2),
    "explicit-asymmetric": dict(padding=(1, 2), stride=(2, 1)),
    "valid": dict(padding="valid"),
    "valid-stride2": dict(padding="valid", stride=2),
    "no-bias-2x3-kernel": dict(kernel_size=(2, 3), use_bias=False),
    "fused-relu": dict(activation="relu"),
}


@pytest.mark.parametrize("case", CONV_CASES, ids=list(CONV_CASES))
def test_conv(case):
    assert_not_trivial(check_backward(Conv2D(4, name="conv", **CONV_CASES[case]), images(1), seed=2))


def test_conv_without_input_gradient_still_makes_every_parameter_gradient():
    pairs = check_backward(Conv2D(3, stride=2, name="conv"), images(3), needs_input_grad=False, seed=3)
    assert_not_trivial(pairs)


def test_conv_3x3_on_a_padded_2x2_map():
    """Seed note 002: the window is larger than the map, the padding makes the shape valid."""
    layer = Conv2D(5, 3, padding="same", name="conv")
    assert layer.output_shape((2, 2, 4)) == (2, 2, 5)
    assert_not_trivial(check_backward(layer, images(4, (2, 2, 4)), seed=4))


def test_conv_valid_window_larger_than_the_map_is_refused_by_name():
    with pytest.raises(ValueError, match="conv7: a 3x3 window with padding 'valid' does not fit a 2x2 input"):
        Conv2D(4, 3, padding="valid", name="conv7").output_shape((2, 2, 1))


@pytest.mark.parametrize("kwargs, message", [
    (dict(filters=0), "Conv2D filters=0 is not accepted; use a whole number >= 1"),
    (dict(filters=2.0), "Conv2D filters=2.0 is not accepted"), (dict(filters=4, use_bias=None), "use_bias=None"),
    (dict(filters=4, activation="tanh"), r"activation='tanh' is not accepted; use one of None, 'relu' \(what a cuDNN"),
    (dict(filters=4, padding="full"), "padding must be"), (dict(filters=4, stride=0), "stride must be"),
])
def test_conv_arguments_are_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Conv2D(**kwargs)


def test_conv_weights_are_krsc_with_glorot_fans():
    weight, bias = Conv2D(16, 3, name="conv").param_specs((28, 28, 2))
    assert weight.shape == (16, 3, 3, 2) and (weight.fan_in, weight.fan_out) == (18, 144)
    assert bias.shape == (16,) and bias.init == "zeros"


def test_fused_relu_equals_conv_then_relu():
    x, w = images(5), random_weights(Conv2D(4, name="conv").param_specs((7, 6, 2)), np.random.default_rng(6))
    dy = np.random.default_rng(7).standard_normal((BATCH, 7, 6, 4))
    fused = run_layer(Conv2D(4, activation="relu", name="conv"), x, dy, weights=w)
    plain = run_layer(Conv2D(4, name="conv"), x, dy * 0, weights=w)
    np.testing.assert_array_equal(fused["y"], np.maximum(plain["y"], 0))


# -- pooling and flatten ---------------------------------------------------------------

POOL_CASES = {
    "2x2": dict(),
    "2x2-odd-map": dict(pool_size=2),
    "3x3-stride2-pad1": dict(pool_size=3, stride=2, padding=1),
    "3x3-stride2-same": dict(pool_size=3, stride=2, padding="same"),
    "3x2-stride1": dict(pool_size=(3, 2), stride=1),
}


@pytest.mark.parametrize("case", POOL_CASES, ids=list(POOL_CASES))
def test_maxpool(case):
    shape = (7, 5, 3) if case == "2x2-odd-map" else (6, 6, 3)
    assert_not_trivial(check_backward(MaxPool2D(name="pool", **POOL_CASES[case]), images(8, shape), seed=8))


def test_maxpool_routes_each_gradient_to_its_window_max():
    x = images(9, (4, 4, 1))
    dy = np.random.default_rng(10).standard_normal((BATCH, 2, 2, 1))
    result = run_layer(MaxPool2D(name="pool"), x, dy)
    blocks = x.reshape(BATCH, 2, 2, 2, 2).transpose(0, 1, 3, 2, 4).reshape(BATCH, 2, 2, 4)
    np.testing.assert_array_equal(result["y"][..., 0], blocks.max(axis=3))
    assert (result["dx"] != 0).sum() == BATCH * 4
    np.testing.assert_allclose(result["dx"].sum(axis=(1, 2, 3)), dy.sum(axis=(1, 2, 3)))


def test_maxpool_padding_as_wide_as_the_pool_is_refused():
    with pytest.raises(ValueError, match="pool: padding 2 is as wide"):
        MaxPool2D(2, padding=2, name="pool").output_shape((6, 6, 1))


def test_flatten_is_nhwc_order():
    x = images(11, (2, 3, 4))
    result = run_layer(Flatten(name="flat"), x, np.ones((BATCH, 24)))
    np.testing.assert_array_equal(result["y"], x.reshape(BATCH, 24))
    assert_not_trivial(check_backward(Flatten(name="flat"), x))


# -- softmax cross-entropy -------------------------------------------------------------

def one_hot_rows(rows: int, classes: int, seed: int) -> np.ndarray:
    return np.eye(classes)[np.random.default_rng(seed).integers(0, classes, rows)]


@pytest.mark.parametrize("classes", [2, 10, 37])
def test_softmax_cross_entropy(classes):
    z, t = images(12, (classes,)).reshape(BATCH, classes) * 3, one_hot_rows(BATCH, classes, 13)
    assert_not_trivial(check_backward(SoftmaxCrossEntropy(), z, t))


def test_softmax_cross_entropy_value_and_gradient_are_softmax_minus_onehot():
    rows, classes = 8, 10
    z = np.random.default_rng(14).standard_normal((rows, classes)) * 50   # exp would overflow unshifted
    t = one_hot_rows(rows, classes, 15)
    result = run_loss(SoftmaxCrossEntropy(), z, t)
    log_p = z - z.max(axis=1, keepdims=True)
    log_p -= np.log(np.exp(log_p).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(result["loss"], -(t * log_p).sum() / rows, rtol=1e-12)
    np.testing.assert_allclose(result["dy"], (np.exp(log_p) - t) / rows, rtol=1e-12, atol=1e-15)


def test_softmax_cross_entropy_needs_matching_2d_targets():
    with pytest.raises(ValueError, match="must both be"):
        run_loss(SoftmaxCrossEntropy(), np.zeros((4, 10)), np.zeros((4, 9)))


# -- the whole CNN ---------------------------------------------------------------------

SHAPE = CNNShape(size=8, filters=3, classes=5)


def cnn_case(seed: int, fused_relu: bool = True):
    net = build_cnn(SHAPE, fused_relu)
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 1, (4,) + SHAPE.image_shape)
    t = one_hot_rows(4, SHAPE.classes, seed)
    return net, x, t, random_weights(net.param_specs(), rng)


@pytest.mark.parametrize("fused_relu", [True, False])
def test_cnn(fused_relu):
    net, x, t, weights = cnn_case(16, fused_relu)
    assert_not_trivial(check_backward(net, x, t, weights))


def test_cnn_fused_and_unfused_relu_agree():
    net, x, t, weights = cnn_case(17)
    fused = run_network(net, x, t, weights=weights)
    unfused = run_network(build_cnn(SHAPE, fused_relu=False), x, t, weights=weights)
    for key in ("loss", "grad:conv.weight", "grad:conv.bias", "grad:dense.weight", "grad:dense.bias"):
        np.testing.assert_allclose(fused[key], unfused[key], rtol=1e-12, atol=1e-15, err_msg=key)
