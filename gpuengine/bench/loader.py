"""The loader micro-benchmark: the machine's pinned host-to-device bandwidth next to the streamed loader's.

The targets: the streamed loader should reach >= 80% of what the copy engine
moves from pinned memory, and streamed training >= 0.8x the bound that
bandwidth sets (bandwidth / bytes per sample). Both sides are
`benchmarking.Runner`s, so the perf suite interleaves them with the engine
round by round:

- `PinnedCopyRunner`: `copies` asynchronous copies of `chunk_bytes` from a
  pinned host buffer to a device buffer on a stream of its own, bracketed by
  device events (`last_round_gbps`). Its `samples_per_round` is its bytes when it
  stands for the bandwidth, or the engine's samples when it stands for the
  bound of a training round that moves the same bytes.
- `LoaderRunner`: the streamed loader alone (no training): every step's batch
  gathered by the device from random rows of the pinned host data set into the
  step's buffers, exactly as a training step does. Its `samples_per_round` is
  bytes, so its ratio against a `PinnedCopyRunner` of bytes is its fraction of
  the copy bandwidth.
On the NumPy backend the "copy" is a host memcpy and nothing is gated.
"""
from __future__ import annotations

import statistics

import numpy as np

from ..config import EngineConfig
from ..data.streamed import StreamedDataset
from ..runtime.backend import get_backend
from ..runtime.memory import Allocator
from ..runtime.precision import policy_for
from ..runtime.step_state import StepState

GB = 1e9


class PinnedCopyRunner:
    """Host-to-device copies from pinned memory, timed on the device: the copy engine's bound."""

    def __init__(self, backend, chunk_bytes: int, copies: int, name: str = "pinned_h2d",
                 samples_per_round: int | None = None):
        if chunk_bytes < 1 or copies < 1:
            raise ValueError(f"chunk_bytes={chunk_bytes} and copies={copies} must both be >= 1")
        self.backend, self.name = backend, name
        self.chunk_bytes, self.copies = int(chunk_bytes), int(copies)
        self.bytes_per_round = self.chunk_bytes * self.copies
        self.samples_per_round = self.bytes_per_round if samples_per_round is None else samples_per_round
        noise = np.random.default_rng(0).integers(0, 256, self.chunk_bytes, dtype=np.uint8)   # never time zeros
        self._last_ms: float | None = None
        if backend.is_gpu:
            import cupy
            from ..data.pinned import pinned_empty
            self._runtime, self._elapsed_ms = cupy.cuda.runtime, cupy.cuda.get_elapsed_time
            self.host = pinned_empty((self.chunk_bytes,), np.uint8)
            self.host[...] = noise
            with backend.activate():
                self.device = cupy.empty(self.chunk_bytes, np.uint8)
            self.stream = cupy.cuda.Stream(non_blocking=True)
            self._start, self._stop = cupy.cuda.Event(), cupy.cuda.Event()
        else:
            self.host, self.device = noise, np.empty_like(noise)

    def prepare(self):
        self.run_round()
        self.synchronize()

    def run_round(self):
        if not self.backend.is_gpu:
            for _ in range(self.copies):
                np.copyto(self.device, self.host)
            return
        self._start.record(self.stream)
        for _ in range(self.copies):
            self._runtime.memcpyAsync(self.device.data.ptr, self.host.ctypes.data, self.chunk_bytes,
                                      self._runtime.memcpyHostToDevice, self.stream.ptr)
        self._stop.record(self.stream)

    def synchronize(self):
        if self.backend.is_gpu:
            self.stream.synchronize()
            self._last_ms = self._elapsed_ms(self._start, self._stop)

    def last_round_gbps(self) -> float | None:
        """GB/s of the last round between its device events (None on the NumPy backend or before a round)."""
        if not self._last_ms:
            return None
        return self.bytes_per_round / (self._last_ms * 1e-3) / GB


def measure_pinned_h2d_gbps(backend, total_bytes: int = 1 << 30, chunk_bytes: int = 64 << 20,
                            repeats: int = 5) -> float | None:
    """The machine's pinned host-to-device bandwidth: median device-event GB/s of `repeats` rounds of
    large copies (None on the NumPy backend, where no copy engine exists)."""
    if not backend.is_gpu:
        return None
    runner = PinnedCopyRunner(backend, chunk_bytes, max(1, total_bytes // chunk_bytes))
    runner.prepare()
    rates = []
    for _ in range(repeats):
        runner.run_round()
        runner.synchronize()
        rates.append(runner.last_round_gbps())
    return statistics.median(rates)


class LoaderRunner:
    """The streamed loader without training: `steps_per_round` batches delivered into the batch buffers."""

    name = "gpuengine_loader"

    def __init__(self, x: np.ndarray, t: np.ndarray, batch: int, config: EngineConfig, steps_per_round: int,
                 seed: int = 0):
        self.backend = backend = get_backend(config)
        allocator = Allocator(backend)
        with backend.activate():
            self.state = StepState(backend, allocator, len(x) // batch)
            self.data = StreamedDataset(backend, allocator, policy_for(config.precision), self.state, x, t, batch,
                                        seed, pool=config.batch_pool)
        self.steps_per_round = steps_per_round
        self.bytes_per_round = steps_per_round * self.data.bytes_per_step
        self.samples_per_round = self.bytes_per_round   # bytes: a ratio against PinnedCopyRunner is a bandwidth ratio
        self.steps_done = 0

    def prepare(self):
        self.run_round()
        self.synchronize()

    def run_round(self):
        with self.backend.activate():
            for _ in range(self.steps_per_round):
                self.data.before_launch(self.steps_done, 1)
                self.data.load_batch()
                self.data.end_step()
                self.state.finish_step()
                self.data.after_launch(self.steps_done, 1)
                self.steps_done += 1

    def synchronize(self):
        self.backend.synchronize()

    def bytes_per_step(self) -> int:
        return self.data.bytes_per_step

    def delivered(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Host copies of the batch buffers and the data set rows they should hold (the last step's)."""
        self.synchronize()
        return (self.backend.to_host(self.data.batch_x), self.backend.to_host(self.data.batch_t),
                self.data.rows_of_step(self.steps_done - 1))
