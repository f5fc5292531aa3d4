"""How much device memory this process holds: NVML's per-process figure, or the drop in free memory.

A memory cap is only enforced if it is measured from outside the allocators:
the CUDA context, cuBLAS/cuBLASLt handles, loaded kernels and anything a
library allocates itself count against a real card, and no allocator sees
them. NVML reports each process's device memory where the driver allows it
(not inside a container's PID namespace, not under WDDM); elsewhere the drop
in the device's free memory since before this process created a context
stands in for it, which is right only while nothing else allocates on that
device (trials run one at a time). `PeakSampler` polls in a thread, because
both figures are current values, not peaks.
"""
from __future__ import annotations

import os
import threading
from typing import Mapping, Protocol

from . import nvml as nvml_lib

NVML_PROCESS = "nvml_process"        # NVML's per-process used memory
NVML_FREE_DROP = "nvml_free_drop"    # device free memory before the context minus now
# Library error texts that mean the device ran out of memory (CUDA, cuBLAS/cuBLASLt, cuDNN, nvmath, cuda.core).
OOM_MARKERS = ("out of memory", "alloc_failed", "cuda_error_out_of_memory", "cudaerrormemoryallocation")


def is_out_of_memory(exc: BaseException) -> bool:
    """CuPy's or torch's OutOfMemoryError, or a library error saying the device ran out, anywhere in the chain.

    Frameworks wrap allocation failures (torch.compile, nvmath), so causes and contexts are searched too;
    a host MemoryError is not a device OOM.
    """
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        package = (type(exc).__module__ or "").split(".")[0]
        # Checked first: CuPy's OutOfMemoryError subclasses the host MemoryError.
        if type(exc).__name__ == "OutOfMemoryError" and package in ("cupy", "cupy_backends", "torch"):
            return True
        if isinstance(exc, MemoryError):
            return False
        if any(marker in str(exc).lower() for marker in OOM_MARKERS):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


class DeviceMemoryProbe(Protocol):
    """The two device-memory readings this module needs (NVML; a fake in tests)."""

    def free_bytes(self) -> int:
        ...

    def process_used_bytes(self, pid: int) -> int | None:
        """This process's device memory, or None where the driver does not say."""


class NvmlMemoryProbe:
    def __init__(self, handle):
        self.handle = handle
        self._nvml = nvml_lib.nvml()

    def free_bytes(self) -> int:
        return int(self._nvml.nvmlDeviceGetMemoryInfo(self.handle).free)

    def process_used_bytes(self, pid: int) -> int | None:
        try:
            processes = self._nvml.nvmlDeviceGetComputeRunningProcesses(self.handle)
        except self._nvml.NVMLError:
            return None
        for process in processes:
            if process.pid == pid:
                used = process.usedGpuMemory   # None where NVML has no figure (WDDM)
                return None if used is None else int(used)
        return None   # another PID namespace (containers): NVML lists host PIDs


class ProcessMemory:
    """This process's device memory on one device, by the best method the driver offers.

    Create it before the process touches CUDA (the free-memory baseline must not
    include our own context), then `bind()` the device CUDA actually uses.
    """

    def __init__(self, probes: Mapping[str, DeviceMemoryProbe], pid: int | None = None):
        if not probes:
            raise ValueError("ProcessMemory needs at least one device probe")
        self.probes = dict(probes)
        self.pid = os.getpid() if pid is None else pid
        self.free_before = {key: probe.free_bytes() for key, probe in self.probes.items()}
        self.device: str | None = next(iter(self.probes)) if len(self.probes) == 1 else None

    @classmethod
    def from_nvml(cls) -> "ProcessMemory":
        """Probes for every NVML device (NvmlUnavailable without NVML); call before CUDA starts."""
        return cls({bus_id: NvmlMemoryProbe(h) for bus_id, h in nvml_lib.device_handles().items()})

    def bind(self, device: str):
        """Measure the device at `device` (a normalised PCI bus id) from now on."""
        if device not in self.probes:
            raise ValueError(f"no memory probe for device {device!r}; probes exist for {sorted(self.probes)}")
        self.device = device

    @property
    def probe(self) -> DeviceMemoryProbe:
        if self.device is None:
            raise RuntimeError("several devices are visible: bind() the one CUDA uses before measuring")
        return self.probes[self.device]

    def used_bytes(self) -> tuple[int, str]:
        """(bytes, method): NVML's per-process figure where reported, else the free-memory drop."""
        per_process = self.probe.process_used_bytes(self.pid)
        if per_process is not None:
            return per_process, NVML_PROCESS
        return max(0, self.free_before[self.device] - self.probe.free_bytes()), NVML_FREE_DROP


class PeakSampler:
    """Context manager: the largest `used_bytes()` seen, polled every `interval_s` and at both ends."""

    def __init__(self, memory: ProcessMemory, interval_s: float = 0.01):
        self.memory = memory
        self.interval_s = interval_s
        self.peak_bytes = 0
        self.method: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def _sample(self):
        used, method = self.memory.used_bytes()
        if used >= self.peak_bytes:
            self.peak_bytes, self.method = used, method

    def _run(self):
        try:
            while not self._stop.wait(self.interval_s):
                self._sample()
        except BaseException as exc:  # reported by __exit__: a dead sampler must not pass for a low peak
            self._error = exc

    def __enter__(self) -> "PeakSampler":
        self._sample()
        self._thread = threading.Thread(target=self._run, name="device-memory-peak", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info):
        self._stop.set()
        self._thread.join()
        self._sample()
        if self._error is not None and exc_info[0] is None:
            raise RuntimeError(f"device memory sampling failed: {self._error!r}") from self._error
        return False
