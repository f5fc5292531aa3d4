"""The energy meter against fakes of NVML: counter path, sampling fallback, idle subtraction, refusals.

The counter path runs on a fake clock (deterministic, instant); the sampling
path needs a real thread, so it runs on the real clock over windows of a
fraction of a second. The last test uses the real NVML and skips, saying why,
where there is none.
"""
from __future__ import annotations

import math
import time

import numpy as np
import pytest

from gpuengine.bench import nvml
from gpuengine.bench.energy import (COUNTER, SAMPLED, EnergyMeter, EnergyWindowTooShort, NvmlPowerProbe, PowerSampler,
    integrate_power, measure_idle)


class SteppedCounterGpu:
    """A fake GPU on a fake clock: piecewise-constant power and an energy counter that advances every step_s."""

    def __init__(self, step_s: float = 0.1, idle_w: float = 50.0):
        self.now, self.power_w, self.step_s = 0.0, idle_w, step_s
        self.energy_j = self.counter_j = 0.0
        self.next_tick = step_s

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float):
        end = self.now + seconds
        while self.next_tick <= end:
            self.energy_j += self.power_w * (self.next_tick - self.now)
            self.now, self.counter_j = self.next_tick, self.energy_j
            self.next_tick += self.step_s
        self.energy_j += self.power_w * (end - self.now)
        self.now = end

    def energy_mj(self):
        return int(round(self.counter_j * 1e3))

    def power_mw(self):
        return self.power_w * 1e3


class RealTimeGpu:
    """A fake GPU on the real clock whose power is `power(t)`; no counter, or one that never advances."""

    def __init__(self, power, counter: int | None = None):
        self.power, self.counter = power, counter

    def energy_mj(self):
        return self.counter

    def power_mw(self):
        return self.power(time.perf_counter()) * 1e3


def counter_meter(gpu: SteppedCounterGpu, **options) -> EnergyMeter:
    return EnergyMeter(gpu, clock=gpu.clock, sleep=gpu.sleep, **options)


def run_work(gpu: SteppedCounterGpu, watts: float, seconds: float):
    idle, gpu.power_w = gpu.power_w, watts
    gpu.sleep(seconds)
    gpu.power_w = idle


def test_counter_path_measures_total_and_active_energy():
    gpu = SteppedCounterGpu(step_s=0.1, idle_w=50.0)
    with counter_meter(gpu) as meter:
        run_work(gpu, 250.0, 3.0)
    r = meter.reading
    assert r.method == COUNTER
    assert r.idle_power_w == pytest.approx(50.0, rel=0.01)
    assert r.work_seconds == pytest.approx(3.0, abs=2e-3)
    assert 3.0 <= r.seconds <= 3.0 + 0.1 + 2e-3                     # the window ends on the counter's next step
    assert r.total_j == pytest.approx(750.0 + 50.0 * (r.seconds - 3.0), rel=1e-3)
    assert r.active_j == pytest.approx(200.0 * 3.0, rel=2e-3)        # (250 - 50) W of work for 3 s
    assert r.avg_power_w == pytest.approx(r.total_j / r.seconds)
    assert r.per_sample(1000)["active_j_per_sample"] == pytest.approx(0.6, rel=2e-3)


def test_counter_step_is_measured_and_sets_the_shortest_window():
    gpu = SteppedCounterGpu(step_s=0.25)
    meter = counter_meter(gpu, tolerance=0.05)
    with meter:
        run_work(gpu, 300.0, 6.0)
    assert meter.idle.counter_step_s == pytest.approx(0.25, abs=2e-3)
    assert meter.min_window_s() == pytest.approx(5.0, rel=0.01)     # 0.25 s / 5%


def test_too_short_window_is_refused_not_reported_as_zero():
    gpu = SteppedCounterGpu(step_s=0.1)
    meter = counter_meter(gpu)
    with pytest.raises(EnergyWindowTooShort, match=r"advances every ~100 ms.*at least 2\.00 s"):
        with meter:
            run_work(gpu, 250.0, 0.5)
    assert meter.reading is None


