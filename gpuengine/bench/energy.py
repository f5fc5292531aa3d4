"""Device energy of a window of work: NVML's energy counter, or integrated power samples.

Seed note 004 integrated 20 Hz nvidia-smi power samples. Where the GPU has
one (Volta and newer), NVML's total-energy counter (mJ since the driver
loaded) is better: it integrates on the device. The counter advances in
steps, so each window starts and ends on a step (polled at 1 ms) and a
window shorter than `step / tolerance` is refused (`EnergyWindowTooShort`)
rather than reported as a wrong or zero figure. Without the counter, power
is sampled in a thread at >= 20 Hz and integrated with the trapezoid rule.
Idle power is measured first, so a reading gives both the total energy and
the active energy (total minus idle power times the window).
"""
from __future__ import annotations

import math
import statistics
import threading
import time
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

from . import nvml as nvml_lib

COUNTER = "nvml_energy_counter"
SAMPLED = "nvml_power_sampling"
MIN_SAMPLE_HZ = 20.0
_POLL_S = 0.001   # counter polling interval: the window's edges are this precise


class EnergyWindowTooShort(RuntimeError):
    """The window was too short for the energy counter (or the power sampling) to resolve."""


class PowerProbe(Protocol):
    """The two NVML readings the meter needs (a fake in tests)."""

    def energy_mj(self) -> int | None:
        """Total energy since the driver loaded, in mJ; None where this GPU has no counter."""

    def power_mw(self) -> float:
        ...


class NvmlPowerProbe:
    def __init__(self, handle):
        self.handle = handle
        self._nvml = nvml_lib.nvml()

    @classmethod
    def for_cuda_device(cls, framework: str = "cupy") -> "NvmlPowerProbe":
        return cls(nvml_lib.handle_for_cuda_device(framework))

    def energy_mj(self) -> int | None:
        try:
            return int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))
        except self._nvml.NVMLError as exc:
            if nvml_lib.is_not_supported(exc):
                return None
            raise

    def power_mw(self) -> float:
        return float(self._nvml.nvmlDeviceGetPowerUsage(self.handle))


def integrate_power(samples: Sequence[tuple[float, float]]) -> float:
    """Joules from (seconds, watts) samples by the trapezoid rule (sorted by time first)."""
    points = sorted(samples)
    return sum((t1 - t0) * (p0 + p1) / 2 for (t0, p0), (t1, p1) in zip(points, points[1:]))


