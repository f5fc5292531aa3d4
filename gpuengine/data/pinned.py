"""Page-locked host memory the device reads directly (zero-copy, through unified addressing).

A block from cudaHostAlloc(Mapped | Portable) has one address for the host and
for every device, so a kernel can gather rows of a host data set straight into
device buffers: no staging copy, no host thread. `PinnedBlock` owns one such
block; `host` is its NumPy view (filled once), `device` a CuPy array on the
same bytes (for kernels only: each read crosses PCIe). The block is freed when
the last view goes. On the NumPy backend nothing is pinned (`HostCopy`).

A refusal (the OS cannot lock that much memory) is a `DataError` that names
the bytes asked for and the host's memory, never a silent fallback.
"""
from __future__ import annotations

import weakref

import numpy as np

from ..runtime.backend import GIB
from .checks import DataError

_PORTABLE, _MAPPED = 1, 2   # cudaHostAllocPortable, cudaHostAllocMapped
_UNIFIED_ADDRESSING = 41     # cudaDevAttrUnifiedAddressing


def host_memory() -> dict[str, int]:
    """The host's MemTotal and MemAvailable in bytes (empty where /proc/meminfo is not readable)."""
    found = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("MemTotal", "MemAvailable"):
                    found[key] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return found


def refusal(what: str, nbytes: int, cause: str) -> DataError:
    memory = host_memory()
    limit = (f"this host has {memory['MemTotal']} bytes, {memory['MemAvailable']} available"
             if len(memory) == 2 else "the host's memory could not be read")
    return DataError(f"{what} must be pinned in host memory for streaming (resident_data=0): {nbytes} bytes "
                     f"({nbytes / GIB:.3g} GiB) were refused ({cause}); {limit}. Stream a smaller data set, "
                     "or train on resident data (resident_data=1) if it fits the device")


class PinnedBlock:
    """`shape` x `dtype` in mapped page-locked memory: `host` (NumPy) and `device` (CuPy) views of one block."""

    def __init__(self, backend, shape: tuple, dtype, what: str = "the data set"):
        import cupy
        runtime = cupy.cuda.runtime
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape)) * dtype.itemsize
        with backend.activate():
            device = cupy.cuda.Device().id
        if not runtime.deviceGetAttribute(_UNIFIED_ADDRESSING, device):
            raise DataError(f"streaming from host memory needs unified addressing, which device {device} lacks; "
                            "train on resident data (resident_data=1)")
        try:
            with backend.activate():
                pointer = runtime.hostAlloc(max(1, nbytes), _PORTABLE | _MAPPED)
        except (runtime.CUDARuntimeError, MemoryError) as error:
            raise refusal(what, nbytes, str(error)) from None
        # Freed when both views are gone: the NumPy view's buffer and the CuPy view's memory hold this owner.
        owner = _Owner(pointer, runtime)
        buffer = (np.ctypeslib.ctypes.c_uint8 * max(1, nbytes)).from_address(pointer)
        owner.keep(buffer)
        self.host = np.frombuffer(buffer, np.uint8)[:nbytes].view(dtype).reshape(shape)
        # Under unified addressing a cudaHostAlloc block has the same address on the device as on the host.
        memory = cupy.cuda.UnownedMemory(pointer, max(1, nbytes), owner, device_id=device)
        with backend.activate():
            self.device = cupy.ndarray(shape, dtype, cupy.cuda.MemoryPointer(memory, 0))


class HostCopy:
    """The NumPy backend's twin: its device is the host, so both views are one array (the given one where it
    already has the dtype: nothing to pin, nothing to copy)."""

    def __init__(self, array: np.ndarray, dtype):
        self.host = self.device = np.ascontiguousarray(array.astype(dtype, copy=False))


class _Owner:
    """Frees a cudaHostAlloc block once nothing refers to it."""

    def __init__(self, pointer: int, runtime):
        self._finalizer = weakref.finalize(self, runtime.freeHost, pointer)
        self._finalizer.atexit = False   # at exit the CUDA context may be gone already; the OS reclaims the block

    def keep(self, buffer):
        buffer._pinned_owner = self   # a ctypes array accepts attributes: the NumPy view keeps the block alive


def pinned_copy(backend, array: np.ndarray, dtype, what: str) -> PinnedBlock | HostCopy:
    """`array` converted to `dtype` into a fresh pinned block (one conversion, straight into the block)."""
    if not backend.is_gpu:
        return HostCopy(array, dtype)
    block = PinnedBlock(backend, array.shape, dtype, what)
    np.copyto(block.host, array, casting="unsafe")
    return block


def pinned_empty(shape: tuple, dtype) -> np.ndarray:
    """A NumPy array in page-locked host memory, which the copy engine reads without a staging copy."""
    import cupy
    dtype = np.dtype(dtype)
    count = int(np.prod(shape))
    memory = cupy.cuda.alloc_pinned_memory(max(1, count * dtype.itemsize))
    return np.ndarray(shape, dtype, buffer=memory)   # the array's base keeps the pinned block alive
