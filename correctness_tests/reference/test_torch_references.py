"""The PyTorch references on the CPU: they train, count, load weights and refuse clearly.

The CUDA-only parts (the graph modes' capture, fused Adam) are exercised by the GPU
tier; here torch_graph must fail with the message the suite skips with
(torch_compile_graph's own tests: test_torch_compile_graph.py).
"""
from __future__ import annotations

import os
import shutil
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed; the PyTorch references cannot run")

from gpuengine.reference.torch_common import MODES, ReferenceUnavailable, TorchTrainRunner, torch_precision
from gpuengine.reference.torch_mlp import (TorchMLP, export_weights, load_weights, mlp_infer_runner, mlp_loss,
    mlp_train_runner, parameter_count, weight_shapes)
from gpuengine.workloads.mlp import SMOKE_SHAPE, mlp_data  # noqa: E402

INPUTS, HIDDEN = SMOKE_SHAPE.inputs, SMOKE_SHAPE.hidden


@pytest.fixture(scope="module")
def data():
    return mlp_data(512, SMOKE_SHAPE, seed=3)


def epoch_losses(runner, epochs: int) -> list[float]:
    runner.prepare()
    losses = []
    for _ in range(epochs):
        runner.run_round()
        losses.append(runner.last_epoch_loss())
    return losses


def random_weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s).astype(np.float32) * 0.1 for k, s in weight_shapes(INPUTS, HIDDEN, 1).items()}


def test_eager_runner_trains(data):
    x, t = data
    runner = mlp_train_runner("torch_eager", x, t, batch_size=64, precision="fp32", device="cpu", hidden=HIDDEN)
    assert runner.name == "torch_eager"
    assert runner.steps_per_epoch == 8 and runner.samples_per_round == 512
    losses = epoch_losses(runner, 30)
    assert all(np.isfinite(losses))
    assert losses[-1] < 0.5 * losses[0], losses


def test_prepare_restores_initial_weights(data):
    """Warm-up must not leak into the first timed epoch: parity tests start both sides equal."""
    x, t = data
    weights = random_weights()
    runner = mlp_train_runner("torch_eager", x, t, batch_size=64, precision="fp32", device="cpu", weights=weights)
    runner.prepare()
    for key, value in export_weights(runner.model).items():
        np.testing.assert_array_equal(value, weights[key])
    assert all(float(v.abs().sum()) == 0.0 for s in runner.optimizer.state.values() for v in s.values())


def test_runs_are_reproducible(data):
    x, t = data
    first, second = (epoch_losses(mlp_train_runner("torch_eager", x, t, 128, "fp32", device="cpu", seed=5,
                                                   hidden=HIDDEN), 3) for _ in range(2))
    assert first == second


def test_parameter_count_formula():
    model = TorchMLP(INPUTS, HIDDEN, 3)
    expected = INPUTS * HIDDEN + HIDDEN + HIDDEN * 3 + 3
    assert parameter_count(INPUTS, HIDDEN, 3) == expected
    assert sum(p.numel() for p in model.parameters()) == expected
    runner = TorchTrainRunner("torch_eager", TorchMLP(INPUTS, HIDDEN), mlp_loss, np.zeros((8, INPUTS), np.float32),
                              np.ones((8, 1), np.float32), 4, "fp32", device="cpu")
    assert runner.parameter_count() == parameter_count(INPUTS, HIDDEN)


def test_init_is_glorot_with_zero_bias():
    model = TorchMLP(INPUTS, HIDDEN)
    limit = np.sqrt(6.0 / (INPUTS + HIDDEN))
    w = model.dense1.weight.detach().numpy()
    assert np.abs(w).max() <= limit and np.abs(w).max() > 0.8 * limit
    assert not model.dense1.bias.detach().any() and not model.dense2.bias.detach().any()


def test_load_weights_round_trip():
    weights = random_weights(1)
    model = TorchMLP(INPUTS, HIDDEN)
    load_weights(model, weights)
    exported = export_weights(model)
    assert exported.keys() == weights.keys()
    for key in weights:
        np.testing.assert_array_equal(exported[key], weights[key])
    x = np.random.default_rng(2).standard_normal((5, INPUTS)).astype(np.float32)
    hidden = np.tanh(x @ weights["dense1.weight"].T + weights["dense1.bias"])
    expected = hidden @ weights["dense2.weight"].T + weights["dense2.bias"]
    np.testing.assert_allclose(model(torch.from_numpy(x)).detach().numpy(), expected, rtol=1e-5, atol=1e-6)


