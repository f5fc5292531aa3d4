"""Which core each GPU's perf session times its rounds on, when one pytest runs per GPU (gpuengine/gate/spread.py).

A launch-bound round (many small kernels, the host issuing each) takes as long
as the core that issues it lets it: two sessions timing on one core at once
slow each other, by a steady amount, and an A/A run of two processes of the
same code then reads as a regression (issue 36: +3.2% on two H100s, all four
engine workers timing on the host's last core). So each GPU's session gets a
core of its own, shared by its base and head workers and its references, which
never time at once (gpuengine/gate/ab/worker.py's GATE_TIMING_CPU). The core is
NUMA-local to the GPU where Linux says which cores are
(/sys/bus/pci/devices/<bus id>/local_cpulist), the highest free one there;
else, or when those are taken, a distinct core of the process's affinity set.
Core 0 (which tends to take interrupts) and a hyper-thread sibling of another
session's core are used only when nothing else is left, and each choice says
why.
"""
from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

SYS_PCI = Path("/sys/bus/pci/devices")
SYS_CPU = Path("/sys/devices/system/cpu")
NVIDIA_SMI_QUERY = ["nvidia-smi", "--query-gpu=index,uuid,pci.bus_id", "--format=csv,noheader"]


def parse_cpu_list(text: str) -> set[int]:
    """'0-3,8,10-11' (a Linux cpulist) -> {0, 1, 2, 3, 8, 10, 11}; anything else is a ValueError naming it."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        low, dash, high = part.strip().partition("-")
        try:
            first, last = int(low), int(high if dash else low)
        except ValueError:
            raise ValueError(f"{text.strip()!r} is not a cpulist (e.g. 0-15,32-47)") from None
        if last < first or first < 0:
            raise ValueError(f"{text.strip()!r} is not a cpulist: {part.strip()!r} runs backwards")
        cpus.update(range(first, last + 1))
    return cpus


def sysfs_bus_id(bus_id: str) -> str:
    """nvidia-smi's '00000000:19:00.0' -> sysfs' '0000:19:00.0' (a 4-digit domain, lower case)."""
    domain, _, rest = bus_id.strip().lower().partition(":")
    if not rest:
        raise ValueError(f"{bus_id!r} is not a PCI bus id (domain:bus:device.function)")
    return f"{domain[-4:].rjust(4, '0')}:{rest}"


def gpu_bus_ids(run: Callable = subprocess.run) -> dict[str, str]:
    """{CUDA_VISIBLE_DEVICES entry: sysfs bus id} by index and by UUID, from nvidia-smi; {} where it cannot say.
    The index is nvidia-smi's, PCI order: CUDA's too under CUDA_DEVICE_ORDER=PCI_BUS_ID (spread.py sets it)."""
    try:
        listing = run(NVIDIA_SMI_QUERY, capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    found = {}
    for line in listing.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 3:
            try:
                found[fields[0]] = found[fields[1]] = sysfs_bus_id(fields[2])
            except ValueError:
                continue   # a line this parser does not know: that GPU goes without NUMA information
    return found


def local_cpus(bus_id: str, sys_pci: Path = SYS_PCI) -> set[int] | None:
    """The cores Linux lists as local to the PCI device, or None where it lists none."""
    try:
        return parse_cpu_list((sys_pci / bus_id / "local_cpulist").read_text()) or None
    except (OSError, ValueError):
        return None


def smt_siblings(cpu: int, sys_cpu: Path = SYS_CPU) -> set[int]:
    """The hyper-threads of `cpu`'s physical core, itself included ({cpu} where Linux does not say)."""
    try:
        return parse_cpu_list((sys_cpu / f"cpu{cpu}" / "topology" / "thread_siblings_list").read_text()) | {cpu}
    except (OSError, ValueError):
        return {cpu}


@dataclass(frozen=True)
class TimingCore:
    cpu: int
    why: str

    def as_dict(self) -> dict:
        return {"cpu": self.cpu, "why": self.why}


def choose_timing_cores(gpus: list[str], allowed: set[int], local: dict[str, set[int] | None],
                        siblings: Callable[[int], set[int]] = lambda cpu: {cpu}) -> dict[str, TimingCore]:
    """{gpu: its session's timing core}, in the order of `gpus`: the highest free core local to the GPU, else of
    `allowed` (the process's cores), a whole core apart from the cores chosen before; core 0, a sibling of a chosen
    core, and last a core another GPU already has, only when nothing else is left."""
    if not allowed:
        raise ValueError("no core to time on: the process's affinity set is empty")
    chosen: dict[str, TimingCore] = {}
    for gpu in gpus:
        taken = {core.cpu for core in chosen.values()}
        near = set().union(taken, *(siblings(cpu) for cpu in taken))
        mine = local.get(gpu) or set()
        elsewhere = (f"GPU {gpu}'s local cores ({cpu_text(mine)}) are taken" if mine
                     else f"no NUMA information for GPU {gpu}")
        pools = [(mine & allowed - near - {0}, f"NUMA-local to GPU {gpu} (its local cores: {cpu_text(mine)})"),
                 (allowed - near - {0}, f"a core of its own: {elsewhere}"),
                 (allowed - taken - {0}, "a hyper-thread sibling of another GPU's timing core: no whole core left"),
                 (allowed - taken, "core 0: no other core left"),
                 (set(allowed), "shared with another GPU's session: fewer cores than GPUs")]
        pool, why = next((pool, why) for pool, why in pools if pool)
        chosen[gpu] = TimingCore(max(pool), why)
    return chosen


def cpu_text(cpus: set[int]) -> str:
    """{0, 1, 2, 5} -> '0-2,5'."""
    spans: list[list[int]] = []
    for cpu in sorted(cpus):
        if spans and cpu == spans[-1][1] + 1:
            spans[-1][1] = cpu
        else:
            spans.append([cpu, cpu])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)


def timing_cores(devices: list[str], bus_ids: dict[str, str] | None = None, sys_pci: Path = SYS_PCI,
                 sys_cpu: Path = SYS_CPU) -> dict[str, TimingCore]:
    """{CUDA_VISIBLE_DEVICES entry: timing core} for this host's GPUs `devices`, from what Linux and nvidia-smi say;
    {} where the OS cannot pin a thread (each session then times wherever the scheduler puts it)."""
    if not hasattr(os, "sched_setaffinity"):
        return {}
    bus_ids = gpu_bus_ids() if bus_ids is None else bus_ids
    allowed = os.sched_getaffinity(0)
    local = {device: local_cpus(bus_ids[device], sys_pci) if device in bus_ids else None for device in devices}
    return choose_timing_cores(devices, allowed, local, lambda cpu: smt_siblings(cpu, sys_cpu))
