"""Process device memory against a fake NVML: per-process figure, free-memory drop, device binding, peaks."""
from __future__ import annotations

import time

import pytest

from gpuengine.bench.gpu_memory import NVML_FREE_DROP, NVML_PROCESS, PeakSampler, ProcessMemory
from gpuengine.bench.nvml import normalise_bus_id

GIB = 1 << 30


class FakeDevice:
    """A device with `free` bytes; `processes` maps pid -> used bytes (None: the driver does not say)."""

    def __init__(self, free=79 * GIB, processes=None):
        self.free, self.processes = free, processes or {}

    def free_bytes(self):
        return self.free

    def process_used_bytes(self, pid):
        return self.processes.get(pid)


def test_per_process_figure_is_preferred():
    device = FakeDevice()
    memory = ProcessMemory({"0000:3b:00.0": device}, pid=42)
    device.processes[42] = 3 * GIB
    device.free -= 5 * GIB          # someone else allocated too: the per-process figure ignores them
    assert memory.used_bytes() == (3 * GIB, NVML_PROCESS)


def test_free_memory_drop_stands_in_where_the_driver_lists_no_such_pid():
    device = FakeDevice(processes={1234: 7 * GIB})   # a host PID: we run in another PID namespace
    memory = ProcessMemory({"0000:3b:00.0": device}, pid=42)
    device.free -= 2 * GIB
    assert memory.used_bytes() == (2 * GIB, NVML_FREE_DROP)


def test_several_devices_need_binding_by_bus_id():
    a, b = FakeDevice(), FakeDevice()
    memory = ProcessMemory({"0000:3b:00.0": a, "0000:86:00.0": b}, pid=1)
    with pytest.raises(RuntimeError, match="bind"):
        memory.used_bytes()
    memory.bind(normalise_bus_id("00000000:86:00.0"))
    b.free -= GIB
    assert memory.used_bytes() == (GIB, NVML_FREE_DROP)
    with pytest.raises(ValueError, match="no memory probe"):
        memory.bind("0000:01:00.0")


@pytest.mark.parametrize("raw,expected", [("0000:3B:00.0", "0000:3b:00.0"), ("00000000:3b:00.0", "0000:3b:00.0"),
                                          (b"00000001:C1:1F.1", "0001:c1:1f.1")])
def test_bus_ids_from_cuda_and_nvml_normalise_alike(raw, expected):
    assert normalise_bus_id(raw) == expected


def test_peak_sampler_catches_a_transient_peak():
    device = FakeDevice()
    memory = ProcessMemory({"d": device}, pid=7)
    with PeakSampler(memory, interval_s=0.002) as peak:
        device.processes[7] = 1 * GIB
        time.sleep(0.03)
        device.processes[7] = 4 * GIB     # a transient, freed before the window ends
        time.sleep(0.03)
        device.processes[7] = 2 * GIB
    assert peak.peak_bytes == 4 * GIB and peak.method == NVML_PROCESS


def test_peak_sampler_reports_a_dead_probe():
    class Broken(FakeDevice):
        calls = 0

        def process_used_bytes(self, pid):
            Broken.calls += 1
            if Broken.calls > 1:
                raise OSError("driver went away")
            return 0

    with pytest.raises((RuntimeError, OSError), match="driver went away|sampling failed"):
        with PeakSampler(ProcessMemory({"d": Broken()}, pid=1), interval_s=0.001):
            time.sleep(0.02)
