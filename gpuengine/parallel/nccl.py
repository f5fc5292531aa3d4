"""The GPU all-reduce: NCCL through `cupy.cuda.nccl`, on a communication stream forked from the engine stream.

Run on one GPU at world size 1 (correctness_tests/parallel/test_nccl_one_gpu.py) and across two H100s and two
H200s (perf_tests/test_data_parallel.py and `launch --gpus 2`, the steps in CUDA graphs). `close()` destroys the
communicator once the graphs holding its kernels are gone: left to the garbage collector at exit, the two were
freed in no set order and a rank hung there.

Rank 0 draws the NCCL unique id and the rendezvous hands it to the others
(NCCL's documented bootstrap, ncclGetUniqueId / ncclCommInitRank). Each bucket
is enqueued as: event on the engine stream -> the communication stream waits
on it -> ncclAllReduce(sum) in place -> scale by 1/N, so the reduction runs
while the engine stream goes on with backward; `wait()` makes the engine
stream wait for the communication stream before Adam. Events between streams
are the fork/join pattern CUDA graph capture records, and NCCL calls are
capturable (NCCL >= 2.9), so a captured multi-step graph replays them.
"""
from __future__ import annotations

import numpy as np

from .allreduce import AllReduce
from .group import ProcessGroup
from .rendezvous import Rendezvous


def use_local_device(group: ProcessGroup):
    """Make GPU LOCAL_RANK current: call before the engine's backend (and its stream) is first built."""
    import cupy
    count = cupy.cuda.runtime.getDeviceCount()
    if group.local_rank >= count:
        raise RuntimeError(f"LOCAL_RANK={group.local_rank} but only {count} GPU(s) are visible")
    cupy.cuda.Device(group.local_rank).use()


class NcclAllReduce(AllReduce):
    def __init__(self, rendezvous: Rendezvous, backend):
        import cupy
        try:
            from cupy.cuda import nccl
        except ImportError as exc:   # CuPy built or installed without NCCL
            raise RuntimeError(f"data parallel on GPUs needs NCCL through cupy.cuda.nccl, which failed to import "
                               f"({exc}); install the NCCL wheel matching CuPy's CUDA (e.g. nvidia-nccl-cu12)") from exc
        group = rendezvous.group
        self.world_size, self.backend, self._nccl = group.world_size, backend, nccl
        unique_id = nccl.get_unique_id() if group.is_root else None
        blob = rendezvous.broadcast("nccl_id", bytes(b & 0xFF for b in unique_id) if group.is_root else None)
        try:   # CuPy 14 takes the id as bytes (a TypeError for anything else, before NCCL is touched)
            self.comm = nccl.NcclCommunicator(group.world_size, bytes(blob), group.rank)
        except TypeError:   # older CuPy: the tuple of signed chars get_unique_id gave
            self.comm = nccl.NcclCommunicator(group.world_size, tuple(b - 256 if b > 127 else b for b in blob),
                                              group.rank)
        self.comm_stream = cupy.cuda.Stream(non_blocking=True)
        self._scale = 1.0 / group.world_size
        self._forked = cupy.cuda.Event(block=False, disable_timing=True)
        self._joined = cupy.cuda.Event(block=False, disable_timing=True)

    def _dtype(self, buf) -> int:
        if buf.dtype != np.float32:
            raise TypeError(f"NCCL all-reduce here handles float32 gradients, got {buf.dtype}")
        return self._nccl.NCCL_FLOAT32

    def sum_into(self, buf) -> None:
        dtype = self._dtype(buf)   # refuse before forking: a raise after it would leave the streams joined halfway
        self._forked.record(self.backend.stream)
        self.comm_stream.wait_event(self._forked)
        self.comm.allReduce(buf.data.ptr, buf.data.ptr, buf.size, dtype, self._nccl.NCCL_SUM, self.comm_stream.ptr)
        with self.comm_stream:
            buf *= self._scale

    def wait(self) -> None:
        self._joined.record(self.comm_stream)
        self.backend.stream.wait_event(self._joined)

    def broadcast(self, buf) -> None:
        self.comm.bcast(buf.data.ptr, buf.size, self._dtype(buf), 0, self.backend.stream.ptr)
        self.backend.stream.synchronize()

    def close(self) -> None:
        """Drain both streams, then destroy the communicator: here, in order, not at interpreter exit, where the
        garbage collector may free it before the CUDA graphs holding its kernels."""
        if self.comm is None:
            return
        self.comm_stream.synchronize()
        self.backend.stream.synchronize()
        self.comm.destroy()
        self.comm = None
