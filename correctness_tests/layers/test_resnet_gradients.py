"""Gradient checks of the residual-network ops on the NumPy backend in float64 (see gradient_check.py).

BatchNorm2D in training mode (batch statistics: every input moves the mean and
variance) and in inference mode (running statistics: constants), plain, with
ReLU, with the residual add and with both; the residual Add; the global
average pool on a map and on a 1x1 map (a view); the running-statistics update
(torch's momentum convention, unbiased variance); a whole reduced ResNet-50,
whose fused block end must equal the unfused BN, Add, ReLU nodes; and the
parameter counts of the full network, which must equal torchvision's.
"""
from __future__ import annotations

import numpy as np
import pytest

from gpuengine.layers import Add, BatchNorm2D, GlobalAveragePool2D
from gpuengine.workloads import resnet

from ..gradient_check import assert_not_trivial, check_backward, random_weights
from ..layer_harness import run_layer, run_network

BATCH = 4
BN_VARIANTS = {"plain": dict(), "relu": dict(activation="relu"), "add": dict(residual=True),
               "add-relu": dict(activation="relu", residual=True)}


def maps(seed: int, shape=(3, 2, 5)) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((BATCH,) + shape) * 1.5 + 0.3


def bn_inputs(variant: str, seed: int = 1):
    x = maps(seed)
    return (x, maps(seed + 100)) if BN_VARIANTS[variant].get("residual") else x


def bn_weights(seed: int = 2) -> dict:
    rng = np.random.default_rng(seed)
    return {"bn.weight": 1.0 + 0.3 * rng.standard_normal(5), "bn.bias": 0.3 * rng.standard_normal(5)}


@pytest.mark.parametrize("variant", BN_VARIANTS, ids=list(BN_VARIANTS))
def test_batchnorm_training(variant):
    layer = BatchNorm2D(name="bn", **BN_VARIANTS[variant])
    assert_not_trivial(check_backward(layer, bn_inputs(variant), bn_weights(), seed=3))


@pytest.mark.parametrize("residual", [False, True], ids=["relu6", "add-relu6"])
def test_batchnorm_relu6_training_clips_at_both_ends(residual):
    """gamma near 4 puts BN's output past 6 as well as below 0: the ReLU6 passes no gradient at either clip."""
    weights = {"bn.weight": 4.0 + bn_weights()["bn.weight"], "bn.bias": bn_weights()["bn.bias"]}
    inputs = (maps(1), maps(101)) if residual else maps(1)
    y = run_layer(BatchNorm2D(name="bn", activation="relu6", residual=residual), inputs, maps(9),
                  weights=weights)["y"]
    assert (y == 6.0).mean() > 0.05 and (y == 0.0).mean() > 0.2 and ((y > 0) & (y < 6)).mean() > 0.2
    layer = BatchNorm2D(name="bn", activation="relu6", residual=residual)
    assert_not_trivial(check_backward(layer, inputs, weights, seed=3))


@pytest.mark.parametrize("variant", BN_VARIANTS, ids=list(BN_VARIANTS))
def test_batchnorm_inference_mode_uses_the_running_statistics(variant):
    rng = np.random.default_rng(4)
    running = {"bn.running_mean": rng.standard_normal(5), "bn.running_var": 0.5 + rng.random(5)}
    layer = BatchNorm2D(name="bn", **BN_VARIANTS[variant])
    pairs = check_backward(layer, bn_inputs(variant), bn_weights(), training=False, buffers=running, seed=5)
    assert_not_trivial(pairs)
    x = maps(1)
    y = run_layer(BatchNorm2D(name="bn"), x, x * 0, weights=bn_weights(), training=False, buffers=running)["y"]
    expected = ((x - running["bn.running_mean"]) / np.sqrt(running["bn.running_var"] + 1e-5)
                * bn_weights()["bn.weight"] + bn_weights()["bn.bias"])
    np.testing.assert_allclose(y, expected, rtol=1e-6, atol=1e-6)   # running statistics are float32


def test_batchnorm_without_input_gradient_still_makes_gamma_and_beta_gradients():
    assert_not_trivial(check_backward(BatchNorm2D(name="bn"), maps(6), bn_weights(), needs_input_grad=False, seed=6))


