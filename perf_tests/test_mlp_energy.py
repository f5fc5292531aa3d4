"""Energy per training sample on the dense Rosenbrock MLP, engine vs PyTorch (seed note 004's method).

Seed note 004 integrated 20 Hz power over a run and divided by the samples;
here `gpuengine.bench.energy.EnergyMeter` reads NVML's energy counter around a
synchronised window (power sampling where the GPU has no counter), after one
idle-power reading at the start, so each window yields total and active
(idle-subtracted) joules. Every runner trains the same number of samples per
window (TF32, batch 8000, 4 batches per epoch), sized so the fastest runner's
window is long enough for the counter to resolve; runners alternate window by
window (A B C A B C), and the per-window ratio reference J/sample over engine
J/sample (> 1: the engine spends less) is gated by thresholds.json. What
pytest-benchmark times is the engine's energy window; the energy figures are
in the run's extra_info["energy"]. Takes a few minutes: `slow`.
"""
from __future__ import annotations

import math
import statistics

import pytest

from gpuengine.bench import nvml
from gpuengine.bench.benchmarking import Comparison, RatioSummary, time_round
from gpuengine.config import EngineConfig
from gpuengine.bench.energy import EnergyMeter, NvmlPowerProbe, measure_idle
from gpuengine.bench.runners import EngineTrainRunner
from gpuengine.workloads import mlp

from .harness import record_and_gate, skip_unless_selected

pytest.importorskip("torch", reason="PyTorch is not installed: no reference")
from gpuengine.reference import torch_mlp  # noqa: E402  (needs torch)
pytestmark = pytest.mark.gpu

PRECISION = "tf32"
BATCH = mlp.TRAIN_BATCH
BATCHES_PER_EPOCH = 4
GRAPH_STEPS = 1        # the engine's default toggles: what the stored H200 run measured
REFERENCES = ("torch_graph", "torch_eager")
WINDOWS = 3            # windows per runner, alternating
WINDOW_S = 4.0         # at least; longer where the counter's step needs it
WINDOW_MARGIN = 1.5
IDLE_S = 2.0


@pytest.fixture(scope="module")
def power_probe():
    reason = nvml.unavailable_reason()
    if reason is not None:
        pytest.skip(f"energy per sample needs NVML: {reason}")
    return NvmlPowerProbe.for_cuda_device("cupy")


def energy_window(runner, probe, idle, rounds: int, samples: int, readings: dict):
    """`rounds` rounds of `runner` inside one energy meter; the reading goes to readings[runner.name]."""
    with EnergyMeter(probe, runner.synchronize, idle=idle) as meter:
        for _ in range(rounds):
            runner.run_round()
    assert meter.reading.total_j > 0, f"{runner.name}: no energy measured for {samples} samples"
    readings.setdefault(runner.name, []).append(meter.reading)


@pytest.mark.parametrize("precision", [PRECISION])
def test_mlp_train_energy(precision, power_probe, benchmark, request, run_target):
    skip_unless_selected(run_target, precision=precision, cuda_graph=GRAPH_STEPS, resident_data=True)
    idle = measure_idle(power_probe, IDLE_S)   # first, before anything here has run on the device
    net = mlp.build_mlp()
    x, t = mlp.mlp_data(BATCH * BATCHES_PER_EPOCH)
    config = EngineConfig(precision=precision, cuda_graph=GRAPH_STEPS, resident_data=True, device="cuda")
    engine = EngineTrainRunner(net, x, t, BATCH, config, epochs_per_round=1, lr=mlp.LEARNING_RATE)
    weights = engine.trainer.params.state_dict()
    refs = [torch_mlp.mlp_train_runner(mode, x, t, BATCH, precision, lr=mlp.LEARNING_RATE, device="cuda",
                                       weights=weights) for mode in REFERENCES]
    runners = [*refs, engine]
    for runner in runners:
        runner.prepare()
        time_round(runner)   # one untimed round: allocator and clocks settle
    # Same samples for every runner: enough rounds for the fastest to fill a window the counter resolves,
    # with a margin because rounds inside a long window can run faster than these few timed ones.
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
        "batch": BATCH, "batches_per_epoch": BATCHES_PER_EPOCH, "samples_per_window": samples,
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
