"""launch_early: a kernel launched through the driver's cuLaunchKernelEx with programmatic stream serialization on
CuPy's current stream (a stand-in driver and CuPy on the CPU tier); its arguments typed as the kernels declare
them, anything else refused by position, and a failed launch named by its result."""
from __future__ import annotations

import ctypes
import sys
from types import ModuleType, SimpleNamespace

import numpy as np
import pytest

from gpuengine.runtime.kernels import kernel_params, launch_early

from .test_cluster_ceiling import CUresult, install_driver

KERNEL = SimpleNamespace(name="bn_backward", kernel=SimpleNamespace(ptr=0xBEEF))


def stand_in(monkeypatch, result: CUresult = CUresult.CUDA_SUCCESS) -> dict:
    """cuda.bindings.driver and cupy as launch_early calls them; what the launch was given lands in the dict."""
    launched = {}

    def launch(config, function, params, extra):
        launched.update(config=vars(config), function=function, params=params, extra=extra)
        return (result,)
    driver = SimpleNamespace(
        CUlaunchConfig=SimpleNamespace, CUlaunchAttribute=lambda: SimpleNamespace(value=SimpleNamespace()),
        CUlaunchAttributeID=SimpleNamespace(CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION="serialization"),
        CUfunction=lambda ptr: ("CUfunction", ptr), CUstream=lambda ptr: ("CUstream", ptr),
        CUdeviceptr=lambda ptr: ("CUdeviceptr", ptr), CUresult=CUresult, cuLaunchKernelEx=launch)
    install_driver(monkeypatch, driver)
    cupy = ModuleType("cupy")
    cupy.cuda = SimpleNamespace(get_current_stream=lambda: SimpleNamespace(ptr=0x57))
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    return launched


def device_array(ptr: int):
    return SimpleNamespace(data=SimpleNamespace(ptr=ptr))


def test_the_launch_runs_on_the_current_stream_allowed_to_start_before_the_kernel_ahead_ends(monkeypatch):
    launched = stand_in(monkeypatch)
    launch_early(KERNEL, (32, 8), (256,), (device_array(0x1000), np.int32(7)), 16384)
    config = launched["config"]
    assert launched["function"] == ("CUfunction", 0xBEEF) and launched["extra"] == 0
    assert (config["gridDimX"], config["gridDimY"], config["gridDimZ"]) == (32, 8, 1)
    assert (config["blockDimX"], config["blockDimY"], config["blockDimZ"]) == (256, 1, 1)
    assert config["sharedMemBytes"] == 16384 and config["hStream"] == ("CUstream", 0x57)
    [early] = config["attrs"]
    assert config["numAttrs"] == 1 and early.id == "serialization"
    assert early.value.programmaticStreamSerializationAllowed == 1
    assert launched["params"] == ((("CUdeviceptr", 0x1000), 7), (None, ctypes.c_int32))


def test_arguments_take_the_c_type_of_their_dtype(monkeypatch):
    stand_in(monkeypatch)
    driver = sys.modules["cuda.bindings"].driver
    values, types = kernel_params(driver, "bn_forward", (device_array(0x20), np.int32(-3), np.uint32(5),
                                                         np.int64(1 << 40), np.float32(0.5)))
    assert values == (("CUdeviceptr", 0x20), -3, 5, 1 << 40, 0.5)
    assert types == (None, ctypes.c_int32, ctypes.c_uint32, ctypes.c_int64, ctypes.c_float)


@pytest.mark.parametrize("arg", [7, np.float64(0.5), None], ids=["python-int", "float64", "none"])
def test_an_argument_of_no_declared_type_is_refused_by_position(monkeypatch, arg):
    stand_in(monkeypatch)
    driver = sys.modules["cuda.bindings"].driver
    with pytest.raises(TypeError, match=rf"bn_forward: argument 1 is a {type(arg).__name__}; a launch takes device "
                                        r"arrays and NumPy int32, uint32, int64 or float32 scalars"):
        kernel_params(driver, "bn_forward", (device_array(0x20), arg))


def test_a_failed_launch_names_the_kernel_and_the_result(monkeypatch):
    stand_in(monkeypatch, CUresult.CUDA_ERROR_NOT_SUPPORTED)
    with pytest.raises(RuntimeError, match=r"cuLaunchKernelEx of bn_backward \(launched early\): "
                                           "CUDA_ERROR_NOT_SUPPORTED"):
        launch_early(KERNEL, (1, 1), (32,), ())


def test_without_cuda_bindings_the_error_says_what_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)   # import fails
    with pytest.raises(RuntimeError, match=r"launching bn_backward early needs the driver's API from cuda-bindings"):
        launch_early(KERNEL, (1, 1), (32,), ())
