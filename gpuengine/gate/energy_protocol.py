"""The energy-per-sample protocol that every energy test runs (seed note 004's method, made same-run).

`gpuengine.bench.energy.EnergyMeter` reads NVML's energy counter around a
synchronised window (power sampling where the GPU has no counter), after one
idle-power reading taken first, so each window yields total and active
(idle-subtracted) joules. Every runner trains the same number of samples per
window, sized so the fastest runner's window is long enough for the counter to
resolve; runners alternate window by window (A B C A B C), and the per-window
ratio reference J/sample over engine J/sample (> 1: the engine spends less) is
what thresholds.json gates. The loss is read before and after the windows:
every side must still be training.
"""
from __future__ import annotations

import math
import statistics

import pytest

from gpuengine.bench import nvml
from gpuengine.bench.benchmarking import Comparison, RatioSummary, time_round
from gpuengine.bench.energy import EnergyMeter, NvmlPowerProbe

from .harness import assert_losses_descend, epoch_loss

WINDOWS = 3            # windows per runner, alternating
WINDOW_S = 2.0         # at least; longer where the counter's step needs it (a test: <= 30 s with two sides)
WINDOW_MARGIN = 1.25   # rounds inside a long window can run faster than the few timed to size it
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


def compare_energy(benchmark, probe, idle, engine, refs) -> tuple[Comparison, dict]:
    """Alternating energy windows of the engine and `refs`: the comparison to gate and the run's energy figures.

    `idle` is the reading taken before anything of the test ran on the device. What pytest-benchmark times is
    the engine's energy window.
    """
    runners = [*refs, engine]
    for runner in runners:
        runner.prepare()
        time_round(runner)   # one untimed round: allocator and clocks settle
    first = {r.name: epoch_loss(r) for r in runners}
    fastest_ms = min(min(time_round(r) for _ in range(3)) for r in runners)
    window_s = WINDOW_MARGIN * max(WINDOW_S, EnergyMeter(probe, idle=idle).min_window_s())
    rounds = math.ceil(window_s * 1e3 / fastest_ms)
    samples = rounds * engine.samples_per_round
    if any(r.samples_per_round != engine.samples_per_round for r in refs):
        raise ValueError("energy windows compare equal samples: every runner needs the engine's samples per round")
    readings: dict = {}

    def reference_windows():
        for ref in refs:
            energy_window(ref, probe, idle, rounds, samples, readings)

    def engine_window():
        energy_window(engine, probe, idle, rounds, samples, readings)

    if benchmark.disabled:   # pedantic would run one window only (xdist, --benchmark-disable)
        for _ in range(WINDOWS):
            reference_windows()
            engine_window()
    else:
        benchmark.pedantic(engine_window, setup=reference_windows, rounds=WINDOWS, iterations=1)
    assert_losses_descend(benchmark, first, {r.name: epoch_loss(r) for r in runners})

    per_sample = {name: [r.per_sample(samples)["total_j_per_sample"] for r in rs] for name, rs in readings.items()}
    ratios = {}
    for ref in refs:
        per_window = [theirs / ours for theirs, ours in zip(per_sample[ref.name], per_sample[engine.name])]
        ratios[ref.name] = RatioSummary(ref.name, statistics.median(per_window), min(per_window), max(per_window),
                                        per_window)
    figures = {
        "samples_per_window": samples, "idle_power_w": round(idle.power_w, 2),
        "method": readings[engine.name][0].method,
        "total_j_per_sample": {n: float(f"{statistics.median(v):.4g}") for n, v in per_sample.items()},
        "active_j_per_sample": {
            n: float(f"{statistics.median(r.per_sample(samples)['active_j_per_sample'] for r in rs):.4g}")
            for n, rs in readings.items()},
        "avg_power_w": {n: round(statistics.median(r.avg_power_w for r in rs), 1) for n, rs in readings.items()},
        "samples_per_s": {n: round(samples / statistics.median(r.work_seconds for r in rs), 1)
                          for n, rs in readings.items()},
    }
    return Comparison(engine.name, {}, {}, ratios), figures
