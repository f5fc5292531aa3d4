"""Compile the engine's CUDA kernel sources with NVRTC on any machine, GPU or not.

Every kernel is a CuPy RawModule compiled at first use on a GPU, so a typo in
a kernel source used to surface only on a GPU run. NVRTC (the nvidia-cuda-nvrtc
wheel, the library CuPy itself compiles with) needs no GPU and no CuPy: this
module loads it through ctypes and compiles PRELUDE + source with the options
`kernels.compile_options` gives CuPy, for the H100/H200's sm_90. A
compile error, or a kernel name the PTX does not define as an `extern "C"`
entry, raises `KernelCompileError` naming the source, the kernel, the defines
and NVRTC's log, whose line numbers point into the source's own file where the
source appears there verbatim.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import glob
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .kernels import PRELUDE, compile_options, define_items

# The GPUs this engine runs on (H100, H200). A real architecture, as CuPy picks for the device it finds:
# NVRTC then also runs ptxas, which catches resource errors (shared memory, registers) PTX alone would not.
ARCH = "sm_90"
_INSTALL_HINT = "pip install nvidia-cuda-nvrtc (or set CUDA_PATH to a CUDA toolkit)"


class NvrtcMissing(RuntimeError):
    """No libnvrtc could be loaded on this machine."""


class KernelCompileError(RuntimeError):
    """A kernel source did not compile, or does not define the kernel asked for."""


@dataclass(frozen=True)
class CompiledSource:
    ptx: str
    log: str          # NVRTC's warnings, empty when there are none
    entries: tuple    # the extern "C" kernel names the PTX defines


def _wheel_libraries() -> list[str]:
    """libnvrtc of the nvidia-cuda-nvrtc wheels (CUDA 13: nvidia/cu13/lib, CUDA 12: nvidia/cuda_nvrtc/lib)."""
    try:
        import nvidia
    except ImportError:
        return []
    found = []
    for root in getattr(nvidia, "__path__", []):
        found += sorted(glob.glob(os.path.join(root, "*", "lib", "libnvrtc.so.*")), reverse=True)
    return found


def candidate_libraries() -> list[str]:
    """Where libnvrtc may be, most specific first: the wheel, CUDA_PATH / CUDA_HOME, the loader's search path."""
    paths = _wheel_libraries()
    for variable in ("CUDA_PATH", "CUDA_HOME"):
        root = os.environ.get(variable)
        if root:
            paths += sorted(glob.glob(os.path.join(root, "lib64", "libnvrtc.so*")), reverse=True)
    system = ctypes.util.find_library("nvrtc")
    if system:
        paths.append(system)
    return paths


@functools.lru_cache(maxsize=None)
def nvrtc_library() -> ctypes.CDLL:
    """The first libnvrtc that loads, with the signatures used here; NvrtcMissing naming every place tried."""
    tried = []
    for path in candidate_libraries():
        try:
            lib = ctypes.CDLL(path)
        except OSError as exc:
            tried.append(f"{path} ({exc})")
            continue
        _declare(lib)
        return lib
    where = "; ".join(tried) if tried else "no candidate found"
    raise NvrtcMissing(f"libnvrtc not found ({where}): {_INSTALL_HINT}")


def nvrtc_available() -> bool:
    try:
        nvrtc_library()
    except NvrtcMissing:
        return False
    return True


def _declare(lib: ctypes.CDLL):
    size_p, prog_p = ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_void_p)
    signatures = {
        "nvrtcVersion": [ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)],
        "nvrtcCreateProgram": [prog_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p,
                               ctypes.c_void_p],
        "nvrtcCompileProgram": [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
        "nvrtcDestroyProgram": [prog_p],
        "nvrtcGetProgramLogSize": [ctypes.c_void_p, size_p],
        "nvrtcGetProgramLog": [ctypes.c_void_p, ctypes.c_char_p],
        "nvrtcGetPTXSize": [ctypes.c_void_p, size_p],
        "nvrtcGetPTX": [ctypes.c_void_p, ctypes.c_char_p],
        "nvrtcGetErrorString": [ctypes.c_int],
    }
    for name, argtypes in signatures.items():
        function = getattr(lib, name)
        function.argtypes = argtypes
        function.restype = ctypes.c_char_p if name == "nvrtcGetErrorString" else ctypes.c_int


