"""gpuengine.bench.injected_delay: off by default, refused without its guard, and a real wait in every step when armed.

On the NumPy backend the wait is a host busy-wait inside the step, so a
training step and a resident forward pass take at least the delay; on a GPU
the spin kernel must be inside the captured graph, and a new delay must reach
it without a new capture.
"""
from __future__ import annotations

import time

import numpy as np
import pytest

from gpuengine.bench import injected_delay
from gpuengine.config import EngineConfig
from gpuengine.inference import Predictor, ResidentPredictor
from gpuengine.trainer import Trainer
from gpuengine.workloads import mlp

CPU = EngineConfig(precision="fp32", cuda_graph=1, device="cpu")
GPU = EngineConfig(precision="tf32", cuda_graph=8, device="cuda")
SHAPE = mlp.SMOKE_SHAPE


@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.delenv(injected_delay.DELAY_ENV, raising=False)
    monkeypatch.delenv(injected_delay.GUARD_ENV, raising=False)
    monkeypatch.setattr(injected_delay, "_delays", {})   # engines of other tests keep no delay of this one
    return monkeypatch


def trainer(config: EngineConfig = CPU) -> Trainer:
    """A trainer built as the suite's runners build one: with the study's step hook."""
    x, t = mlp.mlp_data(64, SHAPE)
    return Trainer(mlp.build_mlp(SHAPE), x, t, 32, config, step_hook=injected_delay.step_hook(config))


def delay_of(tr: Trainer):
    return injected_delay.for_backend(tr.backend)


def seconds_per_step(tr: Trainer, steps: int = 8) -> float:
    tr.warm_up()
    tr.synchronize()
    start = time.perf_counter()
    tr.run_epochs(steps // tr.steps_per_epoch)
    tr.synchronize()
    return (time.perf_counter() - start) / steps


def test_engines_never_wait_unless_armed(clean_env):
    assert not injected_delay.armed()
    assert injected_delay.step_hook(CPU) is None and trainer().step_hook is None
    with pytest.raises(injected_delay.InjectionRefused, match="./gate gatepower"):
        injected_delay.set_delay_us(100)


def test_the_delay_without_its_guard_is_refused_by_name(clean_env):
    clean_env.setenv(injected_delay.DELAY_ENV, "500")
    with pytest.raises(injected_delay.InjectionRefused,
                       match=f"{injected_delay.DELAY_ENV} is set but {injected_delay.GUARD_ENV} is not"):
        trainer()


def test_a_bad_delay_is_refused(clean_env, tmp_path):
    clean_env.setenv(injected_delay.GUARD_ENV, str(tmp_path))
    clean_env.setenv(injected_delay.DELAY_ENV, "-3")
    with pytest.raises(injected_delay.InjectionRefused, match="microseconds >= 0"):
        injected_delay.armed()


def test_armed_every_training_step_waits_and_the_delay_can_change(clean_env, tmp_path):
    clean_env.setenv(injected_delay.GUARD_ENV, str(tmp_path))
    clean_env.setenv(injected_delay.DELAY_ENV, "0")
    tr = trainer()
    assert tr.step_hook is not None and delay_of(tr).us == 0
    injected_delay.set_delay_us(20_000)
    assert seconds_per_step(tr) >= 0.020
    injected_delay.set_delay_us(0)
    assert delay_of(tr).us == 0 and delay_of(trainer()).us == 0   # later engines start where it is


def test_armed_every_resident_forward_waits(clean_env, tmp_path):
    clean_env.setenv(injected_delay.GUARD_ENV, str(tmp_path))
    clean_env.setenv(injected_delay.DELAY_ENV, "15000")
    workspace = ResidentPredictor(Predictor(mlp.build_mlp(SHAPE), CPU, step_hook=injected_delay.step_hook(CPU)), 16)
    workspace.load(np.zeros((16, SHAPE.inputs), np.float32))
    start = time.perf_counter()
    workspace.run()
    assert time.perf_counter() - start >= 0.015


@pytest.mark.gpu
def test_the_spin_kernel_is_captured_and_follows_the_device_scalar(clean_env, tmp_path):
    clean_env.setenv(injected_delay.GUARD_ENV, str(tmp_path))
    clean_env.setenv(injected_delay.DELAY_ENV, "0")
    tr = trainer(GPU)
    undelayed = seconds_per_step(tr, steps=64)
    assert tr.graphs, "the steps must run as captured graphs"
    injected_delay.set_delay_us(500)
    assert seconds_per_step(tr, steps=64) >= undelayed + 450e-6   # 8 captured steps per launch, each waits
    injected_delay.set_delay_us(0)
    assert seconds_per_step(tr, steps=64) < undelayed + 250e-6
