"""The 224x224 model zoo of seed note 003: alexnet, resnet18, resnet50, vgg16, mobilenet_v2 at batch 16.

Each network is torchvision's, node for node, with torchvision's parameter
names (`features.0.weight`, `classifier.1.bias`, `features.3.conv.1.0.weight`),
so weights map one to one (conv filters KRSC here, (out, in / groups, kh, kw)
in torch; the first dense layer after a flatten reads (h, w, c) here and
(c, h, w) in torch: reference/torch_zoo.py moves its columns). At 224x224x3
with 1000 classes the parameter counts are torchvision's exactly (alexnet
61,100,840; resnet18 11,689,512; resnet50 25,557,032; vgg16 138,357,544;
mobilenet_v2 3,504,872).

- AlexNet (Krizhevsky et al. 2012, torchvision's one-tower variant): five
  conv + ReLU, three 3x3/2 max pools, adaptive average pool to 6x6, then
  dropout, 9216 -> 4096, ReLU, dropout, 4096 -> 4096, ReLU, 4096 -> classes.
- VGG-16 (Simonyan & Zisserman 2014, configuration D, no batch norm): 13 3x3
  conv + ReLU in five stages closed by 2x2 max pools, adaptive pool to 7x7,
  25088 -> 4096, ReLU, dropout, 4096 -> 4096, ReLU, dropout, 4096 -> classes.
- MobileNetV2 (Sandler et al. 2018): a 3x3/2 stem, 17 inverted residual
  blocks (1x1 expand + BN + ReLU6, 3x3 depthwise + BN + ReLU6, 1x1 project +
  BN, the residual add where shapes allow, fused into the last BN), a 1x1 to
  1280 + BN + ReLU6, global average pool, dropout 0.2, dense to classes.
  Each ReLU6 is fused into its BN node (one kernel fewer each way a layer).
  Channel counts follow torchvision's rounding to multiples of 8.
- ResNet-18 and ResNet-50: workloads/resnet.py at 224x224 (basic and
  bottleneck blocks).

AlexNet's, VGG's and MobileNetV2's convolutions are He-initialised in fan-out
mode as torchvision's are (VGG has no batch norm, and Glorot's variance
halving at each of its 13 ReLUs left the reduced VGG untrainable); the ResNets
keep resnet.py's Glorot (their BNs renormalise), dense layers Glorot too.
Dropout uses torchvision's rates; `dropout=False` leaves those nodes out (the
parity tests: torch in eval mode or dropout off computes the same function).
Every network also has a reduced variant (small images, narrow layers, 10
classes) of the same structure for the CPU tier. The data are generated
images (data/formats/cifar.py's learnable patterns) at the network's size.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..data.labels import training_arrays
from ..layers import (Activation, AdaptiveAveragePool2D, BatchNorm2D, Conv2D, Dense, Dropout, Flatten,
    GlobalAveragePool2D, MaxPool2D)
from ..losses import SoftmaxCrossEntropy
from ..model.network import INPUT, Network, NetworkBuilder
from . import resnet
from .workload import Workload

BATCH = 16                # seed note 003
LEARNING_RATE = 1e-4      # Adam; the note gives none, and VGG/AlexNet (no batch norm) diverge at 1e-3 from Glorot init
WARMUP_EPOCHS = 2
NAMES = ("alexnet", "resnet18", "resnet50", "vgg16", "mobilenet_v2")


@dataclass(frozen=True)
class AlexNetShape:
    size: int = 224
    classes: int = 1000
    widths: tuple = (64, 192, 384, 256, 256)
    hidden: int = 4096
    pool_to: int = 6
    dropout: float = 0.5


@dataclass(frozen=True)
class VGGShape:
    size: int = 224
    classes: int = 1000
    widths: tuple = (64, 128, 256, 512, 512)
    convs: tuple = (2, 2, 3, 3, 3)           # configuration D
    hidden: int = 4096
    pool_to: int = 7
    dropout: float = 0.5


@dataclass(frozen=True)
class MobileNetShape:
    size: int = 224
    classes: int = 1000
    width_mult: float = 1.0
    stem: int = 32
    last_channel: int = 1280
    blocks: tuple = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                     (6, 320, 1, 1))         # (expansion t, channels c, repeats n, first stride s)
    dropout: float = 0.2


def _conv_relu(b: NetworkBuilder, x: str, filters: int, kernel: int, stride: int, padding: int, name: str) -> str:
    """Conv + bias + ReLU, He-initialised as torchvision does (Glorot's variance halves at every ReLU)."""
    return b.add(Conv2D(filters, kernel, stride=stride, padding=padding, activation="relu", init="he_fan_out"), x,
                 name=name)


def _classifier(b: NetworkBuilder, x: str, layers: list, dropout: bool) -> str:
    """`layers`: (torchvision index, "dropout" | "relu" | units) in order; dropout nodes only when `dropout`."""
    for index, kind in layers:
        name = f"classifier.{index}"
        if kind == "relu":
            x = b.add(Activation("relu"), x, name=name)
        elif isinstance(kind, float):
            x = b.add(Dropout(kind), x, name=name) if dropout and kind > 0 else x
        else:
            x = b.add(Dense(kind), x, name=name)
    return x


def build_alexnet(shape: AlexNetShape = AlexNetShape(), dropout: bool = True) -> Network:
    b = NetworkBuilder((shape.size, shape.size, 3))
    w = shape.widths
    x = _conv_relu(b, INPUT, w[0], 11, 4, 2, "features.0")
    x = b.add(MaxPool2D(3, stride=2), x, name="features.2")
    x = _conv_relu(b, x, w[1], 5, 1, 2, "features.3")
    x = b.add(MaxPool2D(3, stride=2), x, name="features.5")
    x = _conv_relu(b, x, w[2], 3, 1, 1, "features.6")
    x = _conv_relu(b, x, w[3], 3, 1, 1, "features.8")
    x = _conv_relu(b, x, w[4], 3, 1, 1, "features.10")
    x = b.add(MaxPool2D(3, stride=2), x, name="features.12")
    x = b.add(AdaptiveAveragePool2D(shape.pool_to), x, name="avgpool")
    x = b.add(Flatten(), x, name="flatten")
    p = shape.dropout
    _classifier(b, x, [(0, p), (1, shape.hidden), (2, "relu"), (3, p), (4, shape.hidden), (5, "relu"),
                       (6, shape.classes)], dropout)
    return b.network(SoftmaxCrossEntropy())


def build_vgg16(shape: VGGShape = VGGShape(), dropout: bool = True) -> Network:
    b = NetworkBuilder((shape.size, shape.size, 3))
    x, index = INPUT, 0
    for width, convs in zip(shape.widths, shape.convs):
        for _ in range(convs):
            x = _conv_relu(b, x, width, 3, 1, 1, f"features.{index}")
            index += 2   # torchvision's ReLU module takes the next index
        x = b.add(MaxPool2D(2), x, name=f"features.{index}")
        index += 1
    x = b.add(AdaptiveAveragePool2D(shape.pool_to), x, name="avgpool")
    x = b.add(Flatten(), x, name="flatten")
    p = shape.dropout
    _classifier(b, x, [(0, shape.hidden), (1, "relu"), (2, p), (3, shape.hidden), (4, "relu"), (5, p),
                       (6, shape.classes)], dropout)
    return b.network(SoftmaxCrossEntropy())


def make_divisible(value: float, divisor: int = 8) -> int:
    """torchvision's channel rounding: the nearest multiple of `divisor`, never more than 10% below `value`."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


def _bn(activation=None, residual=False) -> BatchNorm2D:
    return BatchNorm2D(activation, residual, momentum=resnet.BN_MOMENTUM, epsilon=resnet.BN_EPSILON)


def _conv_bn_relu6(b: NetworkBuilder, x: str, filters: int, kernel: int, stride: int, prefix: str,
                   groups: int = 1) -> str:
    """torchvision's Conv2dNormActivation: conv (no bias) `prefix.0`, BN `prefix.1` with ReLU6 (`prefix.2`) fused in."""
    x = b.add(Conv2D(filters, kernel, stride=stride, padding=(kernel - 1) // 2, use_bias=False, groups=groups,
                     init="he_fan_out"), x, name=f"{prefix}.0")
    return b.add(_bn("relu6"), x, name=f"{prefix}.1")


def _inverted_residual(b: NetworkBuilder, x: str, prefix: str, channels: int, out: int, stride: int,
                       expansion: int) -> str:
    hidden = int(round(channels * expansion))
    h, unit = x, 0
    if expansion != 1:
        h = _conv_bn_relu6(b, h, hidden, 1, 1, f"{prefix}.conv.0")
        unit = 1
    h = _conv_bn_relu6(b, h, hidden, 3, stride, f"{prefix}.conv.{unit}", groups=hidden)   # depthwise
    h = b.add(Conv2D(out, 1, padding=0, use_bias=False, init="he_fan_out"), h, name=f"{prefix}.conv.{unit + 1}")
    if stride == 1 and channels == out:   # the residual add, fused into the projection's BN
        return b.add(_bn(residual=True), h, x, name=f"{prefix}.conv.{unit + 2}")
    return b.add(_bn(), h, name=f"{prefix}.conv.{unit + 2}")


def build_mobilenet_v2(shape: MobileNetShape = MobileNetShape(), dropout: bool = True) -> Network:
    b = NetworkBuilder((shape.size, shape.size, 3))
    channels = make_divisible(shape.stem * shape.width_mult)
    x = _conv_bn_relu6(b, INPUT, channels, 3, 2, "features.0")
    index = 1
    for expansion, c, repeats, first_stride in shape.blocks:
        out = make_divisible(c * shape.width_mult)
        for i in range(repeats):
            x = _inverted_residual(b, x, f"features.{index}", channels, out, first_stride if i == 0 else 1, expansion)
            channels, index = out, index + 1
    x = _conv_bn_relu6(b, x, make_divisible(shape.last_channel * max(1.0, shape.width_mult)), 1, 1,
                       f"features.{index}")
    x = b.add(GlobalAveragePool2D(), x, name="avgpool")
    _classifier(b, x, [(0, shape.dropout), (1, shape.classes)], dropout)
    return b.network(SoftmaxCrossEntropy())


@dataclass(frozen=True)
class ZooNet:
    """One network of the zoo: how to build it, at full size and reduced, and torchvision's parameter count."""

    name: str
    build: Callable[..., Network]     # build(shape, dropout) -> Network
    full: object
    reduced: object
    torchvision_parameters: int

    def network(self, reduced: bool = False, dropout: bool = True) -> Network:
        return self.build(self.reduced if reduced else self.full, dropout)

    def shape(self, reduced: bool = False):
        return self.reduced if reduced else self.full


def _resnet(shape: resnet.ResNetShape, dropout: bool = True) -> Network:
    return resnet.build_resnet(shape)   # no dropout in a ResNet


# Reduced variants: every kind of node at toy widths (multiples of 8: cuDNN's bf16 batch norm reads 8 channels
# at a time); AlexNet's 96x96 input leaves a 2x2 map that the adaptive pool spreads over 6x6, VGG's a 1x1 map;
# MobileNetV2 at 64x64 keeps 2x2 maps at its end (batch norm over 1x1 maps of a few samples would not learn).
# Their dropout is 0.1: at 0.5 a 64-unit classifier learns too slowly for the CPU tier's few steps.
ZOO = {
    "alexnet": ZooNet("alexnet", build_alexnet, AlexNetShape(),
                      AlexNetShape(size=96, classes=10, widths=(8, 16, 16, 8, 8), hidden=64, dropout=0.1), 61_100_840),
    "resnet18": ZooNet("resnet18", _resnet, resnet.RESNET18_224, resnet.BASIC_SMOKE_SHAPE, 11_689_512),
    "resnet50": ZooNet("resnet50", _resnet, resnet.RESNET50_224, resnet.SMOKE_SHAPE, 25_557_032),
    "vgg16": ZooNet("vgg16", build_vgg16, VGGShape(),
                    VGGShape(size=32, classes=10, widths=(8, 8, 16, 16, 16), hidden=64, dropout=0.1), 138_357_544),
    "mobilenet_v2": ZooNet("mobilenet_v2", build_mobilenet_v2, MobileNetShape(),
                           MobileNetShape(size=64, classes=10, width_mult=0.5, last_channel=64), 3_504_872),
}


def zoo_net(name: str) -> ZooNet:
    if name not in ZOO:
        raise ValueError(f"no zoo network {name!r}; the zoo has {', '.join(NAMES)}")
    return ZOO[name]


def zoo_data(samples: int, size: int, classes: int, seed: int = 0):
    """Generated learnable images (n, size, size, 3) in [0, 1] and one-hot targets (n, classes)."""
    from ..data.formats.cifar import make_images
    images, labels = make_images(samples, classes, seed, size)
    return training_arrays(images, labels, classes, "generated zoo images")


# A family: its networks are chosen by name (`zoo:alexnet`), each built by zoo_net(name).
WORKLOAD = Workload(
    "zoo", "Model zoo", "003", order=4, tests={"test_zoo_train": "training"}, profiled=("test_zoo_train",),
    batch=BATCH, smoke_batch=8, twin="gpuengine.reference.torch_zoo", lr=LEARNING_RATE, members=NAMES)
