"""Seed note 000's dense Rosenbrock MLP: engine vs PyTorch, measured in one run.

Training at batch 8000 with 1/4/12/50 batches per epoch, over precisions and
the engine's toggles; inference at batches 512..32000, resident and one-shot.
Engine and references alternate round by round (perf_tests/conftest.py's
`compare`); each training test also checks that the loss descends on every
side, and each inference test that the engine's outputs match a float64
forward pass with the same weights. Cases, rounds and references of the quick
and nightly tiers come through gpuengine/gate/tiers.py: torch_compile_graph, which
with torch_graph makes the claims' torch_graph_best, is timed nightly and in
the quick tier's headline cases (tf32, 1 batch per epoch; inference at 8000).
On a machine without a GPU the same tests run tiny shapes on the NumPy
backend: a smoke test of the harness, never a timing gate.
"""
from __future__ import annotations

import numpy as np
import pytest

from gpuengine.bench.runners import EngineInferRunner, EngineOneShotRunner, EngineTrainRunner
from gpuengine.config import EngineConfig
from gpuengine.runtime.backend import gpu_visible
from gpuengine.workloads import mlp

from gpuengine.gate import tiers
from gpuengine.gate.harness import assert_losses_descend, epoch_loss, ready_references, sides, skip_unless_selected

pytest.importorskip("torch", reason="PyTorch is not installed: no reference")
from gpuengine.reference import torch_mlp  # noqa: E402  (needs torch)

ON_GPU = gpu_visible()
DEVICE = "cuda" if ON_GPU else "cpu"
SHAPE = mlp.SEED_SHAPE if ON_GPU else mlp.SMOKE_SHAPE
TRAIN_BATCH = mlp.TRAIN_BATCH if ON_GPU else 256
INFER_BATCHES = mlp.INFER_BATCHES if ON_GPU else (64, 256)
ROUNDS = 7 if ON_GPU else 2
STEPS_PER_ROUND = 60 if ON_GPU else 4
REFERENCES = ("torch_eager", "torch_compile", "torch_graph", "torch_compile_graph") if ON_GPU else ("torch_eager",)

# (precision, cuda_graph, resident, batches per epoch): the precision sweep runs
# at the engine's best toggles; the toggle sweep at tf32, 12 batches per epoch.
if ON_GPU:
    ALL_TRAIN_CASES = ([(p, 8, True, bpe) for p in ("tf32", "fp32", "bf16") for bpe in mlp.BATCHES_PER_EPOCH]
                       + [("tf32", g, r, 12) for g in (0, 1, 8) for r in (True, False) if (g, r) != (8, True)])
    # Quick tier: every precision at 1 and 12 batches per epoch; of the toggles, the default (graph1),
    # eager (graph0) and the streamed loader (graph8-streamed): each path a regression could hide in.
    QUICK_TRAIN = [(p, 8, True, bpe) for p in ("tf32", "fp32", "bf16") for bpe in (1, 12)] + [
        ("tf32", 1, True, 12), ("tf32", 0, True, 12), ("tf32", 8, False, 12)]
else:
    ALL_TRAIN_CASES = QUICK_TRAIN = [("fp32", 1, True, 1), ("fp32", 0, False, 4), ("bf16", 2, True, 4)]


def train_id(case):
    precision, graph, resident, bpe = case
    return f"{precision}-graph{graph}-{'resident' if resident else 'streamed'}-bpe{bpe}"


TRAIN_CASES = tiers.cases("mlp_train", ALL_TRAIN_CASES, quick=QUICK_TRAIN, ids=train_id, budget_s=60)


def numpy_forward(weights: dict, x: np.ndarray) -> np.ndarray:
    """The MLP's forward pass in float64: the yardstick for inference outputs."""
    h = np.tanh(x.astype(np.float64) @ weights["dense1.weight"].T + weights["dense1.bias"])
    return h @ weights["dense2.weight"].T + weights["dense2.bias"]


