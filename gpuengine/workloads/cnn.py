"""The MNIST CNN of seed note 001.

Conv 16@3x3 (stride 1, same padding, ReLU fused into the conv graph) ->
MaxPool 2x2/2 -> Flatten -> Dense 10, softmax cross-entropy, Adam lr 1e-3, on
10,000 28x28x1 images of 10 classes resident on the device; trained at batch
128 and 1024 for timed epochs after 2 warm-up epochs. 31,530 parameters (the
note's "about 31k"). The data are generated digits (data/formats/mnist.py) unless real
MNIST files are given; the CPU tier's smoke runs use a smaller image.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..data.formats.mnist import CLASSES, make_digits
from ..data.labels import training_arrays
from ..layers import Conv2D, Dense, Flatten, MaxPool2D, ReLU
from ..losses import SoftmaxCrossEntropy
from ..model.network import Sequential
from .workload import Workload

LEARNING_RATE = 1e-3
TRAIN_BATCHES = (128, 1024)
SAMPLES = 10_000
WARMUP_EPOCHS = 2


@dataclass(frozen=True)
class CNNShape:
    size: int = 28        # square images
    channels: int = 1
    filters: int = 16
    kernel: int = 3
    pool: int = 2
    classes: int = CLASSES

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return (self.size, self.size, self.channels)

    @property
    def pooled(self) -> int:
        return self.size // self.pool


SEED_SHAPE = CNNShape()
SMOKE_SHAPE = CNNShape(size=14, filters=4)    # CPU tier: exercises the harness, not the GPU


def build_cnn(shape: CNNShape = SEED_SHAPE, fused_relu: bool = True) -> Sequential:
    """The note's network; `fused_relu=False` puts the ReLU in a layer of its own (same math)."""
    conv = Conv2D(shape.filters, shape.kernel, padding="same", activation="relu" if fused_relu else None, name="conv")
    head = [MaxPool2D(shape.pool, name="pool"), Flatten(name="flatten"), Dense(shape.classes, name="dense")]
    body = [conv] + ([] if fused_relu else [ReLU(name="relu")]) + head
    return Sequential(body, SoftmaxCrossEntropy(), shape.image_shape)


def cnn_data(samples: int = SAMPLES, shape: CNNShape = SEED_SHAPE, seed: int = 0):
    """Generated digits as (x float32 (n, H, W, C) in [0, 1], t one-hot float32 (n, classes))."""
    if shape.channels != 1:
        raise ValueError("generated digits are grayscale; use channels=1")
    images, labels = make_digits(samples, seed, shape.classes, shape.size)
    return training_arrays(images, labels, shape.classes, "generated digits")


def parameter_count(shape: CNNShape = SEED_SHAPE) -> int:
    conv = shape.filters * shape.kernel * shape.kernel * shape.channels + shape.filters
    dense = shape.pooled * shape.pooled * shape.filters * shape.classes + shape.classes
    return conv + dense


WORKLOAD = Workload(
    "cnn", "CNN", "001", order=1,
    tests={"test_cnn_train": "training", "test_cnn_train_vs_keras": "training vs Keras",
           "test_cnn_streamed": "training, streamed data"},
    profiled=("test_cnn_train", "test_cnn_streamed"), batch=TRAIN_BATCHES[0], smoke_batch=32,
    twin="gpuengine.reference.torch_cnn", lr=LEARNING_RATE, build=build_cnn, data=cnn_data, seed_shape=SEED_SHAPE,
    smoke_shape=SMOKE_SHAPE)
