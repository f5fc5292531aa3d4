"""Training state that lives on the device, so a replayed graph stays correct.

A captured CUDA graph replays the same kernels with the same arguments, so
anything that changes from step to step must be read from device memory: the
global step count (which batch to gather, Adam's bias correction) and where
this step's loss goes (a per-epoch slot of the loss history). The host reads
the history once per `train()` call, never inside a step, together with the
first step whose loss was inf or nan (kept by the kernel that books the loss,
so watching for divergence costs no kernel and no read per step).
"""
from __future__ import annotations

import numpy as np

from .kernels import get_kernel

_SOURCE = r"""
extern "C" __global__ void finish_step(long long* step) { step[0] += 1; }
extern "C" __global__ void book_loss(const float* partials, int count, float scale, const float* device_scale,
                                     const long long* step, long long steps_per_epoch, float* history,
                                     long long capacity, long long* diverged) {
    float s = 0.f;
    for (int i = threadIdx.x; i < count; i += 32) s += partials[i];
    s = warp_sum(s);
    if (threadIdx.x == 0)
        book_loss_value(step, steps_per_epoch, history, capacity, diverged, s * scale * device_scale[0]);
}
"""
HISTORY_CAPACITY = 1024  # epochs kept on the device between host reads


class StepState:
    """Device step counter and per-epoch loss history (sums of per-step mean losses)."""

    def __init__(self, backend, allocator, steps_per_epoch: int):
        if steps_per_epoch < 1:
            raise ValueError(f"steps_per_epoch must be >= 1, got {steps_per_epoch}")
        self.backend = backend
        self.steps_per_epoch = steps_per_epoch
        self.step = allocator.zeros((1,), np.int64, "workspace")
        self.history = allocator.zeros((HISTORY_CAPACITY,), np.float32, "workspace")
        self.capacity = HISTORY_CAPACITY
        self.diverged = allocator.zeros((1,), np.int64, "workspace")   # first step with a non-finite loss, or -1
        self.one = allocator.zeros((1,), np.float32, "workspace")   # the device scale of a loss that has none
        with backend.activate():
            self.one.fill(1.0)
            self.diverged.fill(-1)
        if backend.is_gpu:
            self._finish = get_kernel(_SOURCE, "finish_step")
            self._book = get_kernel(_SOURCE, "book_loss")

    def finish_step(self):
        """Advance the step counter (the last kernel of every training step)."""
        if self.backend.is_gpu:
            self._finish((1,), (1,), (self.step,))
        else:
            self.step[0] += 1

    def read_step(self) -> int:
        return int(self.backend.to_host(self.step)[0])

    def add_loss_host(self, step: int, value: float):
        """NumPy backend: accumulate a step's loss into its epoch slot."""
        self.history[(step // self.steps_per_epoch) % self.capacity] += value
        if not np.isfinite(value) and self.diverged[0] < 0:
            self.diverged[0] = step

    def read_diverged(self) -> int | None:
        """The first step whose loss was inf or nan, None while every loss has been finite (one host read)."""
        step = int(self.backend.to_host(self.diverged)[0])
        return None if step < 0 else step

    def book_partials(self, partials, count: int, scale: float = 1.0, device_scale=None):
        """Add scale * device_scale[0] * sum(partials[:count]) to this step's epoch slot: one warp, a fixed
        order, no atomics, so a loss is the same on every run (the partials are per-block sums a loss kernel
        wrote). `device_scale` is a scale only the device knows (a token count of this batch)."""
        device_scale = self.one if device_scale is None else device_scale
        self._book((1,), (32,), (partials, np.int32(count), np.float32(scale), device_scale) + self.kernel_args())

    def kernel_args(self):
        """(step pointer, steps per epoch, history pointer, capacity, diverged pointer) for loss kernels: the
        arguments of the prelude's book_loss_value."""
        return (self.step, np.int64(self.steps_per_epoch), self.history, np.int64(self.capacity), self.diverged)

    def clear_history(self):
        with self.backend.activate():
            self.history.fill(0)

    def read_epoch_losses(self, first_epoch: int, count: int) -> list[float]:
        """Mean loss of epochs [first_epoch, first_epoch + count): one device-to-host read."""
        if count > self.capacity:
            raise ValueError(f"{count} epochs exceed the history capacity {self.capacity}; read more often")
        host = self.backend.to_host(self.history)
        slots = [(first_epoch + i) % self.capacity for i in range(count)]
        return [float(host[s]) / self.steps_per_epoch for s in slots]
