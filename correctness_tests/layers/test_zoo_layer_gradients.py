"""Gradient checks and behaviour of the model zoo's layers on the NumPy backend (see gradient_check.py).

Grouped and depthwise Conv2D (strided, padded, with bias and the fused ReLU);
ReLU6 on values either side of both clip points; Dropout (a fixed mask per
draw, so its gradient is checkable; p = 0 and inference are the identity; the
keep rate and scaling over many elements; a fresh mask after each backward,
the same one in forward and backward; Philox words against Random123's
known answers); adaptive average pooling to a size that divides the map, to
one that does not (overlapping bins) and to the map's own size (a view).
"""
from __future__ import annotations

import re

import numpy as np
import pytest

from gpuengine.layers import AdaptiveAveragePool2D, Conv2D, Dropout, ReLU6
from gpuengine.layers.dropout import philox_words
from gpuengine.runtime.params import initial_value

from ..gradient_check import assert_not_trivial, check_backward
from ..layer_harness import make_context, run_layer

BATCH = 3


def images(seed: int, shape=(7, 6, 4)) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((BATCH,) + shape)


GROUPED_CASES = {
    "groups2": dict(filters=6, groups=2),
    "groups2-stride2-relu": dict(filters=4, groups=2, stride=2, padding=1, activation="relu"),
    "depthwise": dict(filters=4, groups=4, padding=1),
    "depthwise-stride2-no-bias": dict(filters=4, groups=4, stride=2, padding=1, use_bias=False),
    "depthwise-multiplier2": dict(filters=8, groups=4, kernel_size=(3, 2)),
}


@pytest.mark.parametrize("case", GROUPED_CASES, ids=list(GROUPED_CASES))
def test_grouped_conv(case):
    kwargs = dict(GROUPED_CASES[case])
    layer = Conv2D(kwargs.pop("filters"), name="conv", **kwargs)
    assert_not_trivial(check_backward(layer, images(1), seed=2))


def test_grouped_conv_is_the_concatenation_of_its_groups():
    """Group g's filters see only group g's channels: two one-group convolutions side by side."""
    x = images(3)
    rng = np.random.default_rng(4)
    w, b = rng.standard_normal((6, 3, 3, 2)), rng.standard_normal(6)
    dy = rng.standard_normal((BATCH, 7, 6, 6))
    grouped = run_layer(Conv2D(6, groups=2, name="conv"), x, dy, weights={"conv.weight": w, "conv.bias": b})
    halves = [run_layer(Conv2D(3, name="conv"), x[..., 2 * g:2 * g + 2], dy[..., 3 * g:3 * g + 3],
                        weights={"conv.weight": w[3 * g:3 * g + 3], "conv.bias": b[3 * g:3 * g + 3]})
              for g in range(2)]
    np.testing.assert_allclose(grouped["y"], np.concatenate([h["y"] for h in halves], axis=3), rtol=1e-12)
    np.testing.assert_allclose(grouped["dx"], np.concatenate([h["dx"] for h in halves], axis=3), rtol=1e-12)
    np.testing.assert_allclose(grouped["grad:conv.weight"],
                               np.concatenate([h["grad:conv.weight"] for h in halves]), rtol=1e-12)


def test_grouped_conv_shapes_parameters_and_flops():
    layer = Conv2D(8, 3, padding=1, groups=4, name="dw")
    assert layer.output_shape((5, 5, 4)) == (5, 5, 8)
    assert [s.shape for s in layer.param_specs((5, 5, 4))] == [(8, 3, 3, 1), (8,)]
    assert layer.forward_flops((5, 5, 4)) == 2 * 25 * 8 * 9 * 1


@pytest.mark.parametrize("kwargs, shape, message", [
    (dict(filters=6, groups=4), None, "filters=6 is not a multiple of groups=4"),
    (dict(filters=4, groups=0), None, "groups=0 is not accepted; use a whole number >= 1"),
    (dict(filters=4, groups=4), (5, 5, 6), "dw: 6 input channels do not split into 4 groups"),
])
def test_grouped_conv_arguments_are_checked(kwargs, shape, message):
    with pytest.raises(ValueError, match=message):
        Conv2D(kwargs.pop("filters"), name="dw", **kwargs).output_shape(shape)


def test_relu6():
    x = images(5, (4, 4, 2)) * 4.0 + 3.0   # values below 0, between 0 and 6 and above 6
    assert ((x < 0).any() and (x > 6).any())
    assert_not_trivial(check_backward(ReLU6(name="relu6"), x, seed=5))
    y = run_layer(ReLU6(name="relu6"), x, x * 0)["y"]
    np.testing.assert_array_equal(y, np.clip(x, 0.0, 6.0))


