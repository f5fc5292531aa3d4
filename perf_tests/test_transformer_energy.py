"""Energy per training sample of the Transformer at sequence 256, engine vs PyTorch (seed note 004's table).

The note integrated power over a run at sequence 256 and found the engine
spent 23% less energy per sample than PyTorch. Same method as
test_mlp_energy.py (whose window helper and NVML probe this reuses): an idle
reading first, then windows of the same number of samples per runner (TF32,
batch 16, 8 steps per graph launch), alternating engine and references window
by window; the per-window ratio reference J/sample over engine J/sample is
gated by thresholds.json (issue 9: engine <= 0.77x torch_graph, a ratio >= 1.3).
Total and above-idle joules, average power and samples/s of every runner go
to the run's extra_info["energy"]. Takes a few minutes: `slow`.
"""
from __future__ import annotations

import math
import statistics

import pytest

from gpuengine.bench.benchmarking import Comparison, RatioSummary, time_round
from gpuengine.bench.energy import EnergyMeter, measure_idle
from gpuengine.bench.runners import EngineTrainRunner
from gpuengine.config import EngineConfig
from gpuengine.workloads import transformer

from .harness import record_and_gate, skip_unless_selected
from .test_mlp_energy import IDLE_S, WINDOW_MARGIN, WINDOW_S, WINDOWS, energy_window, power_probe  # noqa: F401

pytest.importorskip("torch", reason="PyTorch is not installed: no reference")
from gpuengine.reference import torch_transformer  # noqa: E402  (needs torch)
pytestmark = pytest.mark.gpu

GRAPH_STEPS = 8
REFERENCES = ("torch_graph", "torch_eager")


@pytest.mark.parametrize("precision", ["tf32"])
def test_transformer_train_energy(precision, power_probe, benchmark, request, run_target):  # noqa: F811
    skip_unless_selected(run_target, precision=precision, cuda_graph=GRAPH_STEPS, resident_data=True)
    idle = measure_idle(power_probe, IDLE_S)   # first, before anything here has run on the device
    shape = transformer.SEED_SHAPE.with_length(transformer.ENERGY_LENGTH)
    x, t = transformer.transformer_data(transformer.SAMPLES, shape)
    config = EngineConfig(precision=precision, cuda_graph=GRAPH_STEPS, resident_data=True, device="cuda")
    engine = EngineTrainRunner(transformer.build_transformer(shape), x, t, transformer.TRAIN_BATCH, config,
                               epochs_per_round=1, lr=transformer.LEARNING_RATE)
    weights = engine.trainer.params.state_dict()
    refs = [torch_transformer.transformer_train_runner(mode, x, t, transformer.TRAIN_BATCH, precision,
                                                       lr=transformer.LEARNING_RATE, device="cuda", shape=shape,
                                                       weights=weights) for mode in REFERENCES]
    runners = [*refs, engine]
    for runner in runners:
        runner.prepare()
        time_round(runner)   # one untimed round: allocator and clocks settle
    fastest_ms = min(min(time_round(r) for _ in range(3)) for r in runners)
    window_s = WINDOW_MARGIN * max(WINDOW_S, EnergyMeter(power_probe, idle=idle).min_window_s())
    rounds = math.ceil(window_s * 1e3 / fastest_ms)
    samples = rounds * engine.samples_per_round
    assert all(r.samples_per_round == engine.samples_per_round for r in refs)
    readings: dict = {}

    def reference_windows():
        for ref in refs:
            energy_window(ref, power_probe, idle, rounds, samples, readings)

    def engine_window():
        energy_window(engine, power_probe, idle, rounds, samples, readings)

    if benchmark.disabled:   # pedantic would run one window only (xdist, --benchmark-disable)
        for _ in range(WINDOWS):
            reference_windows()
            engine_window()
    else:
        benchmark.pedantic(engine_window, setup=reference_windows, rounds=WINDOWS, iterations=1)

    per_sample = {name: [r.per_sample(samples)["total_j_per_sample"] for r in rs] for name, rs in readings.items()}
    ratios = {}
    for ref in REFERENCES:
        per_window = [theirs / ours for theirs, ours in zip(per_sample[ref], per_sample[engine.name])]
        ratios[ref] = RatioSummary(ref, statistics.median(per_window), min(per_window), max(per_window), per_window)
    benchmark.extra_info["energy"] = {
        "batch": transformer.TRAIN_BATCH, "sequence_length": shape.length, "samples_per_window": samples,
        "idle_power_w": round(idle.power_w, 2), "method": readings[engine.name][0].method,
        "total_j_per_sample": {n: float(f"{statistics.median(v):.4g}") for n, v in per_sample.items()},
        "active_j_per_sample": {
            n: float(f"{statistics.median(r.per_sample(samples)['active_j_per_sample'] for r in rs):.4g}")
            for n, rs in readings.items()},
        "avg_power_w": {n: round(statistics.median(r.avg_power_w for r in rs), 1) for n, rs in readings.items()},
        "samples_per_s": {n: round(samples / statistics.median(r.work_seconds for r in rs), 1)
                          for n, rs in readings.items()},
    }
    record_and_gate(benchmark, Comparison(engine.name, {}, {}, ratios), request.node.name, precision,
                    run_target.tier)
