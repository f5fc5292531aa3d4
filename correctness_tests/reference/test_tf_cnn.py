"""The Keras CNN reference (reference/tf_cnn.py) on the CPU: same logits as the engine, and it trains.

Where TensorFlow is missing, the reference says why and the comparisons skip
with that reason; the CPU tier (`./gate test`, `tox -e cpu`) installs
tensorflow-cpu, so there they run. Whether to skip is decided without importing
TensorFlow: it is imported by the first test that builds a Keras model (and the
root conftest.py runs the `tf` tests last), so the rest of the suite never
shares a process with it. Where it is installed but does not import, these
tests fail with its error instead of skipping.
"""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from gpuengine.config import EngineConfig
from gpuengine.inference import Predictor
from gpuengine.reference import tf_common
from gpuengine.reference.tf_cnn import cnn_fit_runner
from gpuengine.workloads.cnn import CNNShape, build_cnn, cnn_data, parameter_count

SHAPE = CNNShape(size=14, filters=4, classes=6)
REASON = tf_common.tensorflow_missing()
needs_tf = pytest.mark.skipif(REASON is not None, reason=str(REASON))


def test_missing_tensorflow_is_a_stated_reason(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None)
    reason = tf_common.tensorflow_unavailable()
    assert "TensorFlow is not installed" in reason
    x, t = cnn_data(64, SHAPE)
    with pytest.raises(tf_common.TensorFlowUnavailable, match="not installed"):
        cnn_fit_runner(x, t, 16, "fp32", shape=SHAPE)


@pytest.mark.tf
@needs_tf
@pytest.mark.parametrize("shape", [CNNShape(), SHAPE], ids=["seed_shape", "small"])
def test_keras_logits_match_the_engine(shape):
    predictor = Predictor(build_cnn(shape), EngineConfig(device="cpu", precision="fp32"), seed=2)
    x, t = cnn_data(32, shape, seed=1)
    runner = cnn_fit_runner(x, t, 16, "fp32", shape=shape, weights=predictor.params.state_dict())
    assert runner.parameter_count() == parameter_count(shape)
    logits = np.asarray(runner.model(x, training=False))
    np.testing.assert_allclose(logits, predictor.predict(x), rtol=1e-4, atol=1e-5)


@pytest.mark.tf
@needs_tf
def test_keras_runner_trains():
    x, t = cnn_data(240, SHAPE, seed=3)
    runner = cnn_fit_runner(x, t, 32, "fp32", shape=SHAPE, epochs_per_round=3)
    assert runner.samples_per_round == 3 * 224   # 7 full batches per epoch, the remainder dropped
    runner.prepare()
    first = runner.last_epoch_loss()
    runner.run_round()
    runner.synchronize()
    assert runner.last_epoch_loss() < first < np.log(SHAPE.classes) + 0.5
