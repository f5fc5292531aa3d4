"""On a GPU: the `deterministic` toggle. On (the default), two runs of one training give the same bits; off,
cuDNN may pick any engine (the SDPA backward too), and the network still trains to nearly the same losses.

The graphs of each setting are cached and kept apart (a key of their own), so a process can hold both.
"""
from __future__ import annotations

import numpy as np
import pytest

from gpuengine.config import EngineConfig
from gpuengine.ops import autotune, cudnn
from gpuengine.runtime.backend import gpu_visible
from gpuengine.trainer import Trainer
from gpuengine.workloads import resnet, transformer

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_visible(), reason="no CUDA GPU visible (CuPy missing or no device)")]

NETWORKS = {
    "resnet": lambda: (resnet.build_resnet(resnet.SMOKE_SHAPE), *resnet.resnet_data(256, resnet.SMOKE_SHAPE, seed=3)),
    "transformer": lambda: (transformer.build_transformer(transformer.SMOKE_SHAPE.with_length(64)),
                            *transformer.transformer_data(128, transformer.SMOKE_SHAPE.with_length(64), seed=4)),
}


def losses(name: str, precision: str, deterministic: bool) -> list[float]:
    net, x, t = NETWORKS[name]()
    config = EngineConfig(precision=precision, cuda_graph=1, deterministic=deterministic)
    return Trainer(net, x, t, 16, config).train(3)


@pytest.mark.parametrize("precision", ["tf32", "bf16"])
@pytest.mark.parametrize("name", NETWORKS)
def test_both_settings_train_and_the_deterministic_one_repeats_bit_for_bit(name, precision, monkeypatch):
    monkeypatch.setattr(autotune, "PLAN_CHOICES", autotune.PlanChoices())
    first, again = losses(name, precision, True), losses(name, precision, True)
    assert first == again
    free = losses(name, precision, False)
    assert free[-1] < free[0]
    np.testing.assert_allclose(free, first, rtol=0.05)
    free_keys = [key for key in cudnn.built_graphs() if ("deterministic", False) in key]
    assert free_keys, "no graph was built without the deterministic filter"
