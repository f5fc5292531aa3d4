"""Keras references of the model zoo (seed note 003's TF2 baseline, docs/seeds.md; `tf_keras`).

The note timed TensorFlow 2's Keras applications. `keras.applications` has
VGG16, ResNet50 and MobileNetV2 (untrained: `weights=None`); AlexNet is written
out here as a `Sequential` of torchvision's one-tower layout (Keras is NHWC and
flattens in (h, w, c) order like the engine); Keras has no ResNet-18, so that
reference states why it cannot be built. Keras' own architectures differ from
torchvision's in places, so only VGG16 (138,357,544) and AlexNet have the
engine's parameter count: Keras' ResNet50 keeps convolution biases under batch
norm (25,636,712) and its MobileNetV2 rounds some widths differently
(3,538,984). The runner is tf_common's `KerasFitRunner` (`model.fit` streaming
from host arrays, as the note ran it), at the network's full size only.
"""
from __future__ import annotations

import numpy as np

from ..workloads import zoo
from .tf_common import KerasFitRunner, TensorFlowUnavailable, require_tensorflow

APPLICATIONS = {"vgg16": "VGG16", "resnet50": "ResNet50", "mobilenet_v2": "MobileNetV2"}
KERAS_PARAMETERS = {"alexnet": 61_100_840, "vgg16": 138_357_544, "resnet50": 25_636_712, "mobilenet_v2": 3_538_984}


def keras_unavailable(name: str) -> str | None:
    """Why the Keras reference of zoo network `name` cannot be built, or None when it can."""
    zoo.zoo_net(name)
    if name not in KERAS_PARAMETERS:
        return f"keras.applications has no {name}: no tf_keras reference for it"
    try:
        require_tensorflow()
    except TensorFlowUnavailable as exc:
        return str(exc)
    return None


def build_keras_alexnet(shape: zoo.AlexNetShape, policy: str):
    import keras
    layers, w = keras.layers, shape.widths
    conv = dict(activation="relu", dtype=policy)
    return keras.Sequential([
        keras.Input(shape=(shape.size, shape.size, 3)),
        layers.ZeroPadding2D(2, dtype=policy), layers.Conv2D(w[0], 11, strides=4, **conv),
        layers.MaxPooling2D(3, strides=2, dtype=policy),
        layers.Conv2D(w[1], 5, padding="same", **conv), layers.MaxPooling2D(3, strides=2, dtype=policy),
        layers.Conv2D(w[2], 3, padding="same", **conv), layers.Conv2D(w[3], 3, padding="same", **conv),
        layers.Conv2D(w[4], 3, padding="same", **conv), layers.MaxPooling2D(3, strides=2, dtype=policy),
        layers.Flatten(dtype=policy),   # 6x6 maps at 224: torchvision's adaptive pool is the identity there
        layers.Dropout(shape.dropout, dtype=policy), layers.Dense(shape.hidden, activation="relu", dtype=policy),
        layers.Dropout(shape.dropout, dtype=policy), layers.Dense(shape.hidden, activation="relu", dtype=policy),
        layers.Dense(shape.classes, dtype=policy),
    ])


def build_keras_model(name: str, policy: str = "float32"):
    """The untrained Keras model of zoo network `name` at 224x224x3 with 1000 classes."""
    reason = keras_unavailable(name)
    if reason:
        raise TensorFlowUnavailable(reason)
    import keras
    shape = zoo.zoo_net(name).full
    if name == "alexnet":
        return build_keras_alexnet(shape, policy)
    keras.mixed_precision.set_global_policy(policy)   # applications take no dtype argument
    try:
        return getattr(keras.applications, APPLICATIONS[name])(weights=None, input_shape=(shape.size, shape.size, 3),
                                                               classes=shape.classes, classifier_activation=None)
    finally:
        keras.mixed_precision.set_global_policy("float32")


def zoo_fit_runner(name: str, x: np.ndarray, t: np.ndarray, batch_size: int, precision: str,
                   lr: float = zoo.LEARNING_RATE, epochs_per_round: int = 1, seed: int = 0) -> KerasFitRunner:
    """Keras fit of zoo network `name` on engine arrays x (n, 224, 224, 3) and one-hot t (n, 1000)."""
    reason = keras_unavailable(name)
    if reason:
        raise TensorFlowUnavailable(reason)
    import keras
    loss = keras.losses.CategoricalCrossentropy(from_logits=True)
    return KerasFitRunner(lambda policy: build_keras_model(name, policy), loss, x, t, batch_size, precision, lr,
                          epochs_per_round, seed)
