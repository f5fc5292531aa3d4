"""Every CUDA kernel the engine can compile, compiles: NVRTC on the CPU tier, no GPU needed.

Each row of kernel_table.py (a get_kernel call site with one define
combination a workload really uses) is compiled with the engine's own NVRTC
check (gpuengine/runtime/kernel_check.py: PRELUDE + source, CuPy's options, sm_90),
which also finds the kernel's extern "C" entry in the PTX. The coverage tests
read gpuengine/ with `ast`, so a new get_kernel call site without
rows, a row for a call site that is gone, or an engine kernel compiled past
get_kernel fails here.
The compile tests skip, saying why, only where libnvrtc cannot be loaded.
"""
from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

from gpuengine.runtime import kernel_check
from gpuengine.runtime.kernel_check import KernelCompileError, check_kernel, compile_many, nvrtc_available

from .kernel_table import kernel_cases

ENGINE = Path(__file__).resolve().parents[2] / "gpuengine"
CASES = kernel_cases()
# Kernel builders that would bypass get_kernel (and so this check); kernels.py alone may use them.
_BYPASSES = {"RawModule", "RawKernel", "ElementwiseKernel", "ReductionKernel", "compile_module"}

needs_nvrtc = pytest.mark.skipif(not nvrtc_available(), reason="libnvrtc not found, so no kernel can be compiled "
                                 "here: pip install nvidia-cuda-nvrtc (the kernelcheck extra) or set CUDA_PATH")


def _request(case) -> tuple:
    """check_kernel's cache key for a row: the source, its defines, where it is defined."""
    return case.source, case.defines, f"{case.module}.{case.source_expr}", inspect.getfile(
        importlib.import_module(case.module))


@pytest.fixture(scope="module")
def compiled():
    """All rows compiled once, on every core: a (source, defines) shared by several rows compiles once."""
    compile_many(_request(case) for case in CASES)


@needs_nvrtc
@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_kernel_compiles(compiled, case):
    source, defines, origin, path = _request(case)
    result = check_kernel(source, case.kernel, origin, path, **dict(defines))
    assert result.log == "", f"{case.where}: NVRTC warns:\n{result.log}"


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(ENGINE.parent).with_suffix("").parts)


def call_sites() -> tuple[dict, list[str]]:
    """{(module, source expression, kernel name): 'file:line'} of every get_kernel call, and the problems found."""
    sites, problems = {}, []
    for path in sorted(ENGINE.rglob("*.py")):
        where = path.relative_to(ENGINE.parent)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            name = getattr(node, "attr", None) or getattr(node, "id", None)
            if name in _BYPASSES and path.name != "kernels.py":
                problems.append(f"{where}:{node.lineno}: {name} compiles a kernel past get_kernel and its check")
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None))
                    == "get_kernel"):
                continue
            literal = len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
            if not (literal and isinstance(node.args[1].value, str)):
                problems.append(f"{where}:{node.lineno}: get_kernel's kernel name must be a string literal, so that "
                                "the compile check can list it")
                continue
            sites[(_module_name(path), ast.unparse(node.args[0]), node.args[1].value)] = f"{where}:{node.lineno}"
    return sites, problems


def test_every_get_kernel_call_site_has_rows():
    sites, problems = call_sites()
    assert not problems, "\n".join(problems)
    assert len(sites) > 30, f"found only {len(sites)} get_kernel call sites: the scan is broken"
    listed = {case.site for case in CASES}
    missing = [f"{at}: {module} get_kernel({source}, {kernel!r})" for (module, source, kernel), at in sites.items()
               if (module, source, kernel) not in listed]
    assert not missing, ("get_kernel call sites without a compile check; add their defines to "
                         "correctness_tests/runtime/kernel_table.py:\n" + "\n".join(missing))


def test_every_row_names_a_real_call_site():
    sites, _ = call_sites()
    stale = sorted({case.site for case in CASES} - set(sites))
    assert not stale, f"kernel_table.py rows for call sites gpuengine/ no longer has: {stale}"


def test_float_and_bf16_of_every_element_kernel():
    """The table itself: each ELEM_T kernel is checked in both compute dtypes, as the precision toggles use them."""
    dtypes = {}
    for case in CASES:
        elem = dict(case.defines).get("ELEM_T")
        if elem is not None:
            dtypes.setdefault(case.site, set()).add(elem)
    assert dtypes and all(found == {"float", "bf16_t"} for found in dtypes.values()), dtypes


_BROKEN = r"""
extern "C" __global__ void broken(ELEM_T* y) {
    y[0] = SCALE * undeclared_value;
}
"""


@needs_nvrtc
def test_broken_source_names_source_kernel_defines_and_nvrtc_line():
    with pytest.raises(KernelCompileError) as raised:
        check_kernel(_BROKEN, "broken", "test_kernels_compile._BROKEN", __file__, ELEM_T="float", SCALE=2)
    message = str(raised.value)
    assert message.startswith("test_kernels_compile._BROKEN: kernel 'broken' does not compile with "
                              "-DELEM_T=float -DSCALE=2")
    line = Path(__file__).read_text().splitlines().index("    y[0] = SCALE * undeclared_value;") + 1
    assert f'{__file__}({line}): error: identifier "undeclared_value" is undefined' in message


@needs_nvrtc
def test_source_not_in_its_file_is_numbered_from_its_own_first_line():
    source = "\n" + _BROKEN.replace("SCALE", "2.f")   # built at run time, as activations.SOURCES are
    with pytest.raises(KernelCompileError) as raised:
        check_kernel(source, "broken", "built source", __file__, ELEM_T="float")
    assert 'built source(4): error: identifier "undeclared_value" is undefined' in str(raised.value)


@needs_nvrtc
def test_kernel_missing_from_ptx_is_named():
    source = "__global__ void mangled(float* y) { y[0] = 1.f; }\n"   # no extern "C": the entry name is mangled
    with pytest.raises(KernelCompileError, match="defines no extern \"C\" kernel 'mangled'"):
        check_kernel(source, "mangled", "inline source")


def test_missing_library_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(kernel_check, "candidate_libraries", lambda: ["/nonexistent/libnvrtc.so.13"])
    kernel_check.nvrtc_library.cache_clear()
    try:
        with pytest.raises(kernel_check.NvrtcMissing, match="/nonexistent/libnvrtc.so.13.*pip install nvidia-cuda"):
            kernel_check.nvrtc_library()
    finally:
        kernel_check.nvrtc_library.cache_clear()
