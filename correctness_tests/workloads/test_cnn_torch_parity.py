"""The MNIST CNN on the CPU against its PyTorch twin (reference/torch_cnn.py), float32, same weights.

Same weights (mapped between the engine's KRSC filters / NHWC flatten order and
torch's layouts) give the same logits, the same loss and gradients and the
same parameters after one Adam step, and the same per-epoch losses over a short
run (the engine's first epoch is its eager warm-up; torch replays every step in
the order `shuffle.batch_rows` gives). The shared torch runner trains the twin.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed; parity with PyTorch cannot be checked")

from gpuengine.config import EngineConfig  # noqa: E402
from gpuengine.data.shuffle import batch_rows  # noqa: E402
from gpuengine.inference import Predictor  # noqa: E402
from gpuengine.reference import torch_cnn  # noqa: E402
from gpuengine.trainer import Trainer  # noqa: E402
from gpuengine.workloads.cnn import LEARNING_RATE, SEED_SHAPE, CNNShape, build_cnn, cnn_data, parameter_count

from ..torch_compare import assert_matches_torch, first_step, fixed_torch_threads, torch_adam  # noqa: E402,F401

SHAPE = CNNShape(size=14, filters=4, classes=6)
SAMPLES, BATCH = 100, 24              # 4 steps per epoch, 4 samples dropped
RTOL, ATOL = 1e-5, 1e-6


def config(**changes) -> EngineConfig:
    return EngineConfig(device="cpu", precision="fp32", cuda_graph=0).replace(**changes)


def twin(weights, shape=SHAPE):
    return torch_cnn.build_model(shape, weights)


def test_layout_maps_round_trip_and_count_the_same_parameters():
    net = build_cnn(SEED_SHAPE)
    weights = Predictor(net, config(), seed=1).params.state_dict()
    back = torch_cnn.torch_to_engine(torch_cnn.engine_to_torch(weights))
    for name, value in weights.items():
        np.testing.assert_array_equal(back[name], value, err_msg=name)
    model = twin(weights, SEED_SHAPE)
    assert sum(p.numel() for p in model.parameters()) == net.parameter_count() == parameter_count() == 31530


@pytest.mark.parametrize("shape", [SEED_SHAPE, SHAPE], ids=["seed_shape", "small"])
def test_logits_match_torch(shape):
    net = build_cnn(shape)
    predictor = Predictor(net, config(), seed=5)
    x, _ = cnn_data(16, shape, seed=2)
    expected = twin(predictor.params.state_dict(), shape)(torch.from_numpy(torch_cnn.to_nchw(x)))
    assert_matches_torch({"logits": predictor.predict(x)}, {"logits": expected}, rtol=RTOL, atol=ATOL,
                         what="predict")


@pytest.mark.parametrize("fused_relu", [True, False], ids=["fused_relu", "relu_layer"])
def test_one_step_loss_gradients_and_adam_update_match_torch(fused_relu):
    net = build_cnn(SHAPE, fused_relu)
    x, t = cnn_data(SAMPLES, SHAPE, seed=1)
    trainer = Trainer(net, x, t, BATCH, config(), lr=LEARNING_RATE, seed=2)
    model = twin(trainer.params.state_dict())
    first_step(trainer)

    rows = trainer.data.rows_of_step(0)
    optimizer = torch_adam(model, LEARNING_RATE)
    loss = torch_cnn.cnn_loss(model(torch.from_numpy(torch_cnn.to_nchw(x[rows]))), torch.from_numpy(t[rows]))
    loss.backward()
    engine_loss = trainer.backend.to_host(trainer.state.history)[0]
    assert_matches_torch({"loss": engine_loss}, {"loss": loss}, rtol=RTOL, what="loss")
    grads = torch_cnn.torch_to_engine({n: p.grad for n, p in model.named_parameters()}, SHAPE)
    assert_matches_torch(trainer.params.grads_dict(), grads, rtol=RTOL, atol=ATOL, what="gradient")
    optimizer.step()
    assert_matches_torch(trainer.params.state_dict(), torch_cnn.torch_to_engine(dict(model.named_parameters()), SHAPE),
                         rtol=RTOL, atol=ATOL, what="after one Adam step")


@pytest.mark.parametrize("cuda_graph,resident", [(0, True), (3, True), (2, False)],
                         ids=["eager", "launches_of_3", "streamed_launches_of_2"])
def test_epoch_losses_match_torch(cuda_graph, resident):
    net = build_cnn(SHAPE)
    x, t = cnn_data(SAMPLES, SHAPE, seed=3)
    epochs, seed = 2, 4
    trainer = Trainer(net, x, t, BATCH, config(cuda_graph=cuda_graph, resident_data=resident), seed=seed)
    model = twin(trainer.params.state_dict())
    losses = trainer.train(epochs)

    spe = trainer.steps_per_epoch
    optimizer, step_losses = torch_adam(model, LEARNING_RATE), []
    for step in range((epochs + 1) * spe):
        rows = batch_rows(len(x), seed, step, BATCH, spe)
        optimizer.zero_grad()
        loss = torch_cnn.cnn_loss(model(torch.from_numpy(torch_cnn.to_nchw(x[rows]))), torch.from_numpy(t[rows]))
        loss.backward()
        optimizer.step()
        step_losses.append(loss.item())
    expected = [np.mean(step_losses[e * spe:(e + 1) * spe]) for e in range(1, epochs + 1)]
    np.testing.assert_allclose(losses, expected, rtol=1e-5)
    assert_matches_torch(trainer.params.state_dict(), torch_cnn.torch_to_engine(dict(model.named_parameters()), SHAPE),
                         rtol=RTOL, atol=ATOL, what="after the run")


@pytest.mark.parametrize("channels_last", [False, True])
def test_torch_runner_trains_the_twin(channels_last):
    x, t = cnn_data(SAMPLES, SHAPE, seed=5)
    runner = torch_cnn.cnn_train_runner("torch_eager", x, t, BATCH, "fp32", device="cpu", shape=SHAPE,
                                        channels_last=channels_last, epochs_per_round=3)
    assert runner.parameter_count() == parameter_count(SHAPE)
    runner.prepare()
    runner.run_round()
    first = runner.last_epoch_loss()
    runner.run_round()
    assert runner.last_epoch_loss() < first < np.log(SHAPE.classes) + 0.5
