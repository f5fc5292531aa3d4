"""ResNet-50 v1.5 on CIFAR-10 / CIFAR-100 (seed note 002), and the zoo's ImageNet-size ResNet-18/50 (note 003).

The network (He et al. 2016, "Deep Residual Learning", with torchvision's v1.5
change: the stride of a downsampling bottleneck sits on its 3x3 convolution):
conv 7x7/2 -> BN -> ReLU -> max pool 3x3/2 (padding 1) -> bottleneck stages of
[3, 4, 6, 3] blocks (widths 64, 128, 256, 512, expansion 4) -> global average
pool -> Dense(classes), softmax cross-entropy, Adam lr 1e-3, batch 128, 50,000
32x32x3 images resident on the device. Convolutions under BatchNorm carry no
bias; a block's first unit projects its shortcut with a 1x1 convolution + BN
where the shape changes. On 32x32 inputs the stem leaves an 8x8 map and stage 4
a 1x1 map, so the average pool is the identity there (the note omitted it; we
keep it, implemented for any size).

Parameter names are torchvision's (`conv1.weight`, `layer2.0.downsample.1.bias`,
`fc.weight`), so the PyTorch twin maps one to one; conv weights are KRSC in the
engine and (out, in, kh, kw) in torch. 23,528,522 parameters for 10 classes and
23,712,932 for 100: torchvision's `resnet50(num_classes=C)` exactly.

`block="basic"` builds ResNet-18/34's units instead (3x3 -> 3x3, expansion 1,
the stride on the first 3x3, torchvision's `BasicBlock`): the same stem, stages,
shortcuts and names (`layer1.0.conv2.weight`). At 224x224 with 1000 classes
(`RESNET18_224`, `RESNET50_224`) these are torchvision's resnet18 (11,689,512
parameters) and resnet50 (25,557,032).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..data.labels import training_arrays
from ..layers import Activation, Add, BatchNorm2D, Conv2D, Dense, GlobalAveragePool2D, MaxPool2D
from ..losses import SoftmaxCrossEntropy
from ..model.network import INPUT, Network, NetworkBuilder
from .workload import Workload

LEARNING_RATE = 1e-3
TRAIN_BATCH = 128
SAMPLES = 50_000
WARMUP_EPOCHS = 2
BN_MOMENTUM = 0.1    # torch's convention: running = (1 - m) running + m batch
BN_EPSILON = 1e-5


@dataclass(frozen=True)
class ResNetShape:
    size: int = 32                         # square images
    channels: int = 3
    classes: int = 10
    stem_width: int = 64
    widths: tuple = (64, 128, 256, 512)    # bottleneck width of each stage
    blocks: tuple = (3, 4, 6, 3)           # bottlenecks per stage
    expansion: int = 4                     # a bottleneck's output is expansion x its width
    block: str = "bottleneck"              # or "basic" (ResNet-18/34: two 3x3s, expansion 1)

    def __post_init__(self):
        if self.block not in BLOCKS:
            raise ValueError(f"ResNetShape block {self.block!r} is not one of {', '.join(BLOCKS)}")
        if self.block == "basic" and self.expansion != 1:
            raise ValueError(f"a basic block does not expand its width; got expansion={self.expansion}")

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return (self.size, self.size, self.channels)

    @property
    def features(self) -> int:
        """Channels into the classifier."""
        return self.widths[-1] * self.expansion

    def with_classes(self, classes: int) -> "ResNetShape":
        return replace(self, classes=classes)


BLOCKS = ("bottleneck", "basic")
SEED_SHAPE = ResNetShape()
CIFAR100_SHAPE = SEED_SHAPE.with_classes(100)
# CPU tier: every kind of unit (stem, projection and identity blocks, strided 3x3s, the pool) at toy widths,
# each a multiple of 8 channels (cuDNN's bf16 batch norm reads 8 channels at a time).
SMOKE_SHAPE = ResNetShape(size=16, stem_width=8, widths=(8, 16), blocks=(2, 1), expansion=4)
# The model zoo (seed note 003): torchvision's ImageNet networks, and a basic-block smoke shape for the CPU tier.
RESNET50_224 = ResNetShape(size=224, classes=1000)
RESNET18_224 = ResNetShape(size=224, classes=1000, blocks=(2, 2, 2, 2), expansion=1, block="basic")
BASIC_SMOKE_SHAPE = ResNetShape(size=16, stem_width=8, widths=(8, 16), blocks=(2, 1), expansion=1, block="basic")


def resnet_data(samples: int = SAMPLES, shape: ResNetShape = SEED_SHAPE, seed: int = 0):
    """Generated CIFAR-like images as (x float32 (n, H, W, 3) in [0, 1], t one-hot float32 (n, classes))."""
    from ..data.formats.cifar import make_images
    images, labels = make_images(samples, shape.classes, seed, shape.size)
    return training_arrays(images, labels, shape.classes, "generated CIFAR-like images")


def parameter_count(shape: ResNetShape = SEED_SHAPE) -> int:
    """Trainable parameters (BN scale and shift included, running statistics not), counted from the shape."""
    count = shape.stem_width * 7 * 7 * shape.channels + 2 * shape.stem_width
    channels = shape.stem_width
    for stage, (width, blocks) in enumerate(zip(shape.widths, shape.blocks)):
        out = width * shape.expansion
        for block in range(blocks):
            if shape.block == "basic":
                count += 9 * channels * width + 9 * width * width + 4 * width   # two 3x3s + BNs
            else:
                count += channels * width + 2 * width            # 1x1 reduce + BN
                count += 9 * width * width + 2 * width           # 3x3 + BN
                count += width * out + 2 * out                   # 1x1 expand + BN
            if block == 0 and (channels != out or stage > 0):
                count += channels * out + 2 * out            # projection shortcut + BN
            channels = out
    return count + channels * shape.classes + shape.classes


def _bn(activation=None, residual=False) -> BatchNorm2D:
    return BatchNorm2D(activation, residual, momentum=BN_MOMENTUM, epsilon=BN_EPSILON)


def _block_end(b: NetworkBuilder, branch: str, shortcut: str, prefix: str, fused: bool, last: str = "bn3") -> str:
    """relu(BN(branch) + shortcut): one fused node, or BN, Add and ReLU nodes of their own (same math)."""
    if fused:
        return b.add(_bn("relu", residual=True), branch, shortcut, name=f"{prefix}.{last}")
    normalized = b.add(_bn(), branch, name=f"{prefix}.{last}")
    summed = b.add(Add(), normalized, shortcut, name=f"{prefix}.add")
    return b.add(Activation("relu"), summed, name=f"{prefix}.relu")


def _shortcut(b: NetworkBuilder, x: str, prefix: str, out: int, stride: int, project: bool) -> str:
    """The block's input itself, or its 1x1 (strided) projection + BN where the shape changes."""
    if not project:
        return x
    shortcut = b.add(Conv2D(out, 1, stride=stride, padding=0, use_bias=False), x, name=f"{prefix}.downsample.0")
    return b.add(_bn(), shortcut, name=f"{prefix}.downsample.1")