def test_load_weights_rejects_bad_keys_and_shapes():
    model = TorchMLP(INPUTS, HIDDEN)
    weights = random_weights()
    with pytest.raises(KeyError, match="dense2.bias"):
        load_weights(model, {k: v for k, v in weights.items() if k != "dense2.bias"})
    with pytest.raises(ValueError, match="dense1.weight"):
        load_weights(model, {**weights, "dense1.weight": weights["dense1.weight"].T})


@pytest.mark.parametrize("precision, tf32, matmul", [("fp32", False, "highest"), ("tf32", True, "high"),
                                                     ("bf16", True, "high")])
def test_precision_policy_flags(precision, tf32, matmul):
    for other in ("tf32", "fp32"):   # the outcome must not depend on what was set before
        torch_precision(other, "cpu")
        autocast = torch_precision(precision, "cpu")
        assert torch.backends.cuda.matmul.allow_tf32 is tf32
        assert torch.backends.cudnn.allow_tf32 is tf32
        assert torch.get_float32_matmul_precision() == matmul
    with autocast():
        y = torch.ones(4, 4) @ torch.ones(4, 4)
    assert y.dtype == (torch.bfloat16 if precision == "bf16" else torch.float32)


def test_bad_precision_names_the_accepted_values():
    with pytest.raises(ValueError, match="fp32, tf32, bf16"):
        torch_precision("fp16")


def test_bad_mode_names_the_accepted_modes(data):
    x, t = data
    with pytest.raises(ValueError, match=", ".join(MODES)):
        mlp_train_runner("torch_jit", x, t, 64, "fp32", device="cpu", hidden=HIDDEN)


def test_torch_graph_on_cpu_is_refused_clearly(data):
    x, t = data
    with pytest.raises(ReferenceUnavailable, match="torch_graph .*needs device='cuda'"):
        mlp_train_runner("torch_graph", x, t, 64, "fp32", device="cpu", hidden=HIDDEN)
    with pytest.raises(ReferenceUnavailable, match="torch_graph"):
        mlp_infer_runner("torch_graph", [x[:64]], "fp32", device="cpu", hidden=HIDDEN)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_cuda_without_a_gpu_is_refused_clearly(data):
    x, t = data
    with pytest.raises(ReferenceUnavailable, match="sees no CUDA device"):
        mlp_train_runner("torch_eager", x, t, 64, "fp32", device="cuda", hidden=HIDDEN)


def test_round_before_prepare_is_an_error(data):
    x, t = data
    runner = mlp_train_runner("torch_eager", x, t, 64, "fp32", device="cpu", hidden=HIDDEN)
    with pytest.raises(RuntimeError, match="prepare"):
        runner.run_round()


def test_bf16_eager_trains(data):
    x, t = data
    losses = epoch_losses(mlp_train_runner("torch_eager", x, t, 64, "bf16", device="cpu", hidden=HIDDEN), 10)
    assert losses[-1] < losses[0], losses


def test_infer_runner_rotates_resident_batches(data):
    x, _ = data
    weights = random_weights(4)
    batches = [x[:100], x[100:200], x[200:300]]
    runner = mlp_infer_runner("torch_eager", batches, "fp32", device="cpu", weights=weights, batches_per_round=4)
    assert runner.samples_per_round == 400 and runner.batch_size == 100
    runner.prepare()
    runner.run_round()
    runner.synchronize()
    reference = TorchMLP(INPUTS, HIDDEN)
    load_weights(reference, weights)
    expected = reference(torch.from_numpy(batches[0])).detach()   # pass 4 wraps round to batch 0
    torch.testing.assert_close(runner.output, expected)


@pytest.mark.skipif(not (os.environ.get("CXX") or shutil.which("g++") or shutil.which("clang++")),
                    reason="torch.compile's inductor backend needs a C++ compiler on the CPU; none found")
