"""Seed note 003's model zoo at batch 16 on 224x224x3 images: ms per training batch, engine vs PyTorch.

alexnet, resnet18, resnet50, vgg16 and mobilenet_v2 (workloads/zoo.py,
torchvision's parameter counts), each at tf32 and bf16 with the data
resident on the device or streamed, and at fp32 resident. Streamed is the
note's protocol: a fresh batch copied from the host every step (the engine's
streamed loader; the torch side copies each batch from pinned host memory,
reference/torch_host_batches.py). The references are torchvision's own
models in channels-last (torch_eager in NCHW, as written): the TF32 resident
case races all PyTorch modes, the
others torch_graph (whole step captured, fused capturable Adam) and
torch_compile_graph (the same, the model compiled by Inductor), whose faster
round by round is what the target reads (torch_graph_best), and a streamed
case also races the streamed torch_graph (`torch_graph_streamed`). The
compiled references run nightly only (gpuengine/gate/tiers.py: Inductor takes
minutes over the five networks), so the target is decided by nightly runs.
Keras' applications (`tf_keras`, streaming from host arrays through `fit`)
join the TF32 streamed cases where TensorFlow runs (not on the GPU machines
here). The target, engine ms/batch <= 0.8x torch_graph_best's at
TF32 streamed, is a ratio rule in baselines_store/thresholds.json. Each test
records ms per batch for every side (`ms_per_batch`) and checks that every
side's loss descends over the timed epochs. Adam lr 1e-4 (zoo.LEARNING_RATE)
on every side, same initial weights, dropout on (torchvision's rates).

Without a GPU the same tests train the reduced variants on the NumPy backend
against the hand-written torch twins on the CPU: a smoke test of the plumbing.
"""
from __future__ import annotations

import numpy as np
import pytest

from gpuengine.bench.runners import EngineTrainRunner
from gpuengine.config import EngineConfig
from gpuengine.runtime.backend import gpu_visible
from gpuengine.workloads import zoo

from gpuengine.gate import tiers
from gpuengine.gate.harness import assert_losses_descend, epoch_loss, ready_references, sides, skip_unless_selected

pytest.importorskip("torch", reason="PyTorch is not installed: no reference")
from gpuengine.reference import torch_zoo  # noqa: E402  (needs torch)
from gpuengine.reference import tf_zoo  # noqa: E402
from gpuengine.reference.torch_host_batches import PinnedHostBatchRunner  # noqa: E402

ON_GPU = gpu_visible()
DEVICE = "cuda" if ON_GPU else "cpu"
REDUCED = not ON_GPU
SAMPLES = 16 * zoo.BATCH if ON_GPU else 32   # 16 steps per epoch on a GPU
BATCH = zoo.BATCH if ON_GPU else 8
ROUNDS = 5 if ON_GPU else 2
GRAPH = 8 if ON_GPU else 1                  # steps per CUDA-graph launch
LR = zoo.LEARNING_RATE if ON_GPU else 1e-3  # the CPU smoke's few steps on toy widths need the larger rate

# (network, precision, resident)
if ON_GPU:
    # fp32 resident only: the streamed fp32 case would ask again what the TF32 one asks (does the copy hide)
    ALL_CASES = [(n, p, r) for n in zoo.NAMES for p in ("tf32", "bf16") for r in (False, True)] + \
        [(n, "fp32", True) for n in zoo.NAMES]
    QUICK = [(n, "tf32", False) for n in zoo.NAMES]   # the target's case: TF32, streamed
else:
    ALL_CASES = QUICK = [("alexnet", "fp32", True), ("resnet18", "fp32", False), ("resnet50", "fp32", True),
                         ("vgg16", "fp32", False), ("mobilenet_v2", "fp32", False)]


def case_id(case):
    name, precision, resident = case
    return f"{name}-{precision}-{'resident' if resident else 'streamed'}-b{BATCH}"


CASES = tiers.cases("zoo_train", ALL_CASES, quick=QUICK, ids=case_id, budget_s=150)


def reference_modes(precision: str, resident: bool) -> list[tuple[str, bool]]:
    """(mode, streamed) of each PyTorch reference; the two captured ones resident everywhere (the faster of them
    is the target's baseline, torch_graph_best)."""
    if not ON_GPU:
        return [("torch_eager", not resident)]
    captured = [("torch_graph", False), ("torch_compile_graph", False)]
    if precision == "tf32" and resident:
        return [("torch_eager", False), ("torch_compile", False), *captured]
    return captured + ([] if resident else [("torch_graph", True)])