def train_engine(case) -> EngineTrainRunner:
    precision, graph, resident, bpe = case
    x, t = mlp.mlp_data(TRAIN_BATCH * bpe, SHAPE)
    config = EngineConfig(precision=precision, cuda_graph=graph, resident_data=resident, device=DEVICE)
    return EngineTrainRunner(mlp.build_mlp(SHAPE), x, t, TRAIN_BATCH, config, max(1, STEPS_PER_ROUND // bpe),
                             lr=mlp.LEARNING_RATE)


@pytest.mark.parametrize("case", TRAIN_CASES)
def test_mlp_train(case, benchmark, compare, run_settings, engine_for, references):
    precision, graph, resident, bpe = case
    skip_unless_selected(run_settings, precision=precision, cuda_graph=graph, resident_data=resident)
    engine = engine_for(case)
    x, t = mlp.mlp_data(TRAIN_BATCH * bpe, SHAPE)
    weights = engine.state_dict()   # the initial weights: the engine's warm-up trains an epoch
    engine.prepare()
    refs = ready_references(benchmark, {mode: lambda mode=mode: torch_mlp.mlp_train_runner(
        mode, x, t, TRAIN_BATCH, precision, lr=mlp.LEARNING_RATE, device=DEVICE, seed=0, weights=weights,
        epochs_per_round=engine.epochs_per_round) for mode in references(REFERENCES)})
    for ref in refs:
        assert ref.parameter_count() == engine.parameter_count() == mlp.parameter_count(SHAPE)

    runners = [*sides(engine), *refs]
    first = {r.name: epoch_loss(r) for r in runners}
    compare(benchmark, engine, refs, rounds=ROUNDS, precision=precision,
            flops_per_sample=mlp.build_mlp(SHAPE).train_flops_per_sample())
    last = {r.name: epoch_loss(r) for r in runners}
    assert_losses_descend(benchmark, first, last)


# Quick tier: every precision at the smallest batch (launch-bound) and at 8000 (GEMM-bound).
INFER_CASES = tiers.cases("mlp_infer", [(p, b) for p in (("tf32", "fp32", "bf16") if ON_GPU else ("fp32",))
                                       for b in INFER_BATCHES],
                         quick=lambda case: not ON_GPU or case[1] in (512, 8000),
                         ids=lambda case: f"{case[0]}-resident-b{case[1]}", budget_s=30,
                         study=("tf32", 8000) if ON_GPU else None)


def infer_inputs(batch: int) -> list[np.ndarray]:
    rng = np.random.default_rng(batch)
    return [rng.uniform(-1, 1, (batch, SHAPE.inputs)).astype(np.float32) for _ in range(3)]


def infer_config(precision: str) -> EngineConfig:
    return EngineConfig(precision=precision, cuda_graph=1, device=DEVICE)


def batches_per_round(batch: int) -> int:
    """1M samples a round on a GPU: at 200k a b8000 round took 2.2 ms and one 2-6 ms stall swung it."""
    return max(2, (1_000_000 if ON_GPU else 1024) // batch)


def infer_engine(case) -> EngineInferRunner:
    precision, batch = case
    return EngineInferRunner(mlp.build_mlp(SHAPE), infer_inputs(batch), infer_config(precision),
                             batches_per_round=batches_per_round(batch))


ENGINES = tiers.recipes(test_mlp_train=(TRAIN_CASES, train_engine), test_mlp_infer=(INFER_CASES, infer_engine))


@pytest.mark.parametrize("case", INFER_CASES)
def test_mlp_infer(case, benchmark, compare, run_settings, engine_for, references):
    precision, batch = case
    skip_unless_selected(run_settings, precision=precision)
    engine = engine_for(case)
    weights = engine.state_dict()
    inputs, per_round = infer_inputs(batch), batches_per_round(batch)
    refs = ready_references(benchmark, {mode: lambda mode=mode: torch_mlp.mlp_infer_runner(
        mode, inputs, precision, device=DEVICE, weights=weights, batches_per_round=per_round)
        for mode in references(REFERENCES)})
    if references(["gpuengine_oneshot"]):   # the convenience path: same seed, so the engine's weights
        refs.append(EngineOneShotRunner(mlp.build_mlp(SHAPE), inputs, infer_config(precision),
                                        batches_per_round=max(1, per_round // 10)))
    compare(benchmark, engine, refs, rounds=ROUNDS, precision=precision,
            flops_per_sample=mlp.build_mlp(SHAPE).forward_flops_per_sample())
    tolerance = {"fp32": 1e-4, "tf32": 1e-2, "bf16": 5e-2}[precision]
    expected = numpy_forward(weights, inputs[0])
    for side in sides(engine):
        error = np.linalg.norm(side.outputs()[0] - expected) / np.linalg.norm(expected)
        benchmark.extra_info.setdefault("output_rel_error_vs_float64", {})[side.name] = float(error)
        assert error < tolerance, f"{side.name} outputs are off the float64 forward pass: relative error {error:.2e}"
