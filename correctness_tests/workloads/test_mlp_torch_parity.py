"""The engine on the CPU against PyTorch on the CPU, float32, same weights and same batches.

Outputs of inference (one-shot and resident, with and without the fused tail),
the loss, gradients and parameters after one training step with Adam, and the
per-epoch loss history of a short run (the engine's first epoch is its eager
warm-up, so `train(epochs)` reports epochs 1..epochs; the torch loop replays
every step from step 0 in the order `shuffle.batch_rows` gives).
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed; parity with PyTorch cannot be checked")

from gpuengine.config import EngineConfig  # noqa: E402
from gpuengine.data.shuffle import batch_rows  # noqa: E402
from gpuengine.inference import Predictor, ResidentPredictor  # noqa: E402
from gpuengine.layers import Dense, ReLU
from gpuengine.losses import MSELoss  # noqa: E402
from gpuengine.model.network import Sequential  # noqa: E402
from gpuengine.trainer import Trainer  # noqa: E402
from gpuengine.workloads.mlp import LEARNING_RATE, MLPShape, build_mlp, mlp_data  # noqa: E402

from ..torch_compare import (assert_matches_torch, first_step, fixed_torch_threads, torch_adam, torch_grads,
    torch_loss, torch_twin)

SHAPE = MLPShape(inputs=12, hidden=20)
SAMPLES, BATCH = 200, 48             # 4 steps per epoch; the last 8 samples of each epoch dropped
RTOL, ATOL = 1e-5, 1e-7               # float32 on both sides, different summation orders


def config(**changes) -> EngineConfig:
    return EngineConfig(device="cpu", precision="fp32", cuda_graph=0).replace(**changes)


# -- inference -------------------------------------------------------------------------

@pytest.mark.parametrize("outputs", [1, 3], ids=["fused_tail", "dense_tail"])
def test_predictions_match_torch(outputs):
    net = build_mlp(MLPShape(SHAPE.inputs, SHAPE.hidden, outputs))
    predictor = Predictor(net, config(), seed=5)
    x = np.random.default_rng(0).uniform(-1, 1, (37, SHAPE.inputs)).astype(np.float32)
    expected = torch_twin(net, predictor.params.state_dict())(torch.from_numpy(x))
    assert_matches_torch({"y": predictor.predict(x)}, {"y": expected}, rtol=RTOL, atol=ATOL, what="predict")

    resident = ResidentPredictor(predictor, len(x))
    resident.load(x)
    assert_matches_torch({"y": resident.run()}, {"y": expected}, rtol=RTOL, atol=ATOL, what="resident")


def test_relu_network_predictions_match_torch():
    net = Sequential([Dense(16), ReLU(), Dense(4), ReLU(), Dense(2)], MSELoss(), (SHAPE.inputs,))
    predictor = Predictor(net, config(), seed=6)
    x = np.random.default_rng(1).standard_normal((9, SHAPE.inputs)).astype(np.float32)
    expected = torch_twin(net, predictor.params.state_dict())(torch.from_numpy(x))
    assert_matches_torch({"y": predictor.predict(x)}, {"y": expected}, rtol=RTOL, atol=ATOL, what="predict")


# -- one training step -----------------------------------------------------------------

@pytest.mark.parametrize("fuse,resident", [(True, True), (False, True), (True, False)],
                         ids=["fused", "unfused", "streamed"])
def test_one_step_loss_gradients_and_adam_update_match_torch(fuse, resident):
    net = build_mlp(SHAPE)
    x, t = mlp_data(SAMPLES, SHAPE, seed=1)
    trainer = Trainer(net, x, t, BATCH, config(resident_data=resident), lr=LEARNING_RATE, seed=2, fuse=fuse)
    model = torch_twin(net, trainer.params.state_dict())
    first_step(trainer)

    rows = trainer.data.rows_of_step(0)
    assert len(set(rows.tolist())) == BATCH
    optimizer = torch_adam(model, LEARNING_RATE)
    loss = torch_loss(net)(model(torch.from_numpy(x[rows])), torch.from_numpy(t[rows]))
    loss.backward()
    engine_loss = trainer.backend.to_host(trainer.state.history)[0]   # epoch 0 holds step 0 alone so far
    assert_matches_torch({"loss": engine_loss}, {"loss": loss}, rtol=RTOL, what="loss")
    assert_matches_torch(trainer.params.grads_dict(), torch_grads(model), rtol=RTOL, atol=ATOL, what="gradient")
    optimizer.step()
    assert_matches_torch(trainer.params.state_dict(), dict(model.named_parameters()), rtol=RTOL, atol=ATOL,
                         what="after one Adam step")


def test_one_step_moves_every_parameter():
    """Guards the comparison above: a step that changed nothing would match an unstepped twin."""
    net = build_mlp(SHAPE)
    x, t = mlp_data(SAMPLES, SHAPE, seed=1)
    trainer = Trainer(net, x, t, BATCH, config(), seed=2)
    before = trainer.params.state_dict()
    first_step(trainer)
    for name, value in trainer.params.state_dict().items():
        np.testing.assert_allclose(np.abs(value - before[name]), LEARNING_RATE, rtol=0.05, err_msg=name)


# -- a short run -----------------------------------------------------------------------

def torch_step_losses(net, weights, x, t, steps: int, seed: int, steps_per_epoch: int) -> tuple[list[float], dict]:
    model = torch_twin(net, weights)
    optimizer, loss_fn = torch_adam(model, LEARNING_RATE), torch_loss(net)
    losses = []
    for step in range(steps):
        rows = batch_rows(len(x), seed, step, BATCH, steps_per_epoch)
        optimizer.zero_grad()
        loss = loss_fn(model(torch.from_numpy(x[rows])), torch.from_numpy(t[rows]))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, dict(model.named_parameters())


@pytest.mark.parametrize("cuda_graph,resident", [(0, True), (3, True), (2, False)],
                         ids=["eager", "launches_of_3", "streamed_launches_of_2"])
def test_epoch_losses_match_torch(cuda_graph, resident):
    net = build_mlp(SHAPE)
    x, t = mlp_data(SAMPLES, SHAPE, seed=3)
    epochs, seed = 3, 4
    trainer = Trainer(net, x, t, BATCH, config(cuda_graph=cuda_graph, resident_data=resident), seed=seed)
    weights = trainer.params.state_dict()
    losses = trainer.train(epochs)

    spe = trainer.steps_per_epoch
    assert spe == SAMPLES // BATCH and trainer.steps_done == (epochs + 1) * spe
    step_losses, final = torch_step_losses(net, weights, x, t, (epochs + 1) * spe, seed, spe)
    expected = [np.mean(step_losses[e * spe:(e + 1) * spe]) for e in range(1, epochs + 1)]
    np.testing.assert_allclose(losses, expected, rtol=1e-5)
    assert_matches_torch(trainer.params.state_dict(), final, rtol=RTOL, atol=ATOL, what="after the run")