class PowerSampler:
    """Power samples at `hz` in a thread, plus one at start and one at stop (the window's edges)."""

    def __init__(self, probe: PowerProbe, hz: float, clock: Callable[[], float] = time.perf_counter):
        if hz < MIN_SAMPLE_HZ:
            raise ValueError(f"sample_hz={hz}: power must be sampled at >= {MIN_SAMPLE_HZ:g} Hz")
        self.probe, self.hz, self.clock = probe, hz, clock
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def _take(self):
        self.samples.append((self.clock(), self.probe.power_mw() / 1e3))

    def _run(self):
        try:
            while not self._stop.wait(1.0 / self.hz):
                self._take()
        except BaseException as exc:  # re-raised by stop(): a dead sampler must not pass for low power
            self._error = exc

    def start(self):
        self._take()
        self._thread = threading.Thread(target=self._run, name="power-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> tuple[float, float, float]:
        """(joules, start time, stop time)."""
        self._stop.set()
        self._thread.join()
        self._take()
        if self._error is not None:
            raise RuntimeError(f"power sampling failed: {self._error!r}") from self._error
        seconds = self.samples[-1][0] - self.samples[0][0]
        achieved = (len(self.samples) - 1) / seconds if seconds > 0 else 0.0
        if seconds > 10 / self.hz and achieved < MIN_SAMPLE_HZ:
            raise RuntimeError(f"power sampling reached {achieved:.1f} Hz, below {MIN_SAMPLE_HZ:g} Hz "
                               "(sampler thread starved?)")
        return integrate_power(self.samples), self.samples[0][0], self.samples[-1][0]


@dataclass(frozen=True)
class IdleBaseline:
    """Idle power, and how often the energy counter advances (None: no usable counter)."""

    power_w: float
    counter_step_s: float | None


@dataclass(frozen=True)
class EnergyReading:
    total_j: float
    active_j: float       # total_j minus idle power over the window
    seconds: float        # the measured window (counter steps or sampling edges)
    work_seconds: float   # synchronize-to-synchronize time of the work itself
    avg_power_w: float
    idle_power_w: float
    method: str           # COUNTER or SAMPLED

    def per_sample(self, samples: int) -> dict[str, float]:
        return {"total_j_per_sample": self.total_j / samples, "active_j_per_sample": self.active_j / samples}


def _next_counter_step(probe: PowerProbe, clock, sleep, timeout_s: float,
                       since: int | None = None) -> tuple[float, int] | None:
    """(time, value) of the counter's next advance past `since` (default: its value now), or None on timeout."""
    since, start = (probe.energy_mj() if since is None else since), clock()
    while clock() - start < timeout_s:
        value = probe.energy_mj()
        if value != since:
            return clock(), value
        sleep(_POLL_S)
    return None


def measure_idle(probe: PowerProbe, seconds: float = 1.0, sample_hz: float = 50.0,
                 clock: Callable[[], float] = time.perf_counter, sleep: Callable[[float], None] = time.sleep
                 ) -> IdleBaseline:
    """Idle power over about `seconds` with the device drained; the counter's step when it has one."""
    if probe.energy_mj() is not None:
        first = _next_counter_step(probe, clock, sleep, timeout_s=seconds)
        if first is not None:
            steps, last = [first], first
            while clock() - first[0] < seconds:
                step = _next_counter_step(probe, clock, sleep, timeout_s=seconds, since=last[1])
                if step is None:
                    break
                steps.append(step)
                last = step
            if len(steps) >= 3:   # two intervals at least, or the step size is a guess
                step_s = statistics.median(b[0] - a[0] for a, b in zip(steps, steps[1:]))
                return IdleBaseline((last[1] - first[1]) / 1e3 / (last[0] - first[0]), step_s)
        # A counter that does not advance at idle is as good as none: fall back to sampling.
    sampler = PowerSampler(probe, sample_hz, clock)
    sampler.start()
    sleep(seconds)
    joules, t0, t1 = sampler.stop()
    return IdleBaseline(joules / (t1 - t0), None)


class EnergyMeter:
    """`with EnergyMeter(probe, runner.synchronize) as meter: <work>` then `meter.reading`.

    The device is synchronised at both edges, so the window holds exactly the
    work enqueued inside it. Pass one `idle` baseline to several meters to
    compare runners against the same idle power.
    """

    def __init__(self, probe: PowerProbe, synchronize: Callable[[], None] = lambda: None, *,
                 idle: IdleBaseline | None = None, idle_seconds: float = 1.0, sample_hz: float = 50.0,
                 min_seconds: float = 1.0, tolerance: float = 0.05,
                 clock: Callable[[], float] = time.perf_counter, sleep: Callable[[float], None] = time.sleep):
        if sample_hz < MIN_SAMPLE_HZ:
            raise ValueError(f"sample_hz={sample_hz}: power must be sampled at >= {MIN_SAMPLE_HZ:g} Hz")
        if not 0 < tolerance < 1:
            raise ValueError(f"tolerance={tolerance} must be a fraction between 0 and 1")
        self.probe, self.synchronize, self.idle = probe, synchronize, idle
        self.idle_seconds, self.sample_hz = idle_seconds, sample_hz
        self.min_seconds, self.tolerance = min_seconds, tolerance
        self.clock, self.sleep = clock, sleep
        self.reading: EnergyReading | None = None

    @property
    def method(self) -> str:
        return COUNTER if self.idle.counter_step_s is not None else SAMPLED

    def min_window_s(self) -> float:
        """The shortest work window this meter resolves to within `tolerance`."""
        step = self.idle.counter_step_s if self.idle.counter_step_s is not None else 1.0 / self.sample_hz
        return max(self.min_seconds, step / self.tolerance)

    def __enter__(self) -> "EnergyMeter":
        self.synchronize()
        if self.idle is None:
            self.idle = measure_idle(self.probe, self.idle_seconds, self.sample_hz, self.clock, self.sleep)
        if self.method == COUNTER:
            edge = _next_counter_step(self.probe, self.clock, self.sleep, timeout_s=10 * self.idle.counter_step_s)
            if edge is None:
                raise RuntimeError("NVML's energy counter stopped advancing")
            self._start, self._start_mj = edge
        else:
            self._sampler = PowerSampler(self.probe, self.sample_hz, self.clock)
            self._sampler.start()
        self._work_start = self.clock()
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            if self.method == SAMPLED:
                self._sampler.stop()
            return False
        self.synchronize()
        work_seconds = self.clock() - self._work_start
        if self.method == COUNTER:
            edge = _next_counter_step(self.probe, self.clock, self.sleep, timeout_s=10 * self.idle.counter_step_s)
            if edge is None:
                raise RuntimeError("NVML's energy counter stopped advancing")
            stop, stop_mj = edge
            start, joules = self._start, (stop_mj - self._start_mj) / 1e3
        else:
            joules, start, stop = self._sampler.stop()
        self._check_window(work_seconds, joules)
        seconds = stop - start
        self.reading = EnergyReading(joules, joules - self.idle.power_w * seconds, seconds, work_seconds,
                                     joules / seconds, self.idle.power_w, self.method)
        return False

    def _check_window(self, work_seconds: float, joules: float):
        needed = self.min_window_s()
        if work_seconds >= needed and joules > 0 and math.isfinite(joules):
            return
        if self.method == COUNTER:
            why = (f"NVML's energy counter on this GPU advances every ~{self.idle.counter_step_s * 1e3:.0f} ms, "
                   f"so resolving a window to {self.tolerance:.0%} takes at least {needed:.2f} s")
        else:
            why = (f"power sampled at {self.sample_hz:g} Hz resolves a window to {self.tolerance:.0%} "
                   f"only from {needed:.2f} s on")
        raise EnergyWindowTooShort(f"the measured work lasted {work_seconds:.3f} s ({joules:.3f} J): {why}; "
                                   "run more work inside the meter")
