"""A GEMM's cuBLASLt algorithm: chosen once by timing its kernels, the heuristic's first kept unless another is
clearly faster, recorded like a cuDNN plan, and a preset taken without timing.

The cuBLASLt side is a stand-in (nvmath needs a GPU); its algorithms run on a stand-in device
(stand_in_device.py) with set times. The real thing is checked on a GPU in test_gpu_gemm.py.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from gpuengine.ops import autotune
from gpuengine.ops.gemm import Gemm, algorithm_name
from gpuengine.runtime.backend import Backend
from gpuengine.runtime.precision import policy_for

from .stand_in_device import StandInDevice


class StandInAlgorithm:
    def __init__(self, algorithm_id: int):
        self.algorithm_id, self.tile, self.stages, self.split_k = algorithm_id, (128, 64), (64, 3), 1

    @property
    def cluster_shape(self):
        raise RuntimeError("not reported by this cuBLASLt")


class StandInMatmul:
    def __init__(self, device: StandInDevice):
        self.device = device

    def execute(self, algorithm=None, stream=None):
        self.device.run(0 if algorithm is None else algorithm.algorithm_id)


def stand_in_gemm(device: StandInDevice, ids=(0, 1, 2)) -> Gemm:
    out, a, b = np.zeros((8, 4), np.float32), np.ones((8, 16), np.float32), np.ones((16, 4), np.float32)
    gemm = Gemm(Backend("cpu"), policy_for("tf32"), out, a, b)
    gemm.backend = SimpleNamespace(xp=device.xp, stream=device.stream, is_gpu=True)
    gemm._mm, gemm._algorithms, gemm._chosen = StandInMatmul(device), [StandInAlgorithm(i) for i in ids], False
    return gemm


@pytest.fixture
def choices(monkeypatch):
    fresh = autotune.PlanChoices()
    monkeypatch.setattr(autotune, "PLAN_CHOICES", fresh)
    return fresh


def test_an_algorithm_is_named_by_its_configuration_without_the_fields_it_lacks():
    assert algorithm_name(StandInAlgorithm(7)) == "algorithm_id=7,tile=(128, 64),stages=(64, 3),split_k=1"


def test_the_first_run_keeps_a_clearly_faster_algorithm_and_records_it(choices):
    device = StandInDevice({0: 0.050, 1: 0.030, 2: 0.031})
    gemm = stand_in_gemm(device)
    gemm.run()
    assert gemm._algorithm is gemm._algorithms[1]   # 40% faster than the first; the third is within 2% of it
    (entry,) = choices.tuned.values()
    assert entry == {"plan": algorithm_name(gemm._algorithms[1]), "ms": 0.03}
    assert list(choices.tuned) == [autotune.key_text(gemm.key)] and gemm.key[:2] == ("gemm", "tf32")
    device.eager_runs.clear()
    gemm.run()
    assert device.eager_runs == {1: 1}


def test_the_heuristics_first_stays_where_the_others_are_not_clearly_faster(choices):
    device = StandInDevice({0: 0.030, 1: 0.0299, 2: 0.040})
    gemm = stand_in_gemm(device)
    gemm.run()
    assert gemm._algorithm is None   # execute()'s own default: the heuristic's first
    assert device.eager_runs[0] == 2   # its first run, then the real one


def test_a_preset_algorithm_is_taken_without_timing(choices, monkeypatch):
    device = StandInDevice({0: 0.050, 1: 0.030, 2: 0.031})
    preset = {autotune.key_text(stand_in_gemm(device).key): algorithm_name(StandInAlgorithm(2))}
    monkeypatch.setattr(autotune, "PLAN_CHOICES", autotune.PlanChoices(preset))
    gemm = stand_in_gemm(device)
    gemm.run()
    assert gemm._algorithm is gemm._algorithms[2] and device.replays == {} and device.eager_runs == {2: 1}


def test_the_numpy_backend_computes_without_choosing():
    out, a, b = np.zeros((3, 2), np.float32), np.arange(12, dtype=np.float32).reshape(3, 4), np.ones((4, 2), np.float32)
    gemm = Gemm(Backend("cpu"), policy_for("fp32"), out, a, b, bias=np.array([1.0, 2.0], np.float32))
    np.testing.assert_allclose(gemm.run(), a @ b + [1.0, 2.0])
    assert gemm._algorithms == [] and gemm._chosen
