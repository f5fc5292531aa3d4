"""On a GPU: every op, and whole training runs, agree with the NumPy backend.

The NumPy backend is checked against finite differences and PyTorch on the
CPU; these tests carry that trust to the CUDA kernels and cuBLASLt GEMMs.
"""
from __future__ import annotations

import numpy as np
import pytest

from gpuengine.config import EngineConfig
from gpuengine.layers import Dense, ReLU, Tanh
from gpuengine.losses import MSELoss
from gpuengine.losses.fused_head import TanhLinearMSEHead
from gpuengine.runtime.backend import Backend, gpu_visible
from gpuengine.runtime.params import ParamSpec
from gpuengine.trainer import Trainer
from gpuengine.workloads.mlp import MLPShape, build_mlp, mlp_data

from ..gpu_checks import (TOLERANCE, assert_close, assert_steady_state_allocates_nothing, losses_by_graph_group,
    rel_err)
from ..gradient_check import random_weights
from ..layer_harness import run_layer, run_loss, run_network

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_visible(), reason="no CUDA GPU visible (CuPy missing or no device)")]

@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16"])
@pytest.mark.parametrize("units", [1, 7, 64])
def test_dense_matches_numpy(precision, units):
    rng = np.random.default_rng(units)
    x = rng.standard_normal((33, 50))
    dy = rng.standard_normal((33, units))
    w = {"dense.weight": rng.standard_normal((units, 50)) * 0.2, "dense.bias": rng.standard_normal(units)}
    cpu = run_layer(Dense(units, "dense"), x, dy, precision="fp32", weights=w)
    gpu = run_layer(Dense(units, "dense"), x, dy, device="cuda", precision=precision, weights=w)
    assert_close(gpu, cpu, TOLERANCE[precision])


@pytest.mark.parametrize("shape", [(40, 70), (3, 6), (7, 9)], ids=["16-bytes", "pairs", "odd"])   # values a thread
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("make", [Tanh, ReLU])
def test_activation_matches_numpy(precision, make, shape):
    rng = np.random.default_rng(1)
    x, dy = rng.standard_normal(shape), rng.standard_normal(shape)
    cpu = run_layer(make("act"), x, dy, precision="fp32")
    gpu = run_layer(make("act"), x, dy, device="cuda", precision=precision)
    assert_close(gpu, cpu, TOLERANCE[precision])


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_mse_matches_numpy(precision):
    rng = np.random.default_rng(2)
    y, t = rng.standard_normal((300, 3)), rng.standard_normal((300, 3))
    cpu = run_loss(MSELoss(), y, t, precision="fp32")
    gpu = run_loss(MSELoss(), y, t, device="cuda", precision=precision)
    assert_close(gpu, cpu, TOLERANCE[precision])


