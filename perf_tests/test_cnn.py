"""Seed note 001's MNIST CNN: engine vs PyTorch (and Keras where installed), measured in one run.

Training at batch 128 and 1024 on 10,000 generated 28x28x1 digits, over
precisions at the engine's best toggles and over the toggles at tf32. The
protocol is the note's: 2 warm-up epochs (the engine's eager epoch with cuDNN
plan autotuning, graph capture, then warm-up rounds), then timed epochs, the
engine and each reference alternating round by round (perf_tests/conftest.py's
`compare`). Every test also checks that the loss descends on every side. On a
machine without a GPU the same tests run a small CNN on the NumPy backend: a
smoke test of the harness, never a timing gate. Cases and rounds of the quick
and nightly tiers come through gpuengine/gate/tiers.py.
"""
from __future__ import annotations

import pytest

from gpuengine.bench.runners import EngineTrainRunner
from gpuengine.config import EngineConfig
from gpuengine.reference import tf_common
from gpuengine.runtime.backend import gpu_visible
from gpuengine.workloads import cnn

from gpuengine.gate import tiers
from gpuengine.gate.harness import assert_losses_descend, epoch_loss, ready_references, sides, skip_unless_selected

pytest.importorskip("torch", reason="PyTorch is not installed: no reference")
from gpuengine.reference import torch_cnn  # noqa: E402  (needs torch)

ON_GPU = gpu_visible()
DEVICE = "cuda" if ON_GPU else "cpu"
SHAPE = cnn.SEED_SHAPE if ON_GPU else cnn.SMOKE_SHAPE
SAMPLES = cnn.SAMPLES if ON_GPU else 512
BATCHES = cnn.TRAIN_BATCHES if ON_GPU else (32, 128)
ROUNDS = 7 if ON_GPU else 2
STEPS_PER_ROUND = 75 if ON_GPU else 4     # short epochs (9 steps at batch 1024) are grouped to time them
# torch_compile_graph (with torch_graph, the claims' torch_graph_best) nightly only (gpuengine/gate/tiers.py).
REFERENCES = ("torch_eager", "torch_compile", "torch_graph", "torch_compile_graph") if ON_GPU else ("torch_eager",)

# (precision, cuda_graph, resident, batch): the precision sweep at the engine's best
# toggles; the toggle sweep at tf32.
if ON_GPU:
    ALL_CASES = ([(p, 8, True, b) for p in ("tf32", "fp32", "bf16") for b in BATCHES]
                 + [("tf32", g, r, b) for g in (0, 1, 8) for r in (True, False) for b in BATCHES
                    if (g, r) != (8, True)])
    # Quick tier: the precision sweep at both batches; of the toggles at batch 128 (where per-step overhead
    # shows), the default (graph1), eager (graph0) and the streamed loader (graph8-streamed).
    QUICK = [(p, 8, True, b) for p in ("tf32", "fp32", "bf16") for b in BATCHES] + [
        ("tf32", 1, True, 128), ("tf32", 0, True, 128), ("tf32", 8, False, 128)]
else:
    ALL_CASES = QUICK = [("fp32", 1, True, 32), ("fp32", 0, False, 128), ("bf16", 8, False, 32)]


def case_id(case):
    precision, graph, resident, batch = case
    return f"{precision}-graph{graph}-{'resident' if resident else 'streamed'}-b{batch}"


CASES = tiers.cases("cnn_train", ALL_CASES, quick=QUICK, ids=case_id, budget_s=60)


def epochs_per_round(batch: int) -> int:
    return max(1, STEPS_PER_ROUND // (SAMPLES // batch))


def engine_runner(case) -> EngineTrainRunner:
    precision, graph, resident, batch = case
    x, t = cnn.cnn_data(SAMPLES, SHAPE)
    config = EngineConfig(precision=precision, cuda_graph=graph, resident_data=resident, device=DEVICE)
    return EngineTrainRunner(cnn.build_cnn(SHAPE), x, t, batch, config, epochs_per_round(batch),
                             lr=cnn.LEARNING_RATE)


def compare_and_check_descent(benchmark, compare, engine, refs, precision):
    """The engine and `refs` prepared already, the engine first."""
    for runner in [engine, *refs]:
        assert runner.parameter_count() == cnn.parameter_count(SHAPE), runner.name
    runners = [*sides(engine), *refs]
    warmup_rounds = -(-cnn.WARMUP_EPOCHS // engine.epochs_per_round)
    first = {r.name: epoch_loss(r) for r in runners}
    compare(benchmark, engine, refs, rounds=ROUNDS, precision=precision, warmup_rounds=warmup_rounds,
            flops_per_sample=cnn.build_cnn(SHAPE).train_flops_per_sample())
    last = {r.name: epoch_loss(r) for r in runners}
    assert_losses_descend(benchmark, first, last)


@pytest.mark.parametrize("case", CASES)
def test_cnn_train(case, benchmark, compare, run_settings, engine_for, references):
    precision, graph, resident, batch = case
    skip_unless_selected(run_settings, precision=precision, cuda_graph=graph, resident_data=resident)
    engine = engine_for(case)
    x, t = cnn.cnn_data(SAMPLES, SHAPE)
    weights = engine.state_dict()   # the initial weights: the engine's warm-up trains an epoch
    engine.prepare()
    refs = ready_references(benchmark, {mode: lambda mode=mode: torch_cnn.cnn_train_runner(
        mode, x, t, batch, precision, lr=cnn.LEARNING_RATE, device=DEVICE, shape=SHAPE, weights=weights,
        epochs_per_round=engine.epochs_per_round) for mode in references(REFERENCES)})
    compare_and_check_descent(benchmark, compare, engine, refs, precision)


# Keras only nightly on a GPU (its set-up takes minutes); on the CPU tier as the smoke of its path.
KERAS = [("tf32" if ON_GPU else "fp32", 8 if ON_GPU else 1, True, b) for b in BATCHES]
KERAS_CASES = tiers.cases("cnn_train_vs_keras", KERAS, quick=KERAS, ids=case_id, budget_s=30, nightly_only=ON_GPU)
ENGINES = tiers.recipes(test_cnn_train=(CASES, engine_runner), test_cnn_train_vs_keras=(KERAS_CASES, engine_runner))


@pytest.mark.tf
@pytest.mark.parametrize("case", KERAS_CASES)
def test_cnn_train_vs_keras(case, benchmark, compare, run_settings, engine_for):
    reason = tf_common.tensorflow_unavailable()
    if reason:
        pytest.skip(reason)
    from gpuengine.reference import tf_cnn
    precision, graph, resident, batch = case
    skip_unless_selected(run_settings, precision=precision, cuda_graph=graph, resident_data=resident)
    engine = engine_for(case)
    x, t = cnn.cnn_data(SAMPLES, SHAPE)
    keras = tf_cnn.cnn_fit_runner(x, t, batch, precision, lr=cnn.LEARNING_RATE, shape=SHAPE,
                                  weights=engine.state_dict(), epochs_per_round=engine.epochs_per_round)
    engine.prepare()
    keras.prepare()
    compare_and_check_descent(benchmark, compare, engine, [keras], precision)
