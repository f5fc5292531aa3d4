"""PyTorch references of the model zoo (seed note 003): torchvision's own models, and hand-written twins.

On a GPU the references are torchvision's `alexnet`, `resnet18`, `resnet50`,
`vgg16` and `mobilenet_v2` themselves (real code nobody here wrote), trained
in channels-last by the shared runners (torch_common.py). torchvision does not
import with every torch build (the CPU machines' torch 2.13 cannot load its
wheel): `torchvision_unavailable()` says why, and the suite skips with it.

For the CPU tier's reduced variants the twins are written out here with
torchvision's module structure and names (`features`, `avgpool`,
`classifier`; MobileNetV2's `features.N.conv.M` inverted residuals of
Conv2d-BatchNorm2d-ReLU6 triples), and ResNets come from torch_resnet.py, so
the engine's weights load into either by name. Two layouts differ: conv
filters (KRSC here, OIHW in torch, torch_resnet's relayout) and the first
dense layer after a flatten, whose inputs are (h, w, c)-ordered here and
(c, h, w)-ordered in torch (`flatten_columns_to_torch` moves them).
"""
from __future__ import annotations

import importlib.util
from typing import Mapping

import numpy as np
import torch
from torch import nn

from ..layers import Dense, Dropout, Flatten
from ..model.network import Network
from ..workloads import zoo
from ..workloads.resnet import BN_EPSILON, BN_MOMENTUM, ResNetShape
from . import torch_resnet
from .torch_common import ReferenceUnavailable, TorchTrainRunner, host_array, to_nchw


def torchvision_unavailable() -> str | None:
    """Why torchvision's models cannot be built here, or None when they can."""
    if importlib.util.find_spec("torchvision") is None:
        return f"torchvision is not installed next to torch {torch.__version__}: no torchvision zoo reference"
    try:
        import torchvision.models  # noqa: F401
    except Exception as exc:   # a wheel built for another torch fails in several ways; all mean "no reference"
        return f"torchvision does not import with torch {torch.__version__}: {type(exc).__name__}: {exc}"
    return None


def torchvision_model(name: str, classes: int = 1000) -> nn.Module:
    """torchvision's untrained `name` (no download), or ReferenceUnavailable saying why not."""
    reason = torchvision_unavailable()
    if reason:
        raise ReferenceUnavailable(reason)
    import torchvision.models as models
    zoo.zoo_net(name)   # an unknown name fails here, naming the zoo
    return getattr(models, name)(weights=None, num_classes=classes)


