"""Warm-up -> capture -> replay of training steps in CUDA graphs.

A captured graph replays fixed kernels on fixed addresses, so it is only
valid while every buffer it touches is the one that was captured: replay
re-checks the bound buffers' addresses, shapes and dtypes and raises a clear
error instead of computing on stale memory (tinygrad's TinyJit does the same).
Step-to-step changes come from device memory (step_state.py), never from the
host. On the NumPy backend a "launch" runs its steps eagerly, so the same
grouping logic is exercised on the CPU.
"""
from __future__ import annotations

from typing import Callable

import numpy as np


class CaptureError(RuntimeError):
    """A graph was replayed after a buffer it captured changed."""


def _address(buf) -> int:
    if isinstance(buf, np.ndarray):   # its .data would be a memoryview, which bf16 arrays cannot make
        return buf.__array_interface__["data"][0]
    ptr = getattr(getattr(buf, "data", None), "ptr", None)   # a CuPy array's pointer, no interface dict built
    if ptr is not None:
        return ptr
    return buf.__cuda_array_interface__["data"][0]


def _signature(buffers: dict) -> dict:
    """Each buffer's address, shape and dtype: checked on every launch, so kept to attribute reads (a launch of
    MLP inference at batch 512 is about 20 us of host time, the whole of its step)."""
    return {name: (_address(b), b.shape, b.dtype) for name, b in buffers.items()}


class GraphCapturedStep:
    """`steps_per_launch` consecutive calls of `step_fn`, captured once and replayed."""

    def __init__(self, backend, step_fn: Callable[[], None], steps_per_launch: int, buffers: dict):
        if steps_per_launch < 1:
            raise ValueError(f"steps_per_launch must be >= 1, got {steps_per_launch}")
        self.backend, self.step_fn, self.steps_per_launch = backend, step_fn, steps_per_launch
        self.buffers = buffers
        self.graph = None
        self._captured = None

    @property
    def captured(self) -> bool:
        return self.graph is not None or (not self.backend.is_gpu and self._captured is not None)

    def capture(self):
        """Record the steps (no execution on the GPU: capture only records)."""
        self._captured = _signature(self.buffers)
        if not self.backend.is_gpu:
            return
        stream = self.backend.stream
        with stream:
            stream.begin_capture()
            try:
                for _ in range(self.steps_per_launch):
                    self.step_fn()
            finally:
                graph = stream.end_capture()
        self.graph = graph

    def launch(self):
        if not self.captured:
            raise CaptureError("launch() before capture(): warm up and capture first")
        now = _signature(self.buffers)
        if now != self._captured:
            changed = sorted(k for k in now if now[k] != self._captured.get(k))
            raise CaptureError(f"captured buffers changed since capture ({', '.join(changed)}): "
                               "rebuild the trainer instead of replaying a stale graph")
        if self.backend.is_gpu:
            self.graph.launch(self.backend.stream)
        else:
            for _ in range(self.steps_per_launch):
                self.step_fn()