def test_compile_runner_matches_eager(data):
    """torch.compile with inductor; the first epochs track the eager loop closely."""
    x, t = data
    x, t = x[:256], t[:256]
    runs = {mode: epoch_losses(mlp_train_runner(mode, x, t, 64, "fp32", device="cpu", hidden=HIDDEN,
                                                warmup_steps=1), 3)
            for mode in ("torch_compile", "torch_eager")}
    np.testing.assert_allclose(runs["torch_compile"], runs["torch_eager"], rtol=1e-4)


def test_channels_last_feeds_nhwc_views_and_trains_the_same():
    """The flag stores images NHWC and hands the model channels-last views; the maths is unchanged."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((96, 3, 6, 6)).astype(np.float32)
    labels = rng.integers(0, 4, 96)

    def conv_net():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                                   torch.nn.Linear(8 * 6 * 6, 4))

    seen = []
    runs = {}
    for channels_last in (False, True):
        runner = TorchTrainRunner("torch_eager", conv_net(), torch.nn.functional.cross_entropy, x, labels, 32,
                                  "fp32", device="cpu", channels_last=channels_last)
        runner.model.register_forward_pre_hook(lambda _, args: seen.append(
            args[0].is_contiguous(memory_format=torch.channels_last)))
        runs[channels_last] = epoch_losses(runner, 3)
    assert runner.model[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert seen[-1] is True
    np.testing.assert_allclose(runs[True], runs[False], rtol=1e-5)
    assert runs[True][-1] < runs[True][0]



needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16"])
@pytest.mark.parametrize("mode", ["torch_graph", "torch_compile", "torch_compile_graph"])
def test_gpu_modes_track_eager(data, mode, precision):
    """On a GPU: the captured whole step, the compiled loop and the captured compiled step train like the plain loop."""
    x, t = data
    runs = {m: epoch_losses(mlp_train_runner(m, x, t, 64, precision, device="cuda", hidden=HIDDEN, seed=2), 5)
            for m in (mode, "torch_eager")}
    assert runs[mode][-1] < runs[mode][0]
    np.testing.assert_allclose(runs[mode], runs["torch_eager"], rtol=1e-4 if precision == "fp32" else 3e-2)


@pytest.mark.gpu
@needs_gpu
def test_gpu_capture_survives_another_thread_calling_cuda(data):
    """The engine's streamed loader copies and records events from its own threads while a torch reference
    captures (they alternate in one process): the capture must not fail for it."""
    import threading
    x, t = data
    stop, calls = threading.Event(), []

    def busy():
        side = torch.cuda.Stream()
        buffer = torch.empty(1 << 20, dtype=torch.uint8).pin_memory()
        while not stop.is_set():
            with torch.cuda.stream(side):
                buffer.to("cuda", non_blocking=True)
                torch.cuda.Event().record(side)
            side.synchronize()
            calls.append(1)

    thread = threading.Thread(target=busy, daemon=True)
    thread.start()
    while not calls and thread.is_alive():   # calling CUDA already when the capture begins
        time.sleep(0.001)
    try:
        losses = epoch_losses(mlp_train_runner("torch_graph", x, t, 64, "tf32", device="cuda", hidden=HIDDEN, seed=2), 3)
    finally:
        stop.set()
        thread.join()
    assert len(calls) > 1, "the other thread made no CUDA call while the reference prepared and captured"
    assert losses[-1] < losses[0]


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("mode", ["torch_graph", "torch_compile", "torch_compile_graph"])
def test_gpu_inference_modes_match_eager(data, mode, precision):
    x, _ = data
    weights = random_weights(5)
    batches = [x[:128], x[128:256]]
    outputs = {}
    for m in (mode, "torch_eager"):
        runner = mlp_infer_runner(m, batches, precision, device="cuda", weights=weights, batches_per_round=3)
        runner.prepare()
        runner.run_round()
        runner.synchronize()
        outputs[m] = runner.output.float().cpu()   # pass 3 wraps round to batch 0
    tolerance = dict(rtol=1e-5, atol=1e-5) if precision == "fp32" else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(outputs[mode], outputs["torch_eager"], **tolerance)
