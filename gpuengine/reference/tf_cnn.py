"""Keras reference for the MNIST CNN (seed note 001's TensorFlow program, docs/seeds.md; `tf_keras`).

Conv2D(16, 3, padding="same", activation="relu") -> MaxPooling2D(2) -> Flatten ->
Dense(10), categorical cross-entropy on logits against one-hot rows, Adam lr
1e-3, trained by `model.fit` (tf_common.KerasFitRunner). Keras is NHWC and
flattens in (h, w, c) order like the engine, so only the kernels' axes move:
conv (kh, kw, in, out) = engine KRSC (out, kh, kw, in) transposed, dense
(in, out) = engine (out, in) transposed. Glorot uniform weights and zero biases
are Keras' defaults, as in the engine.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ..workloads.cnn import SEED_SHAPE, CNNShape
from .tf_common import KerasFitRunner, require_tensorflow


def build_keras_cnn(shape: CNNShape = SEED_SHAPE, policy: str = "float32"):
    import keras
    return keras.Sequential([
        keras.Input(shape=shape.image_shape),
        keras.layers.Conv2D(shape.filters, shape.kernel, padding="same", activation="relu", dtype=policy,
                            name="conv"),
        keras.layers.MaxPooling2D(shape.pool, dtype=policy, name="pool"),
        keras.layers.Flatten(dtype=policy, name="flatten"),
        keras.layers.Dense(shape.classes, dtype=policy, name="dense"),
    ])


def load_weights(model, weights: Mapping[str, np.ndarray]) -> None:
    """Engine-layout arrays into the Keras model (kernels transposed; shapes checked by Keras)."""
    model.get_layer("conv").set_weights([np.asarray(weights["conv.weight"]).transpose(1, 2, 3, 0),
                                         np.asarray(weights["conv.bias"])])
    model.get_layer("dense").set_weights([np.asarray(weights["dense.weight"]).T, np.asarray(weights["dense.bias"])])


def cnn_fit_runner(x: np.ndarray, t: np.ndarray, batch_size: int, precision: str, lr: float = 1e-3,
                   shape: CNNShape = SEED_SHAPE, weights: Mapping[str, np.ndarray] | None = None,
                   epochs_per_round: int = 1, seed: int = 0) -> KerasFitRunner:
    """Keras fit on engine arrays x (n, H, W, C) and one-hot t (n, classes), streamed from the host."""
    require_tensorflow()
    import keras

    def build(policy: str):
        model = build_keras_cnn(shape, policy)
        if weights is not None:
            load_weights(model, weights)
        return model

    loss = keras.losses.CategoricalCrossentropy(from_logits=True)
    return KerasFitRunner(build, loss, x, t, batch_size, precision, lr, epochs_per_round, seed)