def _bn(channels: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(channels, eps=BN_EPSILON, momentum=BN_MOMENTUM)


class _FeaturesPoolClassifier(nn.Module):
    """torchvision's AlexNet and VGG: `features`, `avgpool`, flatten, `classifier`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:   # (N, 3, H, W) -> (N, classes)
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


class TorchAlexNet(_FeaturesPoolClassifier):
    def __init__(self, shape: zoo.AlexNetShape):
        super().__init__()
        w = shape.widths
        self.features = nn.Sequential(
            nn.Conv2d(3, w[0], 11, stride=4, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(3, stride=2),
            nn.Conv2d(w[0], w[1], 5, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(3, stride=2),
            nn.Conv2d(w[1], w[2], 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(w[2], w[3], 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(w[3], w[4], 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(3, stride=2))
        self.avgpool = nn.AdaptiveAvgPool2d(shape.pool_to)
        features = w[4] * shape.pool_to ** 2
        self.classifier = nn.Sequential(
            nn.Dropout(shape.dropout), nn.Linear(features, shape.hidden), nn.ReLU(inplace=True),
            nn.Dropout(shape.dropout), nn.Linear(shape.hidden, shape.hidden), nn.ReLU(inplace=True),
            nn.Linear(shape.hidden, shape.classes))


class TorchVGG(_FeaturesPoolClassifier):
    def __init__(self, shape: zoo.VGGShape):
        super().__init__()
        layers, channels = [], 3
        for width, convs in zip(shape.widths, shape.convs):
            for _ in range(convs):
                layers += [nn.Conv2d(channels, width, 3, padding=1), nn.ReLU(inplace=True)]
                channels = width
            layers.append(nn.MaxPool2d(2))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(shape.pool_to)
        self.classifier = nn.Sequential(
            nn.Linear(channels * shape.pool_to ** 2, shape.hidden), nn.ReLU(inplace=True), nn.Dropout(shape.dropout),
            nn.Linear(shape.hidden, shape.hidden), nn.ReLU(inplace=True), nn.Dropout(shape.dropout),
            nn.Linear(shape.hidden, shape.classes))


def _conv_bn_relu6(channels: int, out: int, kernel: int, stride: int = 1, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(channels, out, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
                         _bn(out), nn.ReLU6(inplace=True))


class InvertedResidual(nn.Module):
    def __init__(self, channels: int, out: int, stride: int, expansion: int):
        super().__init__()
        hidden = int(round(channels * expansion))
        self.use_residual = stride == 1 and channels == out
        layers = [_conv_bn_relu6(channels, hidden, 1)] if expansion != 1 else []
        layers += [_conv_bn_relu6(hidden, hidden, 3, stride, groups=hidden), nn.Conv2d(hidden, out, 1, bias=False),
                   _bn(out)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.use_residual else self.conv(x)


class TorchMobileNetV2(nn.Module):
    def __init__(self, shape: zoo.MobileNetShape):
        super().__init__()
        channels = zoo.make_divisible(shape.stem * shape.width_mult)
        layers = [_conv_bn_relu6(3, channels, 3, 2)]
        for expansion, c, repeats, first_stride in shape.blocks:
            out = zoo.make_divisible(c * shape.width_mult)
            for i in range(repeats):
                layers.append(InvertedResidual(channels, out, first_stride if i == 0 else 1, expansion))
                channels = out
        last = zoo.make_divisible(shape.last_channel * max(1.0, shape.width_mult))
        layers.append(_conv_bn_relu6(channels, last, 1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(shape.dropout), nn.Linear(last, shape.classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


def twin_model(name: str, shape) -> nn.Module:
    """The hand-written twin of zoo network `name` at `shape` (torchvision's structure and names)."""
    if isinstance(shape, ResNetShape):
        return torch_resnet.TorchResNet(shape)
    builders = {"alexnet": TorchAlexNet, "vgg16": TorchVGG, "mobilenet_v2": TorchMobileNetV2}
    return builders[zoo.zoo_net(name).name](shape)


def disable_dropout(model: nn.Module) -> nn.Module:
    """Every dropout of the model at p = 0 (the engine's `dropout=False` networks)."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    return model


def flattened_dense_layers(net: Network) -> dict[str, tuple]:
    """{dense layer name: the (h, w, c) map its flattened input came from} for dense layers fed by a Flatten."""
    by_name = {n.name: n for n in net.nodes}
    found = {}
    for node in net.nodes:
        if not isinstance(node.layer, Dense):
            continue
        source = by_name.get(node.inputs[0])
        while source is not None and isinstance(source.layer, Dropout):
            source = by_name.get(source.inputs[0])
        if source is not None and isinstance(source.layer, Flatten):
            found[node.name] = tuple(net.shapes[source.inputs[0]])
    return found


def _move_columns(weights: Mapping, net: Network, to_torch: bool) -> dict:
    moved = dict(weights)
    for name, (h, w, c) in flattened_dense_layers(net).items():
        key = f"{name}.weight"
        if key in moved:
            value = host_array(moved[key])
            units = value.shape[0]
            order = (value.reshape(units, h, w, c).transpose(0, 3, 1, 2) if to_torch
                     else value.reshape(units, c, h, w).transpose(0, 2, 3, 1))
            moved[key] = np.ascontiguousarray(order.reshape(units, -1))
    return moved


def flatten_columns_to_torch(weights: Mapping, net: Network) -> dict:
    """Engine weights with each flattened dense layer's columns in torch's (c, h, w) order."""
    return _move_columns(weights, net, to_torch=True)


def engine_to_torch(weights: Mapping, net: Network) -> dict[str, np.ndarray]:
    """Engine parameters or gradients in torch's layouts: filters OIHW, flattened dense columns (c, h, w)."""
    return torch_resnet.engine_to_torch(flatten_columns_to_torch(weights, net))


def torch_to_engine(weights: Mapping, net: Network) -> dict[str, np.ndarray]:
    """Torch parameters or gradients in the engine's layouts."""
    return _move_columns(torch_resnet.torch_to_engine(weights), net, to_torch=False)


def load_engine_state(model: nn.Module, net: Network, weights: Mapping, buffers: Mapping | None = None) -> nn.Module:
    """The engine's weights (and BN running statistics) into `model`: every name, every shape, or nothing."""
    torch_resnet.load_weights(model, flatten_columns_to_torch(weights, net))
    if buffers is not None:
        torch_resnet.load_buffers(model, buffers)
    return model


def zoo_train_runner(mode: str, network: str, x: np.ndarray, t: np.ndarray, batch_size: int, precision: str,
                     weights: Mapping, buffers: Mapping, reduced: bool = False, torchvision: bool = True,
                     lr: float = zoo.LEARNING_RATE, device: str = "cuda", seed: int = 0,
                     runner=TorchTrainRunner, **runner_options) -> TorchTrainRunner:
    """A PyTorch runner of zoo network `network` on engine arrays, starting from the engine's weights.

    torchvision's model where `torchvision` (full size only), else the hand-written twin; channels-last
    except in torch_eager (the loop as written). `runner` picks the runner class (torch_host_batches.py streams
    batches from pinned host memory); `runner_options` go to it.
    """
    entry = zoo.zoo_net(network)
    shape = entry.shape(reduced)
    if torchvision and reduced:
        raise ValueError("torchvision builds the full-size networks only; the reduced variants use the twins")
    model = torchvision_model(network, shape.classes) if torchvision else twin_model(network, shape)
    load_engine_state(model, entry.network(reduced), weights, buffers)
    channels_last = runner_options.pop("channels_last", mode != "torch_eager")
    return runner(mode, model, nn.functional.cross_entropy, to_nchw(x), t.astype(np.float32, copy=False),
                  batch_size, precision, lr, device, seed, channels_last=channels_last, **runner_options)
