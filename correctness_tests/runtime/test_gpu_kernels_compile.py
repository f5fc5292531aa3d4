"""On a GPU: CuPy agrees with the CPU tier's NVRTC check, row by row of kernel_table.py.

test_kernels_compile.py compiles every row with NVRTC alone for sm_90. Here the
engine's real path (get_kernel: a CuPy RawModule for the device's own
architecture, loaded into the context) compiles the same rows and resolves each
kernel, so a difference between the check and CuPy (an option, an architecture,
a header CuPy adds) shows up as a failure here first.
"""
from __future__ import annotations

import pytest

from gpuengine.runtime import kernel_check
from gpuengine.runtime.backend import gpu_visible
from gpuengine.runtime.kernels import get_kernel

from .kernel_table import kernel_cases

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_visible(), reason="no CUDA GPU visible (CuPy missing or no device)")]


def test_cpu_check_compiles_for_this_gpu():
    import cupy
    capability = cupy.cuda.Device().compute_capability
    assert kernel_check.ARCH == f"sm_{capability}", (f"the CPU tier's NVRTC check compiles for {kernel_check.ARCH}, "
                                                    f"this GPU is sm_{capability}")


def test_every_row_loads_through_get_kernel():
    """One test for all rows: one skip on the CPU tier, and a failure that lists every row that did not load."""
    failed = []
    for case in kernel_cases():
        try:
            # Reading an attribute loads the module into the context: a compile or link error raises here.
            get_kernel(case.source, case.kernel, **dict(case.defines)).num_regs
        except Exception as exc:   # CuPy's CompileException, or a CUDA driver error on load
            failed.append(f"{case.id} ({case.where}): {type(exc).__name__}: {exc}")
    assert not failed, f"{len(failed)} rows of kernel_table.py do not load through CuPy:\n" + "\n".join(failed)
