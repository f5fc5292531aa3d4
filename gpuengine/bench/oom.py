"""A device out-of-memory inside one perf test (gpu_memory.is_out_of_memory): fail that test with the sizes,
free what it held, go on.

The allocation that failed names its size (CuPy: "Out of memory allocating N
bytes (allocated so far: M bytes)"; torch: "Tried to allocate ... of which ...
is free"); `describe` adds the device's free and total memory and what this
process keeps cached (CuPy's pool, torch's caching allocator). `release`
lets the failed test's arrays go (its frames, held by the traceback, are
cleared first by the caller) and hands the cached blocks back to the
device, so the next test starts from what the session held before.
"""
from __future__ import annotations

import gc
import sys

from ..runtime.backend import GIB


def _gib(count: int) -> str:
    return f"{count / GIB:.2f} GiB"


def device_memory() -> str:
    """'F GiB free of T GiB on the device, CuPy's pool holds P GiB, torch's cache holds R GiB': what can be
    read ('' where neither CuPy nor torch has touched a GPU)."""
    parts = []
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        try:
            free, total = cupy.cuda.runtime.memGetInfo()
            parts.append(f"{_gib(free)} free of {_gib(total)} on the device")
            parts.append(f"CuPy's pool holds {_gib(cupy.get_default_memory_pool().total_bytes())}")
        except Exception as exc:   # a context the failure left unusable: say so instead of a second traceback
            parts.append(f"device memory unreadable ({type(exc).__name__}: {exc})")
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        parts.append(f"torch's cache holds {_gib(torch.cuda.memory_reserved())}")
    return ", ".join(parts)


def describe(exc: BaseException) -> str:
    """The failed allocation in the library's words (first line, which carries the sizes), then the device."""
    chain, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    named = next((e for e in chain if "out of memory" in str(e).lower() or "allocat" in str(e).lower()), chain[0])
    first = str(named).strip().splitlines()[0] if str(named).strip() else type(named).__name__
    memory = device_memory()
    return f"device out of memory: {type(named).__name__}: {first}" + (f" [{memory}]" if memory else "")


def release() -> str:
    """Collect the failed test's objects and give cached device memory back; what the device holds after."""
    gc.collect()
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        cupy.get_default_memory_pool().free_all_blocks()
        cupy.get_default_pinned_memory_pool().free_all_blocks()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    return device_memory()
