"""Inference plumbing: predict() keeps its workspace while the size repeats; runners count what they run.

A Predictor given no parameters draws its own (seeded, as a Trainer does), inference-only: no layer may ask
them for gradients while its forward pass is wired (attention once did, and a transformer could not predict).
"""
from __future__ import annotations

import numpy as np
import pytest

from gpuengine.bench.runners import EngineInferRunner, EngineOneShotRunner, samples_in_rotation
from gpuengine.config import EngineConfig
from gpuengine.inference import Predictor
from gpuengine.runtime.backend import gpu_visible
from gpuengine.trainer import Trainer
from gpuengine.workloads.mlp import MLPShape, build_mlp
from gpuengine.workloads.transformer import SMOKE_SHAPE, build_transformer, transformer_data

SHAPE = MLPShape(inputs=6, hidden=10)
CPU = EngineConfig(device="cpu", precision="fp32", cuda_graph=0)
DEVICES = ["cpu"] + (["cuda"] if gpu_visible() else [])


def inputs(*sizes: int) -> list[np.ndarray]:
    rng = np.random.default_rng(5)
    return [rng.standard_normal((n, SHAPE.inputs)).astype(np.float32) for n in sizes]


@pytest.mark.parametrize("device", DEVICES)
def test_predict_reuses_its_workspace_for_the_same_size_and_replaces_it_for_another(device):
    predictor = Predictor(build_mlp(SHAPE), CPU.replace(device=device))
    a, b, c = inputs(40, 40, 17)
    first = predictor.predict(a)
    workspace = predictor._one_shot
    second = predictor.predict(b)
    assert predictor._one_shot is workspace                 # same size: no new buffers or GEMM plans
    third = predictor.predict(c)
    assert predictor._one_shot is not workspace and predictor._one_shot.batch == 17
    fresh = Predictor(build_mlp(SHAPE), CPU.replace(device=device))   # same seed: same weights
    for x, y in ((a, first), (b, second), (c, third)):
        np.testing.assert_allclose(y, fresh.predict(x), rtol=1e-5, atol=1e-6)
    assert not np.array_equal(first, second)                # the reused workspace read the new input


@pytest.mark.parametrize("device", DEVICES)
def test_a_predictor_without_parameters_draws_its_own_and_runs_a_transformer(device):
    config = CPU.replace(device=device)
    x, t = transformer_data(16, SMOKE_SHAPE, seed=3)
    fresh = Predictor(build_transformer(SMOKE_SHAPE), config, seed=4)
    assert not fresh.params.training
    logits = fresh.predict(x[:5])
    assert logits.shape == (5, SMOKE_SHAPE.length, SMOKE_SHAPE.vocab) and np.isfinite(logits).all()
    untrained = Trainer(build_transformer(SMOKE_SHAPE), x, t, 8, config, seed=4)   # same seed: same weights
    np.testing.assert_allclose(logits, Predictor.from_trainer(untrained).predict(x[:5]), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not gpu_visible(), reason="no CUDA GPU visible: a released plan only exists on the GPU")
@pytest.mark.gpu
def test_a_released_workspace_refuses_to_run():
    predictor = Predictor(build_mlp(SHAPE), CPU.replace(device="cuda"))
    predictor.predict(inputs(8)[0])
    old = predictor._one_shot
    predictor.predict(inputs(9)[0])   # another size releases the first workspace's plans
    with pytest.raises(RuntimeError, match=r"after free\(\)"):
        old.run()


@pytest.mark.skipif(not gpu_visible(), reason="no CUDA GPU visible: stream ordering only exists on the GPU")
@pytest.mark.gpu
def test_a_device_input_written_on_another_stream_is_read_after_it_is_written():
    import cupy
    from gpuengine.inference import ResidentPredictor
    predictor = Predictor(build_mlp(SHAPE), CPU.replace(device="cuda"))
    workspace = ResidentPredictor(predictor, 4096)
    host = inputs(4096)[0]
    producer = cupy.cuda.Stream(non_blocking=True)
    with producer:
        x = cupy.zeros((4096, SHAPE.inputs), np.float32)
        for _ in range(200):   # keep the producer busy so an unordered read would see a partial result
            x *= 0.5
        x += cupy.asarray(host)
        workspace.load(x)      # called with the producer current: the engine stream must wait for it
    got = predictor.backend.to_host(workspace.run())
    np.testing.assert_allclose(got, predictor.predict(host), rtol=1e-4, atol=1e-5)


def test_samples_in_rotation_counts_unequal_batches():
    assert samples_in_rotation([100, 30], 5) == 100 + 30 + 100 + 30 + 100
    assert samples_in_rotation([64], 3) == 192


@pytest.mark.parametrize("runner", [EngineInferRunner, EngineOneShotRunner])
def test_runners_count_the_samples_of_unequal_batches(runner):
    r = runner(build_mlp(SHAPE), inputs(50, 20, 7), CPU, batches_per_round=4)
    assert r.samples_per_round == 50 + 20 + 7 + 50
    r.prepare()
    r.run_round()


@pytest.mark.parametrize("runner", [EngineInferRunner, EngineOneShotRunner])
def test_runners_need_an_input(runner):
    with pytest.raises(ValueError, match="at least one input batch"):
        runner(build_mlp(SHAPE), [], CPU)
