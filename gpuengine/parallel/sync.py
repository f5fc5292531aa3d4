"""Data-parallel gradient synchronisation as the trainer sees it: one optional object, hooks into the step.

Each rank trains on its own 1/N of every global batch (the same shuffle on
every rank, `shuffle.batch_rows`), its loss a mean over its rows; averaging
the gradients over ranks then gives the gradient of the mean over the global
batch, so N ranks at global batch B take the steps one process at B takes
(up to summation order). At attach time the ranks check they describe the same
run and take rank 0's initial weights; in each step the buckets' all-reduces
start after the backward step that completes them and are waited for before
Adam. Layers whose statistics depend on the batch (BatchNorm) see their own
rank's rows only, as in PyTorch DDP without SyncBatchNorm.
"""
from __future__ import annotations

import numpy as np

from ..config import EngineConfig
from ..runtime.backend import get_backend, resolve_device
from .allreduce import AllReduce, StoreAllReduce
from .buckets import DEFAULT_BUCKET_BYTES, backward_ready_steps, launches_by_step, plan_buckets
from .group import ProcessGroup
from .rendezvous import DEFAULT_TIMEOUT_S, Rendezvous


class GradientSync:
    def __init__(self, group: ProcessGroup, rendezvous: Rendezvous, reducer: AllReduce,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES):
        self.group, self.rendezvous, self.reducer, self.bucket_bytes = group, rendezvous, reducer, bucket_bytes
        self.buckets = []
        self._launches: list[list] = []
        self._grad = None

    @property
    def shard(self) -> dict:
        """The data sets' keyword arguments that pick this rank's rows."""
        return {"rank": self.group.rank, "world": self.group.world_size}

    def local_batch(self, global_batch: int) -> int:
        return self.group.local_batch(global_batch)

    def attach(self, net, program, params, backend, run: dict):
        """Check every rank runs the same configuration, take rank 0's weights, plan the buckets."""
        fingerprint = dict(run, world_size=self.group.world_size,
                           parameters=[[s.name, list(s.shape)] for s in params.specs],
                           buffers=[[s.name, list(s.shape)] for s in params.buffer_specs])
        self.rendezvous.check_same_config(fingerprint)
        with backend.activate():
            self.reducer.broadcast(params.master)
            if params.buffers.size:
                self.reducer.broadcast(params.buffers)
            if params.compute is not params.master:
                backend.xp.copyto(params.compute, params.master, casting="unsafe")
        ready = backward_ready_steps(net, program)
        self.buckets = plan_buckets(params.offsets, params.size, ready, params.grad.dtype.itemsize,
                                    self.bucket_bytes)
        self._launches = launches_by_step(self.buckets, len(program.backward_nodes))
        self._grad = params.grad

    def after_backward_step(self, index: int):
        """Start the all-reduce of every bucket that backward step `index` completed."""
        for bucket in self._launches[index]:
            self.reducer.sum_into(self._grad[bucket.start:bucket.stop])

    def mean_over_ranks(self, values: list[float]) -> list[float]:
        """Host values (a rank's epoch losses: means over its rows) averaged over ranks, added in rank order."""
        blobs = self.rendezvous.all_gather("mean", np.asarray(values, np.float64).tobytes())
        total = np.zeros(len(values))
        for blob in blobs:
            total += np.frombuffer(blob, np.float64)
        return (total / self.group.world_size).tolist()

    def close(self):
        """The reducer's communicator, then the rendezvous (rank 0 waits there for every rank to be done). Release
        the trainer's graphs first (Trainer.release_graphs): they hold the communicator's kernels."""
        self.reducer.close()
        self.rendezvous.close()

    def loss_and_backward(self, program):
        """The program's loss and backward with the buckets reduced on the way; averaged when this returns."""
        program.loss_and_backward(self.after_backward_step)
        self.reducer.wait()


def data_parallel(config: EngineConfig | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                  bucket_bytes: int = DEFAULT_BUCKET_BYTES, environ=None) -> GradientSync:
    """The gradient sync of this process, from the launcher variables: NCCL on a GPU, the store stand-in on the
    CPU. Call it before building the Trainer, so the engine's stream is made on this rank's GPU."""
    group = ProcessGroup.from_env(environ)
    config = config or EngineConfig.from_env()
    rendezvous = Rendezvous(group, timeout_s)
    if resolve_device(config) == "cuda":
        from .nccl import NcclAllReduce, use_local_device
        use_local_device(group)
        reducer = NcclAllReduce(rendezvous, get_backend(config))
    else:
        reducer = StoreAllReduce(rendezvous)
    return GradientSync(group, rendezvous, reducer, bucket_bytes)
