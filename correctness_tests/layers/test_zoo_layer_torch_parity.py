"""The model zoo's layers on the CPU against PyTorch's, float32, same inputs and weights.

Grouped and depthwise convolution (output, input, weight and bias gradients
against `F.conv2d(groups=...)`), ReLU6 (`F.relu6`), dropout (p = 0 is exactly
torch's p = 0; at p > 0 the masks come from different generators, so what is
compared is what both promise: the kept fraction near 1 - p and kept values
scaled by 1 / (1 - p)), and adaptive average pooling (`F.adaptive_avg_pool2d`,
forward and backward, including overlapping bins).
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed; parity with PyTorch cannot be checked")
F = torch.nn.functional

from gpuengine.layers import AdaptiveAveragePool2D, Conv2D, Dropout, ReLU6  # noqa: E402
from gpuengine.reference.torch_common import to_nchw  # noqa: E402

from ..layer_harness import run_layer  # noqa: E402
from ..torch_compare import assert_matches_torch, fixed_torch_threads  # noqa: E402,F401

RTOL, ATOL = 1e-5, 1e-5


def arrays(seed: int, *shapes):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def nhwc(tensor) -> np.ndarray:
    return tensor.detach().numpy().transpose(0, 2, 3, 1)


def leaf(array: np.ndarray):
    return torch.from_numpy(np.ascontiguousarray(array)).requires_grad_(True)


CONV_CASES = {   # (channels, filters, groups, kernel, stride, padding)
    "groups2": (4, 6, 2, 3, 1, 1),
    "depthwise": (8, 8, 8, 3, 1, 1),
    "depthwise-stride2": (8, 8, 8, 3, 2, 1),
    "depthwise-multiplier2": (4, 8, 4, 3, 1, 0),
}


@pytest.mark.parametrize("case", CONV_CASES, ids=list(CONV_CASES))
def test_grouped_conv_matches_torch(case):
    channels, filters, groups, kernel, stride, padding = CONV_CASES[case]
    x, w, b = arrays(1, (3, 9, 8, channels), (filters, kernel, kernel, channels // groups), (filters,))
    layer = Conv2D(filters, kernel, stride=stride, padding=padding, groups=groups, name="conv")
    out_shape = (3,) + layer.output_shape((9, 8, channels))
    (dy,) = arrays(2, out_shape)
    engine = run_layer(layer, x, dy, precision="fp32", weights={"conv.weight": w, "conv.bias": b})

    xt, wt, bt = leaf(to_nchw(x)), leaf(w.transpose(0, 3, 1, 2)), leaf(b)
    y = F.conv2d(xt, wt, bt, stride=stride, padding=padding, groups=groups)
    y.backward(torch.from_numpy(to_nchw(dy)))
    assert_matches_torch({"y": engine["y"], "dx": engine["dx"], "dw": engine["grad:conv.weight"],
                          "db": engine["grad:conv.bias"]},
                         {"y": nhwc(y), "dx": nhwc(xt.grad), "dw": wt.grad.numpy().transpose(0, 2, 3, 1),
                          "db": bt.grad}, rtol=RTOL, atol=ATOL, what=case)


def test_relu6_matches_torch():
    x, dy = arrays(3, (4, 5, 5, 3), (4, 5, 5, 3))
    x = x * 4 + 3
    engine = run_layer(ReLU6(name="relu6"), x, dy, precision="fp32")
    xt = leaf(x)
    y = F.relu6(xt)
    y.backward(torch.from_numpy(dy))
    assert_matches_torch({"y": engine["y"], "dx": engine["dx"]}, {"y": y, "dx": xt.grad}, rtol=0, what="relu6")


def test_dropout_at_p0_is_exactly_torchs():
    x, dy = arrays(4, (4, 6, 6, 3), (4, 6, 6, 3))
    engine = run_layer(Dropout(0.0, name="drop"), x, dy, precision="fp32")
    xt = leaf(x)
    y = F.dropout(xt, p=0.0, training=True)
    y.backward(torch.from_numpy(dy))
    assert_matches_torch({"y": engine["y"], "dx": engine["dx"]}, {"y": y, "dx": xt.grad}, rtol=0, what="dropout p=0")


@pytest.mark.parametrize("p", [0.2, 0.5])
def test_dropout_keep_rate_and_scale_match_torchs(p):
    x = np.ones((16, 32, 32, 8), np.float32)
    engine = run_layer(Dropout(p, name="drop"), x, x, precision="fp32")
    theirs = F.dropout(torch.from_numpy(x), p=p, training=True).numpy()
    ours = engine["y"]
    bound = 5 * np.sqrt(p * (1 - p) / x.size)
    for name, y in (("engine", ours), ("torch", theirs)):
        kept = y != 0
        assert abs(kept.mean() - (1 - p)) < bound, name
        np.testing.assert_allclose(y[kept], 1 / (1 - p), rtol=1e-6, err_msg=name)
    np.testing.assert_array_equal(engine["dx"], ours)   # backward masks with the forward's mask


@pytest.mark.parametrize("size, shape", [((2, 2), (8, 8, 3)), ((3, 4), (5, 7, 2)), ((6, 6), (13, 13, 4)),
                                         ((1, 1), (7, 7, 3))], ids=["divides", "overlapping", "alexnet-13to6", "global"])
def test_adaptive_average_pool_matches_torch(size, shape):
    x, = arrays(5, (3,) + shape)
    (dy,) = arrays(6, (3,) + size + (shape[2],))
    engine = run_layer(AdaptiveAveragePool2D(size, name="pool"), x, dy, precision="fp32")
    xt = leaf(to_nchw(x))
    y = F.adaptive_avg_pool2d(xt, size)
    y.backward(torch.from_numpy(to_nchw(dy)))
    assert_matches_torch({"y": engine["y"], "dx": engine["dx"]}, {"y": nhwc(y), "dx": nhwc(xt.grad)},
                         rtol=RTOL, atol=1e-6, what=f"adaptive pool {size}")
