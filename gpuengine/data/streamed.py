"""A host-resident data set streamed to the device through a ring of batch slots.

For data that does not fit the device (or lives on disk), each batch is
gathered on the host by the loader's worker threads into a slot of host
memory (pinned on a GPU) and copied asynchronously into the matching slot of a
device ring, overlapping the compute of the steps before it (batch_ring.py,
uploads.py; seed note 000's prefetch pool: a pool of 1 minimises memory, 3
hides latency). The step itself starts by copying its ring slot into the
static batch buffers (the device gather kernel in ring mode, reading the device
step counter), so it can be captured: replayed graphs find each batch in the
same device buffers. A launch of N captured steps needs N slots, and its
uploads overlap the previous launch only with 2N or more (slots are handed
back after a whole launch). With a pool of 1 the single slot is the batch
buffer: one device copy of the batch. Batches are the resident data set's:
the same Feistel order, and under data parallelism the same rank slice.
"""
from __future__ import annotations

import functools
import weakref

import numpy as np

from ..config import ConfigError
from .batch_ring import BatchRing, check_whole, default_workers
from .gather import DeviceGather
from .shuffle import batch_rows
from .uploads import CudaUploads, HostUploads


def overlapping_pool(steps_per_launch: int) -> int:
    """The smallest batch_pool whose uploads overlap the previous launch (slots come back a launch at a time)."""
    return max(3, 2 * steps_per_launch)


def check_streamed_launch(steps: int, pool: int):
    """A launch of `steps` captured steps reads `steps` distinct pool buffers."""
    if steps > pool:
        raise ConfigError(f"cuda_graph={steps} with resident_data=0 needs batch_pool >= {steps}: "
                          f"each captured step reads its own prefetched buffer (batch_pool={pool})")


class StreamedDataset:
    def __init__(self, backend, allocator, policy, state, x: np.ndarray, t: np.ndarray, batch: int,
                 seed: int = 0, pool: int = 3, rank: int = 0, world: int = 1, workers: int | None = None):
        # batch: this rank's rows of a global batch of batch * world (data parallel; world 1 otherwise)
        workers = default_workers() if workers is None else check_whole("loader_workers", workers)
        self.backend, self.state, self.batch, self.seed = backend, state, batch, seed
        self.pool = check_whole("batch_pool", pool)
        self.rank, self.world = rank, world
        self.samples = len(x)
        host_x = np.ascontiguousarray(x.astype(policy.compute_dtype, copy=False))
        host_t = np.ascontiguousarray(t.astype(np.float32, copy=False))
        self.ring_x = allocator.zeros((pool * batch,) + x.shape[1:], policy.compute_dtype, "batch")
        self.ring_t = allocator.zeros((pool * batch,) + t.shape[1:], np.float32, "batch")
        if pool == 1:
            # A slot is refilled only after the whole step that read it (release), so a pool of
            # one can be the step's batch buffer itself: one device copy of the batch, not two.
            self.batch_x, self.batch_t, self._gather = self.ring_x, self.ring_t, None
        else:
            self.batch_x = allocator.zeros((batch,) + x.shape[1:], policy.compute_dtype, "batch")
            self.batch_t = allocator.zeros((batch,) + t.shape[1:], np.float32, "batch")
            self._gather = DeviceGather(backend, state, self.ring_x, self.ring_t, self.batch_x, self.batch_t,
                                        shuffled=False, pool=pool)
        uploads = (CudaUploads if backend.is_gpu else HostUploads)(backend, self.ring_x, self.ring_t, batch)
        # The row function holds numbers only: the workers must not keep this data set alive.
        rows = functools.partial(batch_rows, self.samples, seed, batch=batch, steps_per_epoch=self.steps_per_epoch,
                                 rank=rank, world=world)
        self.ring = BatchRing(uploads, rows, host_x, host_t, batch, pool, workers)
        self._finalizer = weakref.finalize(self, self.ring.close)   # threads stop when the data set goes

    @property
    def steps_per_epoch(self) -> int:
        return self.samples // (self.batch * self.world)

    @property
    def bytes_per_step(self) -> int:
        """Host-to-device bytes one step's batch moves (inputs in the compute dtype, float32 targets)."""
        return self.batch * (self.ring_x.strides[0] + self.ring_t.strides[0])

    def check_launch(self, steps: int):
        check_streamed_launch(steps, self.pool)

    def before_launch(self, first_step: int, steps: int):
        self.check_launch(steps)
        self.ring.acquire(first_step, steps)

    def after_launch(self, first_step: int, steps: int):
        self.ring.release(first_step, steps)

    def prefetch_until(self, step: int | None):
        """No batch past `step` is gathered or uploaded before a launch needs it (batch_ring.prefetch_until)."""
        self.ring.prefetch_until(step)

    def load_batch(self):
        if self._gather is not None:
            self._gather.run()

    def rows_of_step(self, step: int) -> np.ndarray:
        return batch_rows(self.samples, self.seed, step, self.batch, self.steps_per_epoch, self.rank, self.world)

    def close(self):
        """Stop the loader's worker threads (also done when the data set is garbage-collected)."""
        self._finalizer()
