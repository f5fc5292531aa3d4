"""The zoo's networks (workloads/zoo.py) on the NumPy backend: sizes, names, gradients, dropout in training.

At 224x224 with 1000 classes every network has torchvision's parameter count
and names; each reduced variant passes a float64 gradient check of every
parameter (AlexNet and VGG with their dropout on: a fixed mask per step);
the basic-block ResNet's fused block end equals BN, Add and ReLU nodes; and
the trainer advances every dropout layer's draw once per step, so each step
draws a fresh mask.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from gpuengine.config import EngineConfig
from gpuengine.layers import Dropout
from gpuengine.trainer import Trainer
from gpuengine.workloads import resnet, zoo

from ..gradient_check import assert_not_trivial, check_backward, random_weights
from ..layer_harness import run_network

TORCHVISION_NAMES = {   # a few of each network's torchvision state_dict parameter names
    "alexnet": ["features.0.weight", "features.10.bias", "classifier.1.weight", "classifier.6.bias"],
    "resnet18": ["conv1.weight", "layer1.0.conv2.weight", "layer2.0.downsample.1.bias", "fc.weight"],
    "resnet50": ["layer1.0.conv3.weight", "layer4.2.bn3.bias", "fc.bias"],
    "vgg16": ["features.0.weight", "features.28.bias", "classifier.0.weight", "classifier.6.weight"],
    "mobilenet_v2": ["features.0.0.weight", "features.1.conv.0.0.weight", "features.1.conv.2.bias",
                     "features.17.conv.1.0.weight", "features.17.conv.3.weight", "features.18.1.bias",
                     "classifier.1.weight"],
}


@pytest.mark.parametrize("name", zoo.NAMES)
def test_full_size_network_matches_torchvision_in_parameters_and_names(name):
    entry = zoo.zoo_net(name)
    net = entry.network()
    assert net.input_shape == (224, 224, 3) and net.output_shape == (1000,)
    assert net.parameter_count() == entry.torchvision_parameters
    names = [s.name for s in net.param_specs()]
    assert len(set(names)) == len(names)
    assert set(TORCHVISION_NAMES[name]) <= set(names)


def test_mobilenet_v2_structure():
    net = zoo.zoo_net("mobilenet_v2").network()
    convs = [n.layer for n in net.nodes if type(n.layer).__name__ == "Conv2D"]
    depthwise = [c for c in convs if c.groups > 1]
    assert len(convs) == 52 and len(depthwise) == 17
    assert all(c.groups == c.filters for c in depthwise)
    residual = [n for n in net.nodes if len(n.inputs) == 2]
    assert len(residual) == 10   # blocks whose stride is 1 and whose width does not change
    assert net.shapes["features.18.1"] == (7, 7, 1280)
    relu6 = [n.layer for n in net.nodes if getattr(n.layer, "activation", None) == "relu6"]
    assert len(relu6) == 35 and all(type(b).__name__ == "BatchNorm2D" for b in relu6)   # fused into their BNs


def test_alexnet_and_vgg_pool_224_maps_without_resampling():
    for name, size in (("alexnet", 6), ("vgg16", 7)):
        net = zoo.zoo_net(name).network()
        (node,) = [n for n in net.nodes if n.name == "avgpool"]
        assert net.shapes[node.inputs[0]][:2] == (size, size) == net.shapes["avgpool"][:2]


@pytest.mark.parametrize("name", zoo.NAMES)
def test_reduced_network_parameter_gradients(name):
    """(MobileNetV2 at 32x32: on its 64x64 maps some ReLU6 input lies within a step of a clip point.)"""
    shape = zoo.zoo_net(name).reduced
    if name == "mobilenet_v2":
        shape = replace(shape, size=32)
    net = zoo.zoo_net(name).build(shape, True)
    rng = np.random.default_rng(1)
    x = rng.random((3, shape.size, shape.size, 3))
    t = np.eye(shape.classes)[rng.integers(0, shape.classes, 3)]
    weights = random_weights(net.param_specs(), np.random.default_rng(2), scale=0.3)
    assert_not_trivial(check_backward(net, x, t, weights, seed=3))


def test_basic_block_fused_end_equals_bn_add_relu_nodes():
    rng = np.random.default_rng(4)
    shape = resnet.BASIC_SMOKE_SHAPE
    x, t = rng.random((3,) + shape.image_shape), np.eye(shape.classes)[rng.integers(0, shape.classes, 3)]
    weights = random_weights(resnet.build_resnet(shape).param_specs(), np.random.default_rng(5), 0.3)
    fused = run_network(resnet.build_resnet(shape), x, t, weights=weights)
    unfused = run_network(resnet.build_resnet(shape, fused=False), x, t, weights=weights)
    fused.pop("fused"), unfused.pop("fused")
    for key in fused:
        np.testing.assert_allclose(fused[key], unfused[key], rtol=1e-12, atol=1e-14, err_msg=key)


def test_dropout_draws_once_per_training_step():
    net = zoo.zoo_net("alexnet").network(reduced=True)
    shape = zoo.zoo_net("alexnet").reduced
    x, t = zoo.zoo_data(32, shape.size, shape.classes, seed=6)
    trainer = Trainer(net, x, t, 8, EngineConfig(device="cpu", precision="fp32", cuda_graph=0))
    trainer.train(1)   # the warm-up epoch and one epoch: 8 steps
    dropouts = [layer for layer in trainer.program.body if isinstance(layer, Dropout)]
    assert [d.name for d in dropouts] == ["classifier.0", "classifier.3"]
    assert [int(d.draw[0]) for d in dropouts] == [trainer.steps_done] * 2 and trainer.steps_done == 8


def test_networks_without_dropout_leave_the_nodes_out():
    for name in ("alexnet", "vgg16", "mobilenet_v2"):
        net = zoo.zoo_net(name).network(dropout=False)
        assert not any(isinstance(n.layer, Dropout) for n in net.nodes)
        assert net.parameter_count() == zoo.zoo_net(name).torchvision_parameters


def test_unknown_network_is_refused_naming_the_zoo():
    with pytest.raises(ValueError, match="no zoo network 'lenet'; the zoo has alexnet, resnet18"):
        zoo.zoo_net("lenet")


def test_make_divisible_rounds_like_torchvision():
    assert [zoo.make_divisible(v) for v in (32 * 0.25, 16 * 0.25, 96 * 0.25, 1280, 8 * 1.4)] == [8, 8, 24, 1280, 16]