def reference_name(mode: str, streamed: bool) -> str:
    return f"{mode}_streamed" if streamed else mode


def torch_runner(mode: str, streamed: bool, name: str, x, t, precision: str, weights, buffers):
    runner = PinnedHostBatchRunner if streamed else torch_zoo.TorchTrainRunner
    return torch_zoo.zoo_train_runner(mode, name, x, t, BATCH, precision, weights, buffers, reduced=REDUCED,
                                      torchvision=not REDUCED, lr=LR, device=DEVICE, runner=runner,
                                      name=reference_name(mode, streamed))


def ms_per_batch(comparison, runners) -> dict[str, float]:
    """Median round time over the steps of a round, per runner."""
    steps = {r.name: r.samples_per_round / BATCH for r in runners}
    return {name: float(np.median(ms)) / steps[name] for name, ms in comparison.times_ms.items()}


def engine_runner(case, resident: bool | None = None, name: str = "gpuengine") -> EngineTrainRunner:
    """The engine of a case (on resident data for a streamed case's `gpuengine_resident` side)."""
    network, precision, case_resident = case
    entry = zoo.zoo_net(network)
    shape = entry.shape(REDUCED)
    x, t = zoo.zoo_data(SAMPLES, shape.size, shape.classes)
    config = EngineConfig(precision=precision, cuda_graph=GRAPH,
                          resident_data=case_resident if resident is None else resident, device=DEVICE)
    runner = EngineTrainRunner(entry.network(REDUCED), x, t, BATCH, config, lr=LR)
    runner.name = name
    return runner


ENGINES = tiers.recipes(test_zoo_train=(CASES, engine_runner))


@pytest.mark.parametrize("case", CASES)
def test_zoo_train(case, benchmark, compare, run_settings, engine_for, references):
    name, precision, resident = case
    skip_unless_selected(run_settings, precision=precision, cuda_graph=GRAPH, resident_data=resident)
    if ON_GPU and torch_zoo.torchvision_unavailable():
        pytest.skip(torch_zoo.torchvision_unavailable())
    entry = zoo.zoo_net(name)
    shape = entry.shape(REDUCED)
    engine = engine_for(case)
    x, t = zoo.zoo_data(SAMPLES, shape.size, shape.classes)
    weights, buffers = engine.state_dict(), engine.buffers_dict()
    kept = [mode for mode in reference_modes(precision, resident) if references([reference_name(*mode)])]
    engine.prepare()
    refs = ready_references(benchmark, {reference_name(mode, streamed): lambda mode=mode, streamed=streamed:
                                        torch_runner(mode, streamed, name, x, t, precision, weights, buffers)
                                        for mode, streamed in kept})
    for runner in refs:
        assert runner.parameter_count() == entry.network(REDUCED).parameter_count(), runner.name
    # Keras' applications at full size where TensorFlow runs (their own initial weights and, for ResNet-50 and
    # MobileNetV2, their own architectures: tf_zoo.KERAS_PARAMETERS); why not, recorded otherwise.
    keras_reason = "the CPU tier trains reduced networks" if REDUCED else tf_zoo.keras_unavailable(name)
    if keras_reason is None and not references(["tf_keras"]):
        keras_reason = "nightly tier only (--full)"
    if keras_reason is None and precision == "tf32" and not resident:
        refs.append(tf_zoo.zoo_fit_runner(name, x, t, BATCH, precision, lr=LR))
    benchmark.extra_info["tf_keras"] = keras_reason or "run"
    if not resident and references(["gpuengine_resident"]):   # what streaming costs: the copy should hide
        refs.append(engine_runner(case, resident=True, name="gpuengine_resident"))
    for runner in refs:
        runner.prepare()   # Keras' runner and the resident engine, where they joined (the others are prepared)
    runners = [*sides(engine), *refs]
    first = {r.name: epoch_loss(r) for r in runners}
    comparison = compare(benchmark, engine, refs, rounds=ROUNDS, precision=precision,
                         warmup_rounds=zoo.WARMUP_EPOCHS,
                         flops_per_sample=entry.network(REDUCED).train_flops_per_sample())
    benchmark.extra_info["ms_per_batch"] = ms_per_batch(comparison, [engine, *refs])
    last = {r.name: epoch_loss(r) for r in runners}
    assert_losses_descend(benchmark, first, last)
