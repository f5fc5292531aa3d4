"""The all-reduce seam of data parallelism, and its NumPy stand-in over processes for the CPU tier.

`AllReduce.sum_into(buf)` replaces `buf` on every rank by the mean over ranks
(sum, then times 1/world size); it may only enqueue the work, and `wait()`
orders everything enqueued before the optimizer reads the buffers.
`broadcast(buf)` copies rank 0's buffer to every rank. The GPU implementation
is NCCL's (nccl.py); `StoreAllReduce` moves the bytes through the rendezvous
store and adds them in rank order 0..N-1 on every rank, so every rank gets
bit-identical results and a run is reproducible.
"""
from __future__ import annotations

import numpy as np

from .rendezvous import Rendezvous


class AllReduce:
    """Interface: in-place mean over ranks, enqueued; wait; broadcast from rank 0."""

    world_size: int

    def sum_into(self, buf) -> None:
        raise NotImplementedError

    def wait(self) -> None:
        raise NotImplementedError

    def broadcast(self, buf) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Release what the reducer holds (a communicator); nothing by default."""


class StoreAllReduce(AllReduce):
    """NumPy buffers averaged through the TCP store: synchronous, deterministic summation order."""

    def __init__(self, rendezvous: Rendezvous):
        self.rendezvous = rendezvous
        self.world_size = rendezvous.group.world_size
        self._scale = np.float32(1.0 / self.world_size)

    def sum_into(self, buf: np.ndarray) -> None:
        blobs = self.rendezvous.all_gather("allreduce", np.ascontiguousarray(buf).tobytes())
        total = np.frombuffer(blobs[0], buf.dtype).copy()
        for blob in blobs[1:]:
            total += np.frombuffer(blob, buf.dtype)
        total *= self._scale.astype(buf.dtype)
        buf[...] = total.reshape(buf.shape)

    def wait(self) -> None:
        """Nothing in flight: sum_into finished its work."""

    def broadcast(self, buf: np.ndarray) -> None:
        blob = self.rendezvous.broadcast("broadcast", np.ascontiguousarray(buf).tobytes()
                                         if self.rendezvous.group.is_root else None)
        buf[...] = np.frombuffer(blob, buf.dtype).reshape(buf.shape)
