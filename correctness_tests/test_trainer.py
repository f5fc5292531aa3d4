"""Trainer behaviour a user relies on: profiled runs train what was asked, a new learning rate takes effect."""
from __future__ import annotations

import numpy as np
import pytest

from gpuengine.config import EngineConfig
from gpuengine.runtime.backend import gpu_visible
from gpuengine.trainer import PHASES, Trainer
from gpuengine.workloads.mlp import MLPShape, build_mlp, mlp_data

from .faults.plugin import poison

SHAPE = MLPShape(inputs=9, hidden=16)
CPU = EngineConfig(device="cpu", precision="fp32", cuda_graph=0)
needs_gpu = pytest.mark.skipif(not gpu_visible(), reason="no CUDA GPU visible (CuPy missing or no device)")


def trainer(config: EngineConfig, samples: int = 96, batch: int = 32) -> Trainer:
    x, t = mlp_data(samples, SHAPE)
    return Trainer(build_mlp(SHAPE), x, t, batch, config)


def test_a_profiled_run_trains_the_epochs_asked_for_no_more():
    plain, profiled = trainer(CPU), trainer(CPU.replace(profile=True))
    expected = plain.train(6)
    losses = profiled.train(6)   # 3 steps an epoch: 4 epochs profiled, 2 more run as usual
    np.testing.assert_allclose(losses, expected, rtol=1e-6)
    assert profiled.steps_done == plain.steps_done
    for name, value in profiled.params.state_dict().items():
        np.testing.assert_allclose(value, plain.params.state_dict()[name], rtol=1e-6)
    assert set(profiled.last_profile) == set(PHASES) and all(v > 0 for v in profiled.last_profile.values())


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, needs_gpu])])
def test_released_graphs_are_captured_again_and_training_goes_on_as_if_never_released(device):
    """release_graphs (before a data-parallel communicator is destroyed) drops the graphs; a later epoch recaptures."""
    config = EngineConfig(device=device, precision="fp32", cuda_graph=3)
    kept, released = trainer(config), trainer(config)
    expected = kept.train(4)
    losses = released.train(2)
    assert set(released.graphs) == {3, 1}   # warm-up captured the 3-step graph and the 1-step one
    released.release_graphs()
    assert released.graphs == {}
    losses += released.train(2)
    assert set(released.graphs) == {3}
    np.testing.assert_allclose(losses, expected, rtol=1e-6)
    assert released.steps_done == kept.steps_done


def test_a_profiled_run_shorter_than_the_profile_trains_only_its_epochs():
    plain, profiled = trainer(CPU), trainer(CPU.replace(profile=True))
    assert profiled.train(1) == pytest.approx(plain.train(1), rel=1e-6)
    assert profiled.steps_done == plain.steps_done


def lr_effect(config: EngineConfig) -> tuple[float, float]:
    """How far one epoch moves the weights at lr 1e-3, then at 1e-5 set after training started."""
    run = trainer(config)
    run.train(1)
    moves = []
    for lr in (1e-3, 1e-5):
        run.optimizer.lr = lr
        before = run.params.state_dict()
        run.train(1)
        after = run.params.state_dict()
        moves.append(max(float(np.abs(after[k] - before[k]).max()) for k in before))
    return moves[0], moves[1]


def test_a_new_learning_rate_takes_effect():
    fast, slow = lr_effect(CPU)
    assert slow < fast / 20, (fast, slow)   # Adam's steps scale with lr: 100x smaller here


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("cuda_graph", [1, 3])
def test_a_new_learning_rate_reaches_captured_graphs(cuda_graph):
    fast, slow = lr_effect(EngineConfig(device="cuda", precision="fp32", cuda_graph=cuda_graph))
    assert slow < fast / 20, (fast, slow)


@pytest.mark.parametrize("lr", [0.0, -1e-3, float("nan"), float("inf")])
def test_a_bad_learning_rate_is_refused_and_the_old_one_kept(lr):
    run = trainer(CPU)
    with pytest.raises(ValueError, match=rf"^lr={lr!r} is not accepted; use a finite number > 0.0$"):
        run.optimizer.lr = lr
    assert run.optimizer.lr == pytest.approx(1e-3)


def diverging(config: EngineConfig, at: int) -> Trainer:
    run = trainer(config)   # 3 steps an epoch
    run.step_hook = poison(run, at)
    return run


def test_a_loss_that_turns_nan_mid_run_stops_train_naming_the_step():
    run = diverging(CPU, at=7)   # the warm-up epoch is epoch 0: train(4) returns epochs 1-4
    with pytest.raises(FloatingPointError, match=r"^training diverged: the loss of step 8 \(epoch 2, batch 3 of 3\) "
                                                 r"is inf or nan.*lower lr \(now 0.001\) or check the data$") as caught:
        run.train(4)
    assert caught.value.step == 8 and np.isfinite(caught.value.losses[0]) and np.isnan(caught.value.losses[1])
    with pytest.raises(FloatingPointError, match="step 8 "):   # the weights stay unusable: so does every later call
        run.train(1)


def test_a_run_whose_losses_stay_finite_never_reports_divergence():
    run = trainer(CPU)
    run.train(3)
    assert run.state.read_diverged() is None


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("cuda_graph", [0, 1, 3])
def test_a_loss_that_turns_nan_inside_captured_steps_is_named_by_its_step(cuda_graph):
    run = diverging(EngineConfig(device="cuda", precision="tf32", cuda_graph=cuda_graph), at=7)
    run.train(1)   # the warm-up epoch 0 and epoch 1 (steps 0-5): finite
    with pytest.raises(FloatingPointError, match=r"the loss of step 8 \(epoch 2, batch 3 of 3\)"):
        run.train(2)
