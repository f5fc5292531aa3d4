"""A stand-in of the CUDA pieces autotuning uses (stream capture, graph replay, events), for tests without a GPU.

Ways run through `StandInDevice.run(name)`: eagerly that only counts the run, under capture it is recorded
into the graph. A replayed graph advances the device clock by the set time of every execution it holds, so
events around a replay read what the kernels would take, and nothing of the host.
"""
from __future__ import annotations

from types import SimpleNamespace


class StandInDevice:
    def __init__(self, ms: dict, jitter: dict | None = None):
        self.ms = dict(ms)            # way -> milliseconds per execution
        self.jitter = jitter or {}    # way -> extra ms on every other replay (a noisy way)
        self.clock = 0.0
        self.recording: list | None = None
        self.eager_runs: dict = {}
        self.replays: dict = {}
        self.captured_sizes: dict = {}
        self.stream = _Stream(self)
        self.xp = SimpleNamespace(cuda=SimpleNamespace(Event=lambda: _Event(self), get_elapsed_time=_elapsed))

    def run(self, name):
        if self.recording is not None:
            self.recording.append(name)
        else:
            self.eager_runs[name] = self.eager_runs.get(name, 0) + 1

    def way(self, name):
        return lambda: self.run(name)


class _Graph:
    def __init__(self, device: StandInDevice, executions: list):
        self.device, self.executions = device, executions

    def launch(self, stream):
        device = self.device
        for name in set(self.executions):
            device.replays[name] = device.replays.get(name, 0) + 1
        extra = sum(device.jitter.get(name, 0.0) for name in self.executions if device.replays[name] % 2)
        device.clock += sum(device.ms[name] for name in self.executions) + extra


class _Stream:
    def __init__(self, device: StandInDevice):
        self.device = device

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def begin_capture(self):
        self.device.recording = []

    def end_capture(self):
        executions, self.device.recording = self.device.recording, None
        if executions:
            sizes = self.device.captured_sizes.setdefault(executions[0], [])
            sizes.append(len(executions))
        return _Graph(self.device, executions)

    def is_capturing(self) -> bool:
        return self.device.recording is not None

    def synchronize(self):
        pass


class _Event:
    def __init__(self, device: StandInDevice):
        self.device, self.at = device, 0.0

    def record(self, stream):
        self.at = self.device.clock

    def synchronize(self):
        pass


def _elapsed(start: _Event, stop: _Event) -> float:
    return stop.at - start.at
