"""The DataLoader reference on the CPU: the engine's batches, the engine's losses, workers that stop.

Item k of its data set is the batch of global step k in the engine's Feistel
order, so with the same weights its epoch losses are the streamed engine's
(float32 on both sides). pin_memory is off without CUDA; the worker processes
and the endless iterator are the ones the GPU tier times.
"""
from __future__ import annotations

import gc
import multiprocessing

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed; the PyTorch references cannot run")

from gpuengine.config import EngineConfig  # noqa: E402
from gpuengine.reference.torch_mlp import mlp_dataloader_runner  # noqa: E402
from gpuengine.reference.torch_streamed import NAME, StepBatches  # noqa: E402
from gpuengine.trainer import Trainer  # noqa: E402
from gpuengine.workloads.mlp import LEARNING_RATE, MLPShape, build_mlp, mlp_data  # noqa: E402

SHAPE = MLPShape(inputs=12, hidden=20)
SAMPLES, BATCH, SEED = 200, 48, 4     # 4 steps per epoch


def test_item_k_is_the_batch_of_step_k():
    x, t = mlp_data(SAMPLES, SHAPE, seed=1)
    batches = StepBatches(x, t, BATCH, SEED)
    config = EngineConfig(device="cpu", precision="fp32", resident_data=False, cuda_graph=0)
    trainer = Trainer(build_mlp(SHAPE), x, t, BATCH, config, seed=SEED)
    for step in (0, 3, 4, 9):
        xb, tb = batches[step]
        np.testing.assert_array_equal(xb.numpy(), x[trainer.data.rows_of_step(step)])
        np.testing.assert_array_equal(tb.numpy(), t[trainer.data.rows_of_step(step)])


def test_its_epoch_losses_are_the_streamed_engines():
    x, t = mlp_data(SAMPLES, SHAPE, seed=3)
    config = EngineConfig(device="cpu", precision="fp32", resident_data=False, cuda_graph=2, batch_pool=2)
    trainer = Trainer(build_mlp(SHAPE), x, t, BATCH, config, lr=LEARNING_RATE, seed=SEED)
    runner = mlp_dataloader_runner(x, t, BATCH, "fp32", lr=LEARNING_RATE, device="cpu", seed=SEED,
                                   weights=trainer.params.state_dict(), workers=2)
    engine = trainer.train(3)            # epochs 1..3: epoch 0 is the engine's eager warm-up
    runner.prepare()
    assert runner.name == NAME and runner.samples_per_round == 4 * BATCH
    reference = []
    for _ in range(4):
        runner.run_round()
        reference.append(runner.last_epoch_loss())
    np.testing.assert_allclose(engine, reference[1:], rtol=1e-5)
    assert reference[-1] < reference[0]
    runner.close()


def test_closing_stops_its_worker_processes():
    x, t = mlp_data(SAMPLES, SHAPE, seed=3)
    before = len(multiprocessing.active_children())
    runner = mlp_dataloader_runner(x, t, BATCH, "fp32", device="cpu", workers=2)
    runner.prepare()
    assert len(multiprocessing.active_children()) == before + 2
    runner.close()
    gc.collect()
    assert len(multiprocessing.active_children()) == before


def test_graph_mode_and_bad_settings_are_refused():
    x, t = mlp_data(SAMPLES, SHAPE, seed=3)
    with pytest.raises(ValueError, match="mode='torch_graph' does not stream"):
        mlp_dataloader_runner(x, t, BATCH, "fp32", device="cpu", mode="torch_graph")
    with pytest.raises(ValueError, match="workers=-1"):
        mlp_dataloader_runner(x, t, BATCH, "fp32", device="cpu", workers=-1)
    with pytest.raises(ValueError, match="batch_size=500 must be between 1 and the 200 samples"):
        mlp_dataloader_runner(x, t, 500, "fp32", device="cpu")
    with pytest.raises(RuntimeError, match="call prepare"):
        mlp_dataloader_runner(x, t, BATCH, "fp32", device="cpu", workers=0).run_round()
