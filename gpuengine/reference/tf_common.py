"""TensorFlow/Keras reference: `model.fit`, as the seed notes ran it (`tf_keras`, docs/architecture.md).

Keras' own loop streams shuffled batches from host NumPy arrays (seed note 001:
"TensorFlow streams from host NumPy via fit"), with the default compilation of
the installed Keras. Precision: fp32 turns TF32 off
(`tf.config.experimental.enable_tensor_float_32_execution`), tf32 turns it on,
bf16 builds the model under Keras' "mixed_bfloat16" dtype policy (bf16 compute,
float32 variables) with TF32 on. The runner satisfies
`gpuengine.bench.benchmarking.Runner`; its warm-up is one untimed epoch (tracing the
train function). The remainder of the data set that does not fill a batch is
dropped, as the engine and the torch runners do, so every step has one shape.

TensorFlow is optional: `tensorflow_unavailable()` says why it cannot run here
(None where it can), and building a runner without it raises
`TensorFlowUnavailable` with that reason, for the suite to skip on;
`tensorflow_missing()` answers "not installed" without importing it.
"""
from __future__ import annotations

import importlib.util
from typing import Callable

import numpy as np

from ..config import PRECISIONS


class TensorFlowUnavailable(RuntimeError):
    """TensorFlow cannot run on this machine; the message says why."""


def tensorflow_missing() -> str | None:
    """Why the Keras reference cannot run here when TensorFlow is not installed at all, else None.

    Unlike `tensorflow_unavailable` this imports nothing, so a test module can decide at collection
    whether to skip without bringing TensorFlow (seconds to import, thread pools of its own) into the
    process of every other test.
    """
    if importlib.util.find_spec("tensorflow") is None:
        return "TensorFlow is not installed (pip install -e .[tf]): no tf_keras reference"
    return None


def tensorflow_unavailable() -> str | None:
    """Why the Keras reference cannot run here, or None when it can (this imports TensorFlow)."""
    missing = tensorflow_missing()
    if missing:
        return missing
    try:
        import tensorflow  # noqa: F401
    except Exception as exc:   # a broken install fails in many ways; all mean "no reference"
        return f"TensorFlow is installed but does not import: {type(exc).__name__}: {exc}"
    return None


def require_tensorflow() -> None:
    reason = tensorflow_unavailable()
    if reason:
        raise TensorFlowUnavailable(reason)


def keras_policy(precision: str) -> str:
    """Set TF's TF32 switch for `precision`; return the Keras dtype policy its layers take."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} is not accepted; use one of {', '.join(PRECISIONS)}")
    require_tensorflow()
    import tensorflow as tf
    tf.config.experimental.enable_tensor_float_32_execution(precision != "fp32")
    return "mixed_bfloat16" if precision == "bf16" else "float32"


class KerasFitRunner:
    """`epochs_per_round` epochs of `model.fit` per round."""

    def __init__(self, build: Callable[[str], object], loss, x: np.ndarray, t: np.ndarray, batch_size: int,
                 precision: str = "tf32", lr: float = 1e-3, epochs_per_round: int = 1, seed: int = 0,
                 name: str = "tf_keras"):
        if not 1 <= batch_size <= len(x) or len(x) != len(t):
            raise ValueError(f"batch_size={batch_size} with {len(x)} inputs and {len(t)} targets")
        if epochs_per_round < 1:
            raise ValueError(f"epochs_per_round={epochs_per_round}: at least one epoch per round")
        self.precision = precision
        policy = keras_policy(precision)
        import keras
        keras.utils.set_random_seed(seed)
        kept = len(x) // batch_size * batch_size
        self.x = np.ascontiguousarray(x[:kept], dtype=np.float32)
        self.t = np.ascontiguousarray(t[:kept], dtype=np.float32)
        self.name, self.batch_size, self.epochs_per_round = name, batch_size, epochs_per_round
        self.steps_per_epoch = kept // batch_size
        self.samples_per_round = kept * epochs_per_round
        self.model = build(policy)
        # epsilon as torch's and the engine's (Keras' default is 1e-7)
        self.model.compile(optimizer=keras.optimizers.Adam(learning_rate=lr, epsilon=1e-8), loss=loss)
        self._prepared = False
        self._last_loss: float | None = None

    def parameter_count(self) -> int:
        return int(self.model.count_params())

    def _fit(self, epochs: int) -> None:
        keras_policy(self.precision)   # the TF32 switch is process-global and runners interleave
        history = self.model.fit(self.x, self.t, batch_size=self.batch_size, epochs=epochs, shuffle=True,
                                 verbose=0)
        self._last_loss = float(history.history["loss"][-1])

    def prepare(self) -> None:
        if not self._prepared:
            self._fit(1)
            self._prepared = True

    def run_round(self) -> None:
        if not self._prepared:
            raise RuntimeError(f"{self.name}: call prepare() before run_round() so warm-up stays untimed")
        self._fit(self.epochs_per_round)

    def synchronize(self) -> None:
        """Nothing pending: fit returns once its epochs' losses are on the host."""

    def last_epoch_loss(self) -> float:
        if self._last_loss is None:
            raise RuntimeError(f"{self.name}: no epoch has run yet")
        return self._last_loss