def nvrtc_version() -> tuple[int, int]:
    major, minor = ctypes.c_int(), ctypes.c_int()
    _check(nvrtc_library().nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
    return major.value, minor.value


def _check(status: int, call: str):
    """A failing NVRTC call other than the compile itself is a broken library or a bug here, not a kernel bug."""
    if status != 0:
        raise RuntimeError(f"{call} failed: {nvrtc_library().nvrtcGetErrorString(status).decode()}")


def _text(prog, size_call: str, get_call: str) -> str:
    lib, size = nvrtc_library(), ctypes.c_size_t()
    _check(getattr(lib, size_call)(prog, ctypes.byref(size)), size_call)
    buffer = ctypes.create_string_buffer(size.value)
    _check(getattr(lib, get_call)(prog, buffer), get_call)
    return buffer.value.decode(errors="replace")


def line_directive(source: str, origin: str, path: str | None = None) -> str:
    """A #line that makes NVRTC's log lines those of `path` where the source is there verbatim, else of `origin`."""
    if path and os.path.isfile(path):
        text = Path(path).read_text()
        at = text.find(source)
        if at >= 0 and source.strip():
            return f'#line {text.count(chr(10), 0, at) + 1} "{path}"\n'
    return f'#line 1 "{origin}"\n'


def compile_source(source: str, defines: tuple = (), origin: str = "kernel source",
                   path: str | None = None) -> tuple[int, str, str]:
    """(NVRTC status, log, PTX) of PRELUDE + source under compile_options(defines) for ARCH."""
    lib = nvrtc_library()
    code = PRELUDE + line_directive(source, origin, path) + source
    options = [f"--gpu-architecture={ARCH}", *compile_options(defines)]
    prog = ctypes.c_void_p()
    _check(lib.nvrtcCreateProgram(ctypes.byref(prog), code.encode(), origin.encode(), 0, None, None),
           "nvrtcCreateProgram")
    try:
        encoded = (ctypes.c_char_p * len(options))(*(o.encode() for o in options))
        status = lib.nvrtcCompileProgram(prog, len(options), encoded)
        log = _text(prog, "nvrtcGetProgramLogSize", "nvrtcGetProgramLog").strip()
        ptx = _text(prog, "nvrtcGetPTXSize", "nvrtcGetPTX") if status == 0 else ""
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return status, log, ptx


def ptx_entries(ptx: str) -> tuple:
    """Names of the kernels a PTX module defines (`.entry NAME(`): unmangled only when declared extern "C"."""
    return tuple(re.findall(r"\.entry\s+([A-Za-z_$][\w$]*)\s*\(", ptx))


@functools.lru_cache(maxsize=None)
def _compile_cached(source: str, defines: tuple, origin: str, path: str | None) -> CompiledSource | str:
    status, log, ptx = compile_source(source, defines, origin, path)
    if status != 0:
        return log
    return CompiledSource(ptx, log, ptx_entries(ptx))


def check_kernel(source: str, name: str, origin: str = "kernel source", path: str | None = None,
                 **defines) -> CompiledSource:
    """Compile `source` as get_kernel(source, name, **defines) would; KernelCompileError if it fails or lacks `name`.

    One compile per (source, defines), as CuPy compiles one module per call: the kernels of one module share it.
    """
    items = define_items(defines)
    result = _compile_cached(source, items, origin, path)
    described = " ".join(f"-D{k}={v}" for k, v in items) or "no defines"
    if isinstance(result, str):
        compiler = "NVRTC {}.{}".format(*nvrtc_version())
        raise KernelCompileError(f"{origin}: kernel {name!r} does not compile with {described} ({compiler}, "
                                 f"{ARCH}):\n{result}")
    if name not in result.entries:
        raise KernelCompileError(f"{origin}: compiles with {described} but defines no extern \"C\" kernel {name!r} "
                                 f"(its kernels: {', '.join(result.entries) or 'none'})")
    return result


def compile_many(requests, workers: int | None = None):
    """Fill check_kernel's cache for many (source, defines, origin, path) on threads: NVRTC runs outside the GIL."""
    requests = list(dict.fromkeys(requests))
    with ThreadPoolExecutor(workers or os.cpu_count() or 1) as pool:
        list(pool.map(lambda request: _compile_cached(*request), requests))
