"""NVML (the NVIDIA Management Library, through nvidia-ml-py) for the engine's device.

Memory and energy readings come from NVML rather than from CUDA because NVML
sees what CUDA cannot: the whole process's device memory (context and library
allocations included), the device's free memory before this process created a
context, the power draw and the energy counter. CUDA and NVML number devices
differently (CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER), so devices are matched
by PCI bus id, never by index.
"""
from __future__ import annotations

import functools
import re


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used here; the message says why (tests skip with it)."""


@functools.lru_cache(maxsize=1)
def _init():
    try:
        import pynvml
    except ImportError:
        raise NvmlUnavailable("nvidia-ml-py is not installed (pip install nvidia-ml-py): no NVML") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise NvmlUnavailable(f"NVML did not initialise ({exc}): no NVIDIA driver on this machine?") from None
    # Initialised once per process and left open: nvmlShutdown would invalidate handles other code holds.
    return pynvml


def nvml():
    """The initialised pynvml module, or NvmlUnavailable."""
    return _init()


def unavailable_reason() -> str | None:
    """None when NVML works and sees a device; else why not, in words."""
    try:
        if nvml().nvmlDeviceGetCount() < 1:
            return "NVML sees no NVIDIA device"
    except NvmlUnavailable as exc:
        return str(exc)
    return None


def normalise_bus_id(bus_id: str | bytes) -> str:
    """'0000:3B:00.0' (CUDA) and '00000000:3b:00.0' (NVML) -> '0000:3b:00.0'."""
    text = bus_id.decode() if isinstance(bus_id, bytes) else str(bus_id)
    match = re.fullmatch(r"\s*([0-9a-fA-F]+):([0-9a-fA-F]+):([0-9a-fA-F]+)\.([0-9a-fA-F]+)\s*", text)
    if match is None:
        raise ValueError(f"{bus_id!r} is not a PCI bus id (domain:bus:device.function)")
    domain, bus, device, function = (int(part, 16) for part in match.groups())
    return f"{domain:04x}:{bus:02x}:{device:02x}.{function:x}"


def device_handles() -> dict[str, object]:
    """Every NVML device handle, keyed by normalised PCI bus id."""
    lib = nvml()
    handles = {}
    for index in range(lib.nvmlDeviceGetCount()):
        handle = lib.nvmlDeviceGetHandleByIndex(index)
        handles[normalise_bus_id(lib.nvmlDeviceGetPciInfo(handle).busId)] = handle
    return handles


def _cupy_bus_id() -> str:
    import cupy
    return normalise_bus_id(cupy.cuda.Device().pci_bus_id)


def _torch_bus_id() -> str:
    import torch
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return normalise_bus_id(f"{props.pci_domain_id:x}:{props.pci_bus_id:x}:{props.pci_device_id:x}.0")


def cuda_bus_id(framework: str = "cupy") -> str:
    """Normalised PCI bus id of the current CUDA device, asking `framework` first (creates no work)."""
    readers = {"cupy": _cupy_bus_id, "torch": _torch_bus_id}
    order = [framework] + [name for name in readers if name != framework]
    failures = []
    for name in order:
        try:
            return readers[name]()
        except Exception as exc:   # not installed, built without CUDA, or too old to say: ask the other
            failures.append(f"{name}: {exc}")
    raise NvmlUnavailable(f"cannot tell the CUDA device's PCI bus id ({'; '.join(failures)})")


def handle_for_cuda_device(framework: str = "cupy"):
    """The NVML handle of the current CUDA device."""
    bus_id = cuda_bus_id(framework)
    handles = device_handles()
    if bus_id not in handles:
        raise NvmlUnavailable(f"NVML lists no device at PCI bus id {bus_id} (it lists {sorted(handles)})")
    return handles[bus_id]


def is_not_supported(exc: BaseException) -> bool:
    """True for NVML's NOT_SUPPORTED error (a query this GPU or driver does not implement)."""
    try:
        lib = nvml()
    except NvmlUnavailable:
        return False
    return isinstance(exc, lib.NVMLError) and getattr(exc, "value", None) == lib.NVML_ERROR_NOT_SUPPORTED
