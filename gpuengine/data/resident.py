"""A data set staged on the device once; batches are gathered there every step.

Seed note 000: staging the data set once and gathering on the device removes
the per-step host round trip. Here the gather also runs inside the captured
graph (the note's "future work"), reading the device step counter, so a step
needs no host work at all. Inputs are stored in the compute dtype (bf16 halves
the bytes under bf16); targets stay float32. A data set of exactly one batch
is its own batch buffer (full-batch training, and the max-batch protocol).
"""
from __future__ import annotations

import numpy as np

from .gather import DeviceGather


class ResidentDataset:
    """(x, t) on the device; `load_batch()` fills `batch_x`, `batch_t` for the current step."""

    def __init__(self, backend, allocator, policy, state, x: np.ndarray, t: np.ndarray, batch: int, seed: int = 0,
                 rank: int = 0, world: int = 1):
        # batch: this rank's rows of a global batch of batch * world (data parallel; world 1 otherwise)
        self.backend, self.state, self.batch, self.seed = backend, state, batch, seed
        self.rank, self.world, self._allocator, self._batch_innermost = rank, world, allocator, None
        self.samples = len(x)
        self.x = allocator.zeros(x.shape, policy.compute_dtype, "batch")
        self.t = allocator.zeros(t.shape, np.float32, "batch")
        with backend.activate():
            backend.upload(self.x, x)
            backend.upload(self.t, t)
        if batch == self.samples:
            # A step's loss and gradients are sums over its rows, so a shuffled gather of the whole
            # data set would only reorder them: the data set itself is the batch, held once.
            self.batch_x, self.batch_t, self._gather = self.x, self.t, None
            return
        self.batch_x = allocator.zeros((batch,) + x.shape[1:], policy.compute_dtype, "batch")
        self.batch_t = allocator.zeros((batch,) + t.shape[1:], np.float32, "batch")
        self._gather = DeviceGather(backend, state, self.x, self.t, self.batch_x, self.batch_t,
                                    seed=seed, rank=rank, world=world)

    @property
    def steps_per_epoch(self) -> int:
        return self.samples // (self.batch * self.world)

    def before_launch(self, first_step: int, steps: int):
        """Nothing to stage: the data is already on the device."""

    def after_launch(self, first_step: int, steps: int):
        """Nothing to recycle."""

    def load_batch(self):
        if self._gather is not None:
            self._gather.run()

    def end_step(self):
        """Nothing runs beside the step."""

    def batch_innermost_input(self):
        """The batch's x also stored (features, batch): written by the gather in its pass, or once here where the
        data set is the batch (it never changes); None where the rows are not float32, or where a second copy of
        the batch would not leave the device room for the rest of the set-up (the largest batches)."""
        if self._batch_innermost is not None:
            return self._batch_innermost
        if self.batch_x.dtype != np.float32 or not self._allocator.fits(self.batch_x.nbytes):
            return None
        features = self.batch_x.size // self.batch
        self._batch_innermost = self._allocator.zeros((features, self.batch), np.float32, "batch")
        if self._gather is None:
            self._batch_innermost[...] = self.batch_x.reshape(self.batch, features).T
        else:
            self._gather.also_batch_innermost(self._batch_innermost)
        return self._batch_innermost

    def rows_of_step(self, step: int) -> np.ndarray:
        if self._gather is None:
            return np.arange(self.samples)
        return self._gather.host_rows(step)
