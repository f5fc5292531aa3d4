"""How the streamed loader's host slots reach the device ring: one strategy per backend.

`CudaUploads`: host slots in pinned memory (cupy.cuda.alloc_pinned_memory), one
copy stream per slot, so a late slot never queues behind another slot's wait,
and two events per slot: `copied` (recorded on the slot's copy stream after its
last upload; the compute stream waits on it, a worker host-waits on it before
overwriting the pinned slot) and `consumed` (recorded on the compute stream
after the launch that read the slot; the slot's next upload waits on it on the
device). No call here synchronizes the compute stream with the host.

`HostUploads`: the NumPy backend's twin with plain arrays. Its device is the
host, so a host slot is its ring slot (workers gather straight into it, no copy
to make) and every wait is already satisfied. CI runs the ring's scheduling,
ordering, completeness and shutdown through it.
"""
from __future__ import annotations

import numpy as np


class HostUploads:
    """The NumPy ring: host slots and 'device' slots are the same arrays."""

    def __init__(self, backend, ring_x, ring_t, batch: int):
        self.host_x, self.host_t = ring_x, ring_t

    def start_worker(self):
        """Nothing to bind a worker thread to."""

    def wait_host_slot_free(self, slot: int):
        """A slot's previous upload finished inside the worker that made it."""

    def upload(self, slot: int, lo: int, hi: int):
        """The rows were gathered into the ring slot itself."""

    def mark_uploaded(self, slot: int):
        """The uploads are done already."""

    def compute_waits(self, slot: int):
        """The NumPy 'compute stream' is the caller's thread: nothing to order."""

    def mark_consumed(self, slot: int):
        """The caller read the slot before handing it back."""

    def drain(self):
        """No copy can still be in flight."""


def pinned_empty(shape: tuple, dtype) -> np.ndarray:
    """A NumPy array in page-locked host memory, which the copy engine reads without a staging copy."""
    import cupy
    dtype = np.dtype(dtype)
    count = int(np.prod(shape))
    memory = cupy.cuda.alloc_pinned_memory(max(1, count * dtype.itemsize))
    return np.ndarray(shape, dtype, buffer=memory)   # the array's base keeps the pinned block alive


class CudaUploads:
    """Pinned host slots copied into the device ring on per-slot copy streams, ordered by events."""

    def __init__(self, backend, ring_x, ring_t, batch: int):
        import cupy
        self._runtime = cupy.cuda.runtime
        self.backend, self.device_x, self.device_t, self.batch = backend, ring_x, ring_t, batch
        self.host_x = pinned_empty(ring_x.shape, ring_x.dtype)
        self.host_t = pinned_empty(ring_t.shape, ring_t.dtype)
        self.device_id = ring_x.device.id
        pool = ring_x.shape[0] // batch
        with cupy.cuda.Device(self.device_id):
            self.streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(pool)]
            # Workers host-wait on `copied` (blocking sync: a waiting worker sleeps instead of spinning).
            self.copied = [cupy.cuda.Event(block=True, disable_timing=True) for _ in range(pool)]
            self.consumed = [cupy.cuda.Event(block=False, disable_timing=True) for _ in range(pool)]
        self.ever_consumed = [False] * pool

    def start_worker(self):
        # The runtime's current device is per thread; a new thread starts on device 0.
        self._runtime.setDevice(self.device_id)

    def wait_host_slot_free(self, slot: int):
        # The copy engine may still be reading the pinned slot for the previous step that used it.
        self.copied[slot].synchronize()

    def upload(self, slot: int, lo: int, hi: int):
        stream = self.streams[slot]
        if self.ever_consumed[slot]:
            stream.wait_event(self.consumed[slot])   # the compute stream has read the slot's last batch
        for host, device in ((self.host_x, self.device_x), (self.host_t, self.device_t)):
            row_bytes = host.strides[0]
            start = (slot * self.batch + lo) * row_bytes
            self._runtime.memcpyAsync(device.data.ptr + start, host.ctypes.data + start, (hi - lo) * row_bytes,
                                      self._runtime.memcpyHostToDevice, stream.ptr)

    def mark_uploaded(self, slot: int):
        self.copied[slot].record(self.streams[slot])

    def compute_waits(self, slot: int):
        self.backend.stream.wait_event(self.copied[slot])

    def mark_consumed(self, slot: int):
        self.consumed[slot].record(self.backend.stream)
        self.ever_consumed[slot] = True

    def drain(self):
        for stream in self.streams:
            stream.synchronize()
