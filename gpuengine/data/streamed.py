"""A data set kept in host memory, gathered by the device straight from it inside the captured step.

The data set is pinned once in mapped host memory (pinned.py; inputs in the
compute dtype, targets float32). The step's batch is gathered by the same
kernel and the same Feistel order as resident data (gather.py), reading the
host rows over PCIe through unified addressing: no host thread, no event
handed between threads, no per-step Python, so streamed training gives the
resident path's batches bit for bit. `batch_pool` is the batch buffers on the
device (seed note 000's prefetch pool):

- 2 (default): the step copies the staged batch into its batch buffers, then
  gathers the next step's batch into the stage on a parallel branch of the
  step (a side stream, forked and joined by events, so it is captured too)
  while the step computes: the copy hides under compute wherever the link
  allows. One batch beyond the step's own on the device.
- 1: the step gathers its own batch first, nothing staged: the least device
  memory, the copy not hidden.

The stage holds the batch of step `_staged` (host bookkeeping of launches);
a launch that starts elsewhere (the first, or after a seek) gathers its first
batch before it.

The measurement that chose it (perf_tests/test_loader.py, H100): a ring of
worker threads, pinned slots and copy streams moved 1.22 GB/s against 54.5
GB/s of pinned copies (d8131d0), MLP streamed at 2% of the copy bound; this
path moves 0.83-0.89x the pinned copies' bandwidth for 4 KB and 150 KB rows,
trains the MLP at 0.85-0.91x the copy bound (17-40x torch's DataLoader) and
the CNN at 0.96-0.99x its resident speed (9776784). A pool of 1 trains the
MLP at 0.71x.
"""
from __future__ import annotations

import numpy as np

from ..checks import is_whole
from ..config import BATCH_POOL_RANGE, ConfigError
from .gather import DeviceGather
from .pinned import pinned_copy
from .shuffle import batch_rows

def check_pool(pool) -> int:
    low, high = BATCH_POOL_RANGE   # the toggle's own range
    if not is_whole(pool) or not low <= pool <= high:
        raise ConfigError(f"batch_pool={pool!r} is not accepted: 1 (the step gathers its own batch) or "
                          "2 (the next batch is gathered while the step computes)")
    return int(pool)


class StreamedDataset:
    def __init__(self, backend, allocator, policy, state, x: np.ndarray, t: np.ndarray, batch: int,
                 seed: int = 0, pool: int = 2, rank: int = 0, world: int = 1):
        # batch: this rank's rows of a global batch of batch * world (data parallel; world 1 otherwise)
        self.pool = check_pool(pool)
        self.backend, self.state, self.batch, self.seed = backend, state, batch, seed
        self.rank, self.world = rank, world
        self.samples = len(x)
        dtype = policy.compute_dtype
        self.host_x = pinned_copy(backend, x, dtype, "the inputs")
        self.host_t = pinned_copy(backend, t, np.float32, "the targets")
        self.batch_x = allocator.zeros((batch,) + x.shape[1:], dtype, "batch")
        self.batch_t = allocator.zeros((batch,) + t.shape[1:], np.float32, "batch")
        if self.pool == 2:
            self.stage_x = allocator.zeros((batch,) + x.shape[1:], dtype, "batch")
            self.stage_t = allocator.zeros((batch,) + t.shape[1:], np.float32, "batch")
        else:
            self.stage_x, self.stage_t = self.batch_x, self.batch_t
        self._gather = DeviceGather(backend, state, self.host_x.device, self.host_t.device, self.stage_x,
                                    self.stage_t, seed=seed, rank=rank, world=world, host_source=True)
        self._staged: int | None = None   # the step whose batch the stage holds (pool 2)
        if backend.is_gpu and self.pool == 2:
            import cupy
            self._side = cupy.cuda.Stream(non_blocking=True)
            self._forked = cupy.cuda.Event(disable_timing=True)
            self._fetched = cupy.cuda.Event(disable_timing=True)

    @property
    def steps_per_epoch(self) -> int:
        return self.samples // (self.batch * self.world)

    @property
    def bytes_per_step(self) -> int:
        """Host-to-device bytes one step's batch moves (inputs in the compute dtype, float32 targets)."""
        return self.batch * (self.batch_x.strides[0] + self.batch_t.strides[0])

    def before_launch(self, first_step: int, steps: int):
        """Stage the launch's first batch unless the previous launch left it staged."""
        if self.pool == 2 and self._staged != first_step:
            self._gather.run(ahead=0)   # the device step counter is first_step here, in stream order

    def after_launch(self, first_step: int, steps: int):
        if self.pool == 2:
            self._staged = first_step + steps

    def load_batch(self):
        """The step's batch into the batch buffers; with a pool of 2, the next one's gather forks off."""
        if self.pool == 1:
            self._gather.run(ahead=0)
            return
        if not self.backend.is_gpu:
            np.copyto(self.batch_x, self.stage_x)
            np.copyto(self.batch_t, self.stage_t)
            self._gather.run(ahead=1)
            return
        stream = self.backend.xp.cuda.get_current_stream()
        for out, stage in ((self.batch_x, self.stage_x), (self.batch_t, self.stage_t)):
            out.data.copy_from_device_async(stage.data, stage.nbytes, stream)
        self._forked.record(stream)
        self._side.wait_event(self._forked)
        with self._side:
            self._gather.run(ahead=1)
        self._fetched.record(self._side)

    def end_step(self):
        """Join the next batch's gather before the step counter advances (the gather reads it)."""
        if self.backend.is_gpu and self.pool == 2:
            self.backend.xp.cuda.get_current_stream().wait_event(self._fetched)

    def batch_innermost_input(self):
        """None: a batch-innermost copy is gathered from device memory, and these rows come from the host."""
        return None

    def rows_of_step(self, step: int) -> np.ndarray:
        return batch_rows(self.samples, self.seed, step, self.batch, self.steps_per_epoch, self.rank, self.world)