def _bottleneck(b: NetworkBuilder, x: str, prefix: str, width: int, out: int, stride: int, project: bool,
                fused: bool) -> str:
    """1x1 reduce -> 3x3 (the stride, v1.5) -> 1x1 expand, plus the identity or a projected shortcut."""
    h = b.add(Conv2D(width, 1, padding=0, use_bias=False), x, name=f"{prefix}.conv1")
    h = b.add(_bn("relu"), h, name=f"{prefix}.bn1")
    h = b.add(Conv2D(width, 3, stride=stride, padding=1, use_bias=False), h, name=f"{prefix}.conv2")
    h = b.add(_bn("relu"), h, name=f"{prefix}.bn2")
    h = b.add(Conv2D(out, 1, padding=0, use_bias=False), h, name=f"{prefix}.conv3")
    shortcut = _shortcut(b, x, prefix, out, stride, project)
    return _block_end(b, h, shortcut, prefix, fused)


def _basic(b: NetworkBuilder, x: str, prefix: str, width: int, out: int, stride: int, project: bool,
           fused: bool) -> str:
    """3x3 (the stride) -> 3x3, plus the identity or a projected shortcut (torchvision's BasicBlock)."""
    h = b.add(Conv2D(width, 3, stride=stride, padding=1, use_bias=False), x, name=f"{prefix}.conv1")
    h = b.add(_bn("relu"), h, name=f"{prefix}.bn1")
    h = b.add(Conv2D(out, 3, padding=1, use_bias=False), h, name=f"{prefix}.conv2")
    shortcut = _shortcut(b, x, prefix, out, stride, project)
    return _block_end(b, h, shortcut, prefix, fused, last="bn2")


def build_resnet(shape: ResNetShape = SEED_SHAPE, fused: bool = True) -> Network:
    """The network of `shape`; `fused=False` runs each block's BN, add and ReLU as separate nodes."""
    b = NetworkBuilder(shape.image_shape)
    x = b.add(Conv2D(shape.stem_width, 7, stride=2, padding=3, use_bias=False), INPUT, name="conv1")
    x = b.add(_bn("relu"), x, name="bn1")
    x = b.add(MaxPool2D(3, stride=2, padding=1), x, name="maxpool")
    channels = shape.stem_width
    for stage, (width, blocks) in enumerate(zip(shape.widths, shape.blocks)):
        out = width * shape.expansion
        for block in range(blocks):
            stride = 2 if block == 0 and stage > 0 else 1
            project = block == 0 and (channels != out or stride != 1)
            unit = _basic if shape.block == "basic" else _bottleneck
            x = unit(b, x, f"layer{stage + 1}.{block}", width, out, stride, project, fused)
            channels = out
    x = b.add(GlobalAveragePool2D(), x, name="avgpool")
    b.add(Dense(shape.classes), x, name="fc")
    return b.network(SoftmaxCrossEntropy())


WORKLOAD = Workload(
    "resnet", "ResNet-50", "002", order=2, tests={"test_resnet_train": "training"},
    profiled=("test_resnet_train",), batch=TRAIN_BATCH, smoke_batch=16, twin="gpuengine.reference.torch_resnet",
    lr=LEARNING_RATE, build=build_resnet, data=resnet_data, seed_shape=SEED_SHAPE, smoke_shape=SMOKE_SHAPE)
