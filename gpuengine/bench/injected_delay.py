"""Validation only: a busy wait at the end of every engine step, to make the engine a known amount slower.

`./gate gatepower` measures how often the regression gate
catches a slowdown it knows is there. On a GPU the wait is a one-thread CUDA
kernel spinning on %globaltimer for the nanoseconds in a device scalar:
launched at the end of the step, it is captured into the step's CUDA graph,
and a new delay reaches captured graphs without a new capture (as Adam's
device-side lr does). On the NumPy backend the step spins on the host clock
(a sleep is too coarse for microseconds).

Off unless the environment arms it: GATEPOWER_INJECT_DELAY_US (the starting
delay per step) together with GATEPOWER_STUDY (the study's output folder),
which only the gatepower command sets. The delay variable without the guard
is refused with an error naming both. The engine never imports this module:
the suite's runners hand `step_hook(config)` to the engines they build, and
unarmed it is None, so the step has no extra work.
"""
from __future__ import annotations

import os
import time
from typing import Callable

import numpy as np

from ..runtime.backend import get_backend
from ..runtime.kernels import get_kernel

DELAY_ENV = "GATEPOWER_INJECT_DELAY_US"
GUARD_ENV = "GATEPOWER_STUDY"

_SOURCE = r"""
extern "C" __global__ void spin(const long long* delay_ns) {
    const long long wait = delay_ns[0];
    if (wait <= 0) return;
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); } while (now - start < (unsigned long long)wait);
}
"""


class InjectionRefused(RuntimeError):
    """The injected slowdown was asked for outside the validation command."""


def _parse_us(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 <= value < float("inf"):
        raise InjectionRefused(f"{DELAY_ENV}={raw!r}: use a number of microseconds >= 0")
    return value


def armed() -> bool:
    """Whether this process injects the delay; the delay variable without its guard is an error."""
    raw = os.environ.get(DELAY_ENV)
    if raw is None:
        return False
    if not os.environ.get(GUARD_ENV):
        raise InjectionRefused(f"{DELAY_ENV} is set but {GUARD_ENV} is not: the injected slowdown exists only "
                               "for `./gate gatepower`; unset it to measure the engine as it is")
    _parse_us(raw)
    return True


class StepDelay:
    """The wait one backend's engine steps end with; `set_us` changes it for captured graphs too."""

    def __init__(self, backend, us: float):
        self.backend = backend
        if backend.is_gpu:
            with backend.activate():
                self._delay_ns = backend.xp.zeros((1,), np.int64)
            self._kernel = get_kernel(_SOURCE, "spin")
        self.set_us(us)

    def set_us(self, us: float):
        if not 0 <= us < float("inf"):
            raise ValueError(f"the injected delay must be >= 0 microseconds, got {us}")
        self.us = float(us)
        if self.backend.is_gpu:
            with self.backend.activate():   # on the engine stream: ordered before the next launch
                self.backend.upload(self._delay_ns, np.array([round(us * 1e3)], np.int64))

    def wait(self):
        """Enqueue the wait (GPU; capturable) or spend it now (CPU)."""
        if self.backend.is_gpu:
            self._kernel((1,), (1,), (self._delay_ns,))
            return
        end = time.perf_counter() + self.us * 1e-6
        while time.perf_counter() < end:
            pass


_delays: dict[int, StepDelay] = {}


def for_backend(backend) -> StepDelay | None:
    """The step delay engines on `backend` must end each step with, or None when not armed (always, normally)."""
    if not armed():
        return None
    if id(backend) not in _delays:
        _delays[id(backend)] = StepDelay(backend, _parse_us(os.environ[DELAY_ENV]))
    return _delays[id(backend)]


def step_hook(config) -> Callable[[], None] | None:
    """What engines built with `config` end each step with: the armed delay's wait, or None (not armed)."""
    delay = for_backend(get_backend(config))
    return None if delay is None else delay.wait


def set_delay_us(us: float):
    """Change the delay of every armed engine of this process (the study's trials); refused when not armed."""
    if not armed():
        raise InjectionRefused(f"set_delay_us needs {DELAY_ENV} and {GUARD_ENV} (./gate gatepower)")
    os.environ[DELAY_ENV] = repr(float(us))   # engines built later start at the same delay
    for delay in _delays.values():
        delay.set_us(us)
