"""The one array-module seam: CuPy on a GPU, NumPy on the CPU.

Everything above this module writes `be.xp` and never imports cupy itself. The
NumPy backend is a real engine backend (CI runs on it, tests use it as the
reference), not a stub. `array_module(a)` is Chainer's get_array_module.
"""
from __future__ import annotations

import functools
import time

import numpy as np

from ..config import ConfigError, EngineConfig

GIB = 1 << 30


@functools.lru_cache(maxsize=1)
def gpu_visible() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no cupy, no driver, or no device: all mean "no GPU"
        return False


def resolve_device(config: EngineConfig) -> str:
    if config.device is None:
        return "cuda" if gpu_visible() else "cpu"
    if config.device == "cuda" and not gpu_visible():
        raise ConfigError("device='cuda' but no CUDA GPU is visible (CuPy missing or no device); use device=cpu")
    return config.device


def bfloat16_dtype():
    """The bf16 dtype both NumPy (through ml_dtypes) and CuPy 14 understand."""
    import ml_dtypes
    return np.dtype(ml_dtypes.bfloat16)


def widen(a):
    """NumPy backend: compute bf16 data in float32, keep float32/float64 as they are."""
    return a.astype(np.float32) if a.dtype.itemsize < 4 else a


def array_module(a):
    """numpy or cupy, whichever owns `a`."""
    if type(a).__module__.startswith("cupy"):
        import cupy
        return cupy
    return np


class Backend:
    """Array module, the engine's stream and device-side timing for one device."""

    def __init__(self, device: str):
        self.device = device
        self.is_gpu = device == "cuda"
        if self.is_gpu:
            import cupy
            self.xp = cupy
            # Graph capture needs a non-default stream; every engine kernel runs here.
            self.stream = cupy.cuda.Stream(non_blocking=True)
        else:
            self.xp = np
            self.stream = None

    def __repr__(self):
        return f"Backend({self.device})"

    def activate(self):
        """Context manager making the engine stream current (a no-op on the CPU)."""
        if self.is_gpu:
            return self.stream
        return _NullContext()

    def synchronize(self):
        if self.is_gpu:
            self.stream.synchronize()

    def wait_for_current_stream(self):
        """Order the engine stream after the work queued so far on the caller's current CuPy stream."""
        if self.is_gpu:
            caller = self.xp.cuda.get_current_stream()
            if caller.ptr != self.stream.ptr:
                self.stream.wait_event(caller.record())

    def to_host(self, a) -> np.ndarray:
        """A host copy, on both backends: the caller may keep it while the engine reuses the buffer."""
        if self.is_gpu and array_module(a) is not np:
            with self.stream:
                return a.get(stream=self.stream)
        return np.array(a, copy=True)

    def to_device(self, a, dtype=None):
        with self.activate():
            out = self.xp.asarray(a, dtype=dtype)
        return out

    def upload(self, dst, host: np.ndarray):
        """Copy a host array into an existing buffer: no temporary device copy (it would stay in the pool)."""
        host = np.ascontiguousarray(host, dtype=dst.dtype)
        if tuple(host.shape) != tuple(dst.shape):
            raise ValueError(f"upload of shape {host.shape} into a buffer of shape {tuple(dst.shape)}")
        if self.is_gpu:
            dst.set(host, stream=self.stream)
        else:
            dst[...] = host

    def set_memory_cap(self, cap_gib: float | None):
        """Limit the engine's memory pool, to reproduce a small card on a large one."""
        if self.is_gpu:
            pool = self.xp.get_default_memory_pool()
            pool.set_limit(size=0 if cap_gib is None else int(cap_gib * GIB))

    def memory_room(self) -> int | None:
        """Bytes the engine may still allocate: up to the pool's cap where one is set, else the device's free
        memory and what the pool holds unused; None on the CPU, where no limit is known."""
        if not self.is_gpu:
            return None
        pool = self.xp.get_default_memory_pool()
        limit = pool.get_limit()   # 0: none set
        if limit:
            return max(0, limit - pool.used_bytes())
        return self.xp.cuda.runtime.memGetInfo()[0] + pool.free_bytes()

    def timer(self) -> "DeviceTimer":
        return DeviceTimer(self)


class _NullContext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class DeviceTimer:
    """Milliseconds between start() and stop(): device events on a GPU, a host clock on the CPU."""

    def __init__(self, backend: Backend):
        self.backend = backend
        if backend.is_gpu:
            self._start = backend.xp.cuda.Event()
            self._stop = backend.xp.cuda.Event()

    def start(self):
        if self.backend.is_gpu:
            self._start.record(self.backend.stream)
        else:
            self._t0 = time.perf_counter()

    def stop(self) -> float:
        if self.backend.is_gpu:
            self._stop.record(self.backend.stream)
            self._stop.synchronize()
            return self.backend.xp.cuda.get_elapsed_time(self._start, self._stop)
        return (time.perf_counter() - self._t0) * 1e3


@functools.lru_cache(maxsize=None)
def _backend_for(device: str) -> Backend:
    return Backend(device)


def get_backend(config: EngineConfig) -> Backend:
    """The (cached) backend for the configured device, with the config's VRAM cap applied if it has one.

    The pool is process-wide: an uncapped config leaves a cap set by another in place (lift it with
    `set_memory_cap(None)`), so a predictor built after a capped trainer cannot silently uncap it.
    """
    backend = _backend_for(resolve_device(config))
    if config.vram_cap_gib is not None:
        backend.set_memory_cap(config.vram_cap_gib)
    return backend