def test_dropout_gradient_under_its_mask():
    assert_not_trivial(check_backward(Dropout(0.3, name="drop"), images(6), seed=6))


@pytest.mark.parametrize("p, training", [(0.0, True), (0.5, False)], ids=["p0", "inference"])
def test_dropout_is_the_identity_at_p0_and_in_inference(p, training):
    x, dy = images(7), images(8)
    out = run_layer(Dropout(p, name="drop"), x, dy, training=training)
    np.testing.assert_array_equal(out["y"], x)
    np.testing.assert_array_equal(out["dx"], dy)


def dropout_layer(p: float, shape=(64, 64, 16), seed: int = 0):
    """A built NumPy Dropout over ones (so the output is the mask times the scale), and its output gradient."""
    ctx = make_context("cpu", "fp32", 4, [], None)
    x = np.ones((4,) + shape, np.float32)
    layer = Dropout(p, seed=seed, name="drop")
    y = layer.build_forward(ctx, x)
    dy = np.ones_like(x)
    dx = layer.build_backward(ctx, dy, True)
    return layer, y, dx


@pytest.mark.parametrize("p", [0.2, 0.5])
def test_dropout_keep_rate_and_scaling(p):
    layer, y, dx = dropout_layer(p)
    layer.forward()
    kept = y != 0
    assert np.allclose(y[kept], 1.0 / (1.0 - p), rtol=1e-7)   # kept values are scaled by 1 / (1 - p)
    n = y.size   # 262,144 draws: the kept fraction is within 5 standard deviations of 1 - p
    assert abs(kept.mean() - (1 - p)) < 5 * np.sqrt(p * (1 - p) / n)
    layer.backward()
    np.testing.assert_array_equal(dx, y)   # the gradient passes under the forward mask


def test_dropout_draws_a_fresh_mask_each_step_and_streams_differ_by_name_and_seed():
    layer, y, _ = dropout_layer(0.5, (8, 8, 8))
    layer.forward()
    first = y.copy()
    layer.forward()
    np.testing.assert_array_equal(y, first)   # without a backward the draw has not advanced
    layer.backward()
    assert int(layer.draw[0]) == 1
    layer.forward()
    assert (y != first).mean() > 0.3   # independent masks differ in half the places
    other, y_other, _ = dropout_layer(0.5, (8, 8, 8), seed=1)
    other.forward()
    assert (y_other != first).mean() > 0.3


def test_dropout_rate_is_checked():
    for p in (1.0, -0.1, "0.5", True, float("nan")):
        with pytest.raises(ValueError, match=rf"^Dropout p={re.escape(repr(p))} is not accepted; use a finite number "
                                             r">= 0.0 and < 1.0$"):
            Dropout(p)


def test_philox_matches_random123_known_answers():
    """First output word of Philox-4x32-10 for Random123's three known-answer vectors."""
    cases = [((0, 0, 0, 0), (0, 0), 0x6627E8D5),
             ((0xFFFFFFFF,) * 4, (0xFFFFFFFF, 0xFFFFFFFF), 0x408F276D),
             ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0), 0xD16CFE09)]
    for counter, key, expected in cases:
        assert int(philox_words(counter, key)) == expected


@pytest.mark.parametrize("size, shape", [((2, 2), (4, 6, 3)), ((3, 4), (5, 7, 2)), ((1, 1), (3, 5, 2))],
                         ids=["divides", "overlapping-bins", "global"])
def test_adaptive_average_pool(size, shape):
    layer = AdaptiveAveragePool2D(size, name="pool")
    assert layer.output_shape(shape) == size + (shape[2],)
    assert_not_trivial(check_backward(layer, images(9, shape), seed=9))


def test_adaptive_average_pool_to_the_maps_own_size_is_a_view():
    x, dy = images(10, (6, 6, 3)), images(11, (6, 6, 3))
    out = run_layer(AdaptiveAveragePool2D(6, name="pool"), x, dy)
    np.testing.assert_array_equal(out["y"], x)
    np.testing.assert_array_equal(out["dx"], dy)


def test_he_fan_out_init_has_torchvisions_spread_and_bad_inits_are_refused():
    layer = Conv2D(256, 3, padding=1, init="he_fan_out", name="conv")
    (spec, _) = layer.param_specs((8, 8, 64))
    weights = initial_value(spec, np.random.default_rng(12))
    assert abs(weights.std() / np.sqrt(2.0 / (3 * 3 * 256)) - 1) < 0.02 and abs(weights.mean()) < 1e-3
    with pytest.raises(ValueError, match="Conv2D init='uniform' is not accepted; use one of 'glorot', 'he_fan_out'"):
        Conv2D(4, init="uniform")
