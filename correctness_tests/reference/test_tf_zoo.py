"""The Keras zoo references (reference/tf_zoo.py): why each cannot run where it cannot, and their sizes where TF is.

Where TensorFlow is missing every reference states it (the CPU tier installs
tensorflow-cpu, so there the sizes are checked); ResNet-18 has no Keras
application at all. As in test_tf_cnn.py, collection does not import TensorFlow.
"""
from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest

from gpuengine.reference import tf_common, tf_zoo
from gpuengine.workloads import zoo

REASON = tf_common.tensorflow_missing()
needs_tf = pytest.mark.skipif(REASON is not None, reason=str(REASON))


def test_resnet18_has_no_keras_application_and_says_so():
    assert tf_zoo.keras_unavailable("resnet18") == "keras.applications has no resnet18: no tf_keras reference for it"
    with pytest.raises(tf_common.TensorFlowUnavailable, match="has no resnet18"):
        tf_zoo.zoo_fit_runner("resnet18", np.zeros((16, 224, 224, 3), np.float32), np.zeros((16, 1000)), 16, "tf32")


def test_missing_tensorflow_is_the_stated_reason(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None)   # as where it is not installed
    reason = tf_common.tensorflow_missing()
    assert "TensorFlow is not installed" in reason
    assert tf_zoo.keras_unavailable("vgg16") == reason
    with pytest.raises(tf_common.TensorFlowUnavailable, match="TensorFlow is not installed"):
        tf_zoo.build_keras_model("alexnet")


def test_no_test_before_the_tf_tests_imported_tensorflow():
    """Not a `tf` test, and after test_tf_cnn.py's in file order: the root conftest.py moves those after it,
    and collection decides their skips without importing TensorFlow, so no test so far brought it in."""
    assert "tensorflow" not in sys.modules and "keras" not in sys.modules


@pytest.mark.tf
@needs_tf
@pytest.mark.parametrize("name", sorted(tf_zoo.KERAS_PARAMETERS))
def test_keras_models_have_their_stated_sizes(name):
    model = tf_zoo.build_keras_model(name)
    assert model.count_params() == tf_zoo.KERAS_PARAMETERS[name]
    if name in ("alexnet", "vgg16"):   # the same layers as torchvision's
        assert model.count_params() == zoo.zoo_net(name).torchvision_parameters