def test_one_idle_baseline_serves_several_meters():
    gpu = SteppedCounterGpu(step_s=0.1, idle_w=40.0)
    idle = measure_idle(gpu, 1.0, clock=gpu.clock, sleep=gpu.sleep)
    readings = []
    for watts in (100.0, 300.0):
        with counter_meter(gpu, idle=idle) as meter:
            run_work(gpu, watts, 2.5)
        readings.append(meter.reading)
    assert [r.idle_power_w for r in readings] == [idle.power_w] * 2
    assert readings[1].active_j / readings[0].active_j == pytest.approx(260.0 / 60.0, rel=0.01)


def test_an_error_inside_the_window_propagates_and_leaves_no_reading():
    gpu = SteppedCounterGpu()
    meter = counter_meter(gpu)
    with pytest.raises(ZeroDivisionError):
        with meter:
            1 / 0
    assert meter.reading is None


def synthetic_power(t):
    return 120.0 + 60.0 * np.sin(2 * np.pi * t / 0.4)


def synthetic_energy(t0, t1):
    """The exact integral of synthetic_power over [t0, t1]."""
    k = 0.4 / (2 * np.pi)
    return 120.0 * (t1 - t0) - 60.0 * k * (np.cos(t1 / k) - np.cos(t0 / k))


def test_trapezoid_integration_of_irregular_20hz_samples_is_accurate():
    rng = np.random.default_rng(0)
    times = np.cumsum(rng.uniform(0.03, 0.05, 150))                 # 20..33 Hz with jitter, 6 s
    samples = [(t, synthetic_power(t)) for t in times]
    exact = synthetic_energy(times[0], times[-1])
    assert integrate_power(samples) == pytest.approx(exact, rel=0.01)
    assert integrate_power(list(reversed(samples))) == pytest.approx(integrate_power(samples))


def test_power_sampler_thread_integrates_a_live_curve():
    sampler = PowerSampler(RealTimeGpu(synthetic_power), hz=200)
    sampler.start()
    time.sleep(0.5)
    joules, t0, t1 = sampler.stop()
    assert len(sampler.samples) > 0.5 * 200 * (t1 - t0)
    assert joules == pytest.approx(synthetic_energy(t0, t1), rel=0.02)


def test_sampling_fallback_subtracts_idle_power():
    level = {"watts": 40.0}
    gpu = RealTimeGpu(lambda t: level["watts"], counter=None)
    meter = EnergyMeter(gpu, idle_seconds=0.2, sample_hz=200, min_seconds=0.3)
    with meter:
        level["watts"] = 200.0
        time.sleep(0.5)
        level["watts"] = 40.0
    r = meter.reading
    assert r.method == SAMPLED
    assert r.idle_power_w == pytest.approx(40.0)
    assert r.active_j == pytest.approx(160.0 * r.work_seconds, rel=0.05)


def test_a_counter_that_never_advances_falls_back_to_sampling():
    idle = measure_idle(RealTimeGpu(lambda t: 75.0, counter=12345), seconds=0.15, sample_hz=100)
    assert idle.counter_step_s is None and idle.power_w == pytest.approx(75.0)


def test_sampling_below_20_hz_is_refused():
    with pytest.raises(ValueError, match=">= 20 Hz"):
        EnergyMeter(RealTimeGpu(lambda t: 1.0), sample_hz=10)


def test_real_nvml_meter_or_skip_with_the_reason():
    reason = nvml.unavailable_reason()
    if reason is not None:
        pytest.skip(f"energy needs NVML: {reason}")
    gpu_probe = NvmlPowerProbe(next(iter(nvml.device_handles().values())))
    idle = measure_idle(gpu_probe, seconds=0.5)
    assert idle.power_w > 0 and math.isfinite(idle.power_w)
