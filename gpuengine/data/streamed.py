"""A host-resident data set streamed to the device through a pool of batch buffers.

For data that does not fit the device (or lives on disk), each batch is
gathered on the host into pinned memory and copied asynchronously into one of
`batch_pool` device buffers on a copy stream, overlapping the compute of the
steps before it (seed note 000's prefetch pool; a pool of 1 minimises memory,
3 hides latency). The step itself starts by copying its pool slot into the
static batch buffers (the same gather kernel, in ring mode), so it can be
captured; a launch of N captured steps therefore needs N staged slots. With a
pool of 1 the single slot is the batch buffer: one device copy of the batch.
"""
from __future__ import annotations

import numpy as np

from ..config import ConfigError
from .gather import DeviceGather
from .shuffle import batch_rows


def check_streamed_launch(steps: int, pool: int):
    """A launch of `steps` captured steps reads `steps` distinct pool buffers."""
    if steps > pool:
        raise ConfigError(f"cuda_graph={steps} with resident_data=0 needs batch_pool >= {steps}: "
                          f"each captured step reads its own prefetched buffer (batch_pool={pool})")


class StreamedDataset:
    def __init__(self, backend, allocator, policy, state, x: np.ndarray, t: np.ndarray, batch: int,
                 seed: int = 0, pool: int = 3, rank: int = 0, world: int = 1):
        # batch: this rank's rows of a global batch of batch * world (data parallel; world 1 otherwise)
        self.backend, self.state, self.batch, self.seed, self.pool = backend, state, batch, seed, pool
        self.rank, self.world = rank, world
        self.samples = len(x)
        self.host_x = np.ascontiguousarray(x.astype(policy.compute_dtype, copy=False))
        self.host_t = np.ascontiguousarray(t.astype(np.float32, copy=False))
        self.ring_x = allocator.zeros((pool * batch,) + x.shape[1:], policy.compute_dtype, "batch")
        self.ring_t = allocator.zeros((pool * batch,) + t.shape[1:], np.float32, "batch")
        if pool == 1:
            # A slot is refilled only after the whole step that read it (after_launch), so a pool of
            # one can be the step's batch buffer itself: one device copy of the batch, not two.
            self.batch_x, self.batch_t, self._gather = self.ring_x, self.ring_t, None
        else:
            self.batch_x = allocator.zeros((batch,) + x.shape[1:], policy.compute_dtype, "batch")
            self.batch_t = allocator.zeros((batch,) + t.shape[1:], np.float32, "batch")
            self._gather = DeviceGather(backend, state, self.ring_x, self.ring_t, self.batch_x, self.batch_t,
                                        shuffled=False, pool=pool)
        self._staged: dict[int, int] = {}     # slot -> the step staged in it
        if backend.is_gpu:
            import cupy
            import cupyx
            self._copy_stream = cupy.cuda.Stream(non_blocking=True)
            self._pinned_x = cupyx.empty_pinned(self.ring_x.shape, self.ring_x.dtype)
            self._pinned_t = cupyx.empty_pinned(self.ring_t.shape, np.float32)
            self._copied = [cupy.cuda.Event(block=False, disable_timing=True) for _ in range(pool)]
            self._consumed = [cupy.cuda.Event(block=False, disable_timing=True) for _ in range(pool)]
            self._ever_consumed = [False] * pool

    @property
    def steps_per_epoch(self) -> int:
        return self.samples // (self.batch * self.world)

    def check_launch(self, steps: int):
        check_streamed_launch(steps, self.pool)

    def _stage(self, step: int):
        slot = step % self.pool
        if self._staged.get(slot) == step:
            return
        rows = batch_rows(self.samples, self.seed, step, self.batch, self.steps_per_epoch, self.rank, self.world)
        part = slice(slot * self.batch, (slot + 1) * self.batch)
        if not self.backend.is_gpu:
            np.take(self.host_x, rows, axis=0, out=self.ring_x[part])
            np.take(self.host_t, rows, axis=0, out=self.ring_t[part])
        else:
            self._copied[slot].synchronize()   # the pinned slot's last upload has finished
            np.take(self.host_x, rows, axis=0, out=self._pinned_x[part])
            np.take(self.host_t, rows, axis=0, out=self._pinned_t[part])
            if self._ever_consumed[slot]:
                self._copy_stream.wait_event(self._consumed[slot])   # the device slot was read
            self.ring_x[part].set(self._pinned_x[part], stream=self._copy_stream)
            self.ring_t[part].set(self._pinned_t[part], stream=self._copy_stream)
            self._copied[slot].record(self._copy_stream)
        self._staged[slot] = step

    def before_launch(self, first_step: int, steps: int):
        self.check_launch(steps)
        for step in range(first_step, first_step + steps):
            self._stage(step)
            if self.backend.is_gpu:
                self.backend.stream.wait_event(self._copied[step % self.pool])

    def after_launch(self, first_step: int, steps: int):
        if self.backend.is_gpu:
            for step in range(first_step, first_step + steps):
                slot = step % self.pool
                self._consumed[slot].record(self.backend.stream)
                self._ever_consumed[slot] = True
        # Prefetch into the slots this launch does not use, overlapping its compute.
        for step in range(first_step + steps, first_step + self.pool):
            self._stage(step)

    def load_batch(self):
        if self._gather is not None:
            self._gather.run()

    def rows_of_step(self, step: int) -> np.ndarray:
        return batch_rows(self.samples, self.seed, step, self.batch, self.steps_per_epoch, self.rank, self.world)