@pytest.mark.parametrize("batch_innermost", [False, True], ids=["rows", "batch_innermost"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("rows,hidden", [(33, 50), (8000, 1000), (100, 1), (70, 130)])
def test_fused_head_matches_numpy(precision, rows, hidden, batch_innermost):
    rng = np.random.default_rng(3)
    z, t = rng.standard_normal((rows, hidden)), rng.standard_normal((rows, 1))
    specs = [ParamSpec("d1.bias", (hidden,), "zeros"), ParamSpec("d2.weight", (1, hidden), "glorot", hidden, 1),
             ParamSpec("d2.bias", (1,), "zeros")]
    w = {"d1.bias": rng.standard_normal(hidden) * 0.1, "d2.weight": rng.standard_normal((1, hidden)) * 0.1,
         "d2.bias": np.array([0.3])}
    # batch-innermost z comes without the Dense's bias: the head adds it
    cpu = run_loss(TanhLinearMSEHead("d2", "d1"), z + w["d1.bias"] * batch_innermost, t, precision="fp32",
                   specs=specs, weights=w)
    gpu = run_loss(TanhLinearMSEHead("d2", "d1", batch_innermost), z, t, device="cuda", precision=precision,
                   specs=specs, weights=w, batch_innermost=batch_innermost)
    assert_close(gpu, cpu, TOLERANCE[precision])


SHAPE = MLPShape(inputs=64, hidden=96)


@pytest.mark.parametrize("batch,shape", [(256, SHAPE), (1000, MLPShape(inputs=200, hidden=300))])
def test_tf32_step_with_batch_innermost_weight_gradient_matches_numpy(batch, shape):
    net = build_mlp(shape)
    x, t = mlp_data(batch, shape)
    t = t + 10.0   # every y - t below zero: db2 = sum d then does not cancel to a sum whose relative error says nothing
    w = random_weights(net.param_specs(), np.random.default_rng(4))
    cpu = run_network(net, x, t, weights=w, precision="fp32")
    gpu = run_network(net, x, t, device="cuda", precision="tf32", weights=w)
    assert gpu["fused"]
    assert_close(gpu, cpu, TOLERANCE["tf32"])


@pytest.mark.parametrize("fuse", [True, False])
def test_training_matches_numpy(fuse):
    net = build_mlp(SHAPE)
    x, t = mlp_data(2048, SHAPE)
    cpu = Trainer(net, x, t, 256, EngineConfig(device="cpu", precision="fp32", cuda_graph=0), fuse=fuse)
    gpu = Trainer(net, x, t, 256, EngineConfig(device="cuda", precision="fp32", cuda_graph=0), fuse=fuse)
    cpu_losses, gpu_losses = cpu.train(3), gpu.train(3)
    np.testing.assert_allclose(gpu_losses, cpu_losses, rtol=1e-4)
    a, b = cpu.params.state_dict(), gpu.params.state_dict()
    for name in a:
        assert rel_err(b[name], a[name]) < 1e-4, name


@pytest.mark.parametrize("samples", [2048, 256], ids=["gathered", "full-batch"])
@pytest.mark.parametrize("room", [True, False], ids=["room", "no-room"])
def test_tf32_training_on_the_batch_innermost_path_matches_numpy(samples, room, monkeypatch):
    net = build_mlp(SHAPE)
    x, t = mlp_data(samples, SHAPE)
    cpu = Trainer(net, x, t, 256, EngineConfig(device="cpu", precision="fp32", cuda_graph=0))
    if not room:   # no second x: dW reads x row-major (one operand K-major)
        monkeypatch.setattr(Backend, "memory_room", lambda self: 0)
    gpu = Trainer(net, x, t, 256, EngineConfig(device="cuda", precision="tf32", cuda_graph=0))
    dense = gpu.program.layers[gpu.program.nodes[0].name]
    assert gpu.program.loss.batch_innermost and dense.batch_innermost and dense._x_copy is None   # the data's copy
    assert (gpu.data.batch_innermost_input() is not None) == room
    cpu_losses, gpu_losses = cpu.train(3), gpu.train(3)
    assert gpu_losses[-1] < gpu_losses[0]
    np.testing.assert_allclose(gpu_losses, cpu_losses, rtol=TOLERANCE["tf32"])
    a, b = cpu.params.state_dict(), gpu.params.state_dict()
    for name in a:
        assert rel_err(b[name], a[name]) < TOLERANCE["tf32"], name


@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16"])
def test_captured_replay_equals_eager(precision):
    net = build_mlp(SHAPE)
    x, t = mlp_data(4096, SHAPE)
    runs = losses_by_graph_group(net, x, t, 512, precision, (0, 1, 3), epochs=4)
    np.testing.assert_allclose(runs[1], runs[0], rtol=1e-6)
    np.testing.assert_allclose(runs[3], runs[0], rtol=1e-6)


def test_resident_and_streamed_train_identically():
    net = build_mlp(SHAPE)
    x, t = mlp_data(4096, SHAPE)
    resident = Trainer(net, x, t, 512, EngineConfig(resident_data=True, cuda_graph=2)).train(3)
    streamed = Trainer(net, x, t, 512, EngineConfig(resident_data=False, cuda_graph=2, batch_pool=2)).train(3)
    np.testing.assert_allclose(streamed, resident, rtol=1e-6)


@pytest.mark.parametrize("fuse", [True, False], ids=["fused_head", "mse"])
def test_training_is_bitwise_repeatable(fuse):
    """No atomics in any loss or gradient: two runs agree to the last bit (losses and weights)."""
    net = build_mlp(MLPShape(inputs=64, hidden=3000, outputs=1 if fuse else 2))
    x, t = mlp_data(8192, MLPShape(inputs=64, hidden=3000))
    if not fuse:
        t = np.concatenate([t, -t], axis=1)   # two outputs: the unfused Dense + MSE path
    runs = [Trainer(net, x, t, 2048, EngineConfig(precision="tf32", cuda_graph=1), fuse=fuse) for _ in range(2)]
    losses = [run.train(3) for run in runs]
    assert losses[0] == losses[1]
    a, b = (run.params.state_dict() for run in runs)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_device_gather_reads_the_host_shuffle():
    net = build_mlp(SHAPE)
    x, t = mlp_data(1000, SHAPE)
    trainer = Trainer(net, x, t, 100, EngineConfig(cuda_graph=0))
    for step in (0, 3, 10, 27):
        with trainer.backend.activate():
            trainer.state.step[...] = step
            trainer.data.load_batch()
        rows = trainer.data.rows_of_step(step)
        np.testing.assert_array_equal(trainer.backend.to_host(trainer.data.batch_t)[:, 0], t[rows, 0])


@pytest.mark.parametrize("precision", ["fp32", "tf32"])   # tf32: gather_t also writes the batch batch-innermost
@pytest.mark.parametrize("features", [1000, 5000, 5003])   # one chunk; 20 KB rows in 5 chunks; 4-byte words
def test_device_gather_copies_whole_rows(features, precision):
    shape = MLPShape(inputs=features, hidden=8)
    x, t = mlp_data(300, shape)
    trainer = Trainer(build_mlp(shape), x, t, 40, EngineConfig(precision=precision, cuda_graph=0))
    batch_innermost = trainer.data._gather.out_xt
    assert (batch_innermost is not None) == (precision == "tf32")
    for step in (0, 5):
        with trainer.backend.activate():
            trainer.state.step[...] = step
            trainer.data.load_batch()
        rows = trainer.data.rows_of_step(step)
        np.testing.assert_array_equal(trainer.backend.to_host(trainer.data.batch_x), x[rows])
        np.testing.assert_array_equal(trainer.backend.to_host(trainer.data.batch_t), t[rows])
        if batch_innermost is not None:
            np.testing.assert_array_equal(trainer.backend.to_host(batch_innermost), x[rows].T)


def test_steady_state_allocates_nothing():
    net = build_mlp(SHAPE)
    x, t = mlp_data(4096, SHAPE)
    configs = (EngineConfig(cuda_graph=0), EngineConfig(cuda_graph=4), EngineConfig(resident_data=False))
    assert_steady_state_allocates_nothing(net, x, t, 512, configs)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("batch", [1000, 8192])
def test_inference_matches_numpy(precision, batch):
    """Resident inference, captured or not, equals the NumPy forward pass."""
    from gpuengine.inference import Predictor, ResidentPredictor
    net = build_mlp(SHAPE)
    x = np.random.default_rng(batch).uniform(-1, 1, (batch, SHAPE.inputs)).astype(np.float32)
    expected = Predictor(net, EngineConfig(device="cpu", precision="fp32")).predict(x)
    predictor = Predictor(net, EngineConfig(precision=precision))
    for capture in (False, True):
        workspace = ResidentPredictor(predictor, batch, capture=capture)
        workspace.load(x)
        for _ in range(3):
            workspace.run()
        workspace.synchronize()
        got = predictor.backend.to_host(workspace.output)
        assert rel_err(got, expected) < TOLERANCE[precision], (capture, rel_err(got, expected))
