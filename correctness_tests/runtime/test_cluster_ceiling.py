"""max_active_clusters: the driver's count of a kernel's clusters that run at once, asked with the launch's shape
(a stand-in driver module on the CPU tier), a failed call named by its result, and a missing cuda-bindings named."""
from __future__ import annotations

import enum
import sys
from types import ModuleType, SimpleNamespace

import pytest

from gpuengine.runtime.kernels import max_active_clusters

KERNEL = SimpleNamespace(name="bn_forward", kernel=SimpleNamespace(ptr=0xBEEF))


class CUresult(enum.Enum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_NOT_SUPPORTED = 801
    CUDA_ERROR_INVALID_CLUSTER_SIZE = 912


def install_driver(monkeypatch, driver):
    """`driver` as cuda.bindings.driver for the test's length."""
    bindings = ModuleType("cuda.bindings")
    bindings.driver = driver
    monkeypatch.setitem(sys.modules, "cuda", ModuleType("cuda"))
    monkeypatch.setitem(sys.modules, "cuda.bindings", bindings)


def stand_in_driver(monkeypatch, result: CUresult, clusters: int) -> dict:
    """cuda.bindings.driver as max_active_clusters calls it; what it was asked lands in the returned dict."""
    asked = {}

    def query(function, config):
        asked.update(function=function, config=vars(config))
        return result, clusters
    driver = SimpleNamespace(CUlaunchConfig=lambda: SimpleNamespace(), CUfunction=lambda ptr: ("CUfunction", ptr),
                             CUresult=CUresult, cuOccupancyMaxActiveClusters=query)
    install_driver(monkeypatch, driver)
    return asked


def test_the_driver_is_asked_with_the_launchs_grid_block_and_shared_memory(monkeypatch):
    asked = stand_in_driver(monkeypatch, CUresult.CUDA_SUCCESS, 30)
    assert max_active_clusters(KERNEL, (32, 8), 256, 16384) == 30
    assert asked["function"] == ("CUfunction", 0xBEEF)
    assert asked["config"] == {"gridDimX": 32, "gridDimY": 8, "gridDimZ": 1, "blockDimX": 256, "blockDimY": 1,
                               "blockDimZ": 1, "sharedMemBytes": 16384, "numAttrs": 0}


def test_a_failed_query_names_the_kernel_and_the_result(monkeypatch):
    stand_in_driver(monkeypatch, CUresult.CUDA_ERROR_INVALID_CLUSTER_SIZE, 0)
    with pytest.raises(RuntimeError, match="cuOccupancyMaxActiveClusters of bn_forward: "
                                           "CUDA_ERROR_INVALID_CLUSTER_SIZE"):
        max_active_clusters(KERNEL, (32, 8), 256, 16384)


def test_without_cuda_bindings_the_error_says_what_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)   # import fails
    with pytest.raises(RuntimeError, match=r"the cluster ceiling of bn_forward \(cuOccupancyMaxActiveClusters\) "
                                           r"needs the driver's API from cuda-bindings \(nvmath-python "
                                           r"installs it\), which does not import"):
        max_active_clusters(KERNEL, (32, 8), 256, 16384)