def test_batchnorm_training_output_is_normalized_and_running_statistics_follow_torch():
    x = maps(7)
    out = run_layer(BatchNorm2D(momentum=0.25, name="bn"), x, x * 0,
                    weights={"bn.weight": np.ones(5), "bn.bias": np.zeros(5)})
    y = out["y"].reshape(-1, 5)
    np.testing.assert_allclose(y.mean(axis=0), 0.0, atol=1e-12)
    np.testing.assert_allclose(y.var(axis=0), 1.0 / (1.0 + 1e-5 / x.reshape(-1, 5).var(axis=0)), rtol=1e-9)
    values = x.reshape(-1, 5)
    np.testing.assert_allclose(out["buffer:bn.running_mean"], 0.25 * values.mean(axis=0), rtol=1e-6)
    np.testing.assert_allclose(out["buffer:bn.running_var"], 0.75 + 0.25 * values.var(axis=0, ddof=1), rtol=1e-6)


@pytest.mark.parametrize("kwargs, message", [
    (dict(activation="tanh"), r"activation='tanh' is not accepted; use one of None, 'relu', 'relu6' \(the"),
    (dict(momentum=1.5), "momentum=1.5 is not accepted; use a finite number >= 0.0 and <= 1.0"),
    (dict(epsilon=0.0), "epsilon=0.0 is not accepted; use a finite number > 0.0"),
    (dict(epsilon="1e-5"), "epsilon='1e-5' is not accepted"), (dict(residual=1), "residual=1 is not accepted"),
])
def test_batchnorm_arguments_are_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BatchNorm2D(**kwargs)


def test_batchnorm_residual_of_another_shape_is_refused_by_name():
    with pytest.raises(ValueError, match="bn7: the residual"):
        BatchNorm2D(residual=True, name="bn7").output_shape((4, 4, 8), (4, 4, 16))


def test_batchnorm_parameters_and_running_statistics():
    layer = BatchNorm2D(name="bn")
    assert [(s.name, s.shape, s.init) for s in layer.param_specs((4, 4, 8))] == [
        ("bn.weight", (8,), "ones"), ("bn.bias", (8,), "zeros")]
    assert [(s.name, s.init) for s in layer.buffer_specs((4, 4, 8))] == [
        ("bn.running_mean", "zeros"), ("bn.running_var", "ones")]


def test_add():
    assert_not_trivial(check_backward(Add(name="add"), (maps(8), maps(9)), seed=8))


@pytest.mark.parametrize("shape", [(3, 2, 5), (1, 1, 7)], ids=["3x2-map", "1x1-map-view"])
def test_global_average_pool(shape):
    assert_not_trivial(check_backward(GlobalAveragePool2D(name="gap"), maps(10, shape), seed=10))


def smoke(seed: int = 11):
    rng = np.random.default_rng(seed)
    shape = resnet.SMOKE_SHAPE
    x = rng.random((3,) + shape.image_shape)
    return x, np.eye(shape.classes)[rng.integers(0, shape.classes, 3)]


def test_reduced_resnet_parameter_gradients():
    net = resnet.build_resnet(resnet.SMOKE_SHAPE)
    x, t = smoke()
    weights = random_weights(net.param_specs(), np.random.default_rng(12), scale=0.3)
    assert_not_trivial(check_backward(net, x, t, weights, seed=12))


def test_fused_block_end_equals_bn_add_relu_nodes():
    x, t = smoke(13)
    weights = random_weights(resnet.build_resnet(resnet.SMOKE_SHAPE).param_specs(), np.random.default_rng(14), 0.3)
    fused = run_network(resnet.build_resnet(resnet.SMOKE_SHAPE), x, t, weights=weights)
    unfused = run_network(resnet.build_resnet(resnet.SMOKE_SHAPE, fused=False), x, t, weights=weights)
    assert fused.pop("fused") is False and unfused.pop("fused") is False
    assert fused.keys() == unfused.keys()
    for key in fused:
        np.testing.assert_allclose(fused[key], unfused[key], rtol=1e-12, atol=1e-14, err_msg=key)


@pytest.mark.parametrize("shape, expected", [(resnet.SEED_SHAPE, 23_528_522), (resnet.CIFAR100_SHAPE, 23_712_932)])
def test_resnet50_has_torchvisions_parameter_count(shape, expected):
    net = resnet.build_resnet(shape)
    assert net.parameter_count() == resnet.parameter_count(shape) == expected
    assert net.output_shape == (shape.classes,)
    assert sum(1 for n in net.nodes if type(n.layer).__name__ == "Conv2D") == 53
    assert sum(1 for n in net.nodes if type(n.layer).__name__ == "BatchNorm2D") == 53


def test_resnet_names_its_parameters_like_torchvision():
    names = [s.name for s in resnet.build_resnet().param_specs()]
    assert names[:3] == ["conv1.weight", "bn1.weight", "bn1.bias"]
    assert "layer1.0.downsample.0.weight" in names and "layer4.2.bn3.bias" in names
    assert "layer1.1.downsample.0.weight" not in names and names[-2:] == ["fc.weight", "fc.bias"]

