"""What machine a suite run measures: its tier, GPU, drivers, libraries and clocks, and which commit.

The tier names the folder of `baselines_store/` a run is stored in and compared
against: a slug of the GPU's name (`nvidia-h200`, `nvidia-h100-80gb-hbm3`), or
`cpu-tier` when the engine runs on the NumPy backend. `collect_machine_info`
is what every stored pytest-benchmark run records next to the CPU facts the
plugin gathers itself (docs/architecture.md, "Measuring honestly"). Every
probe tolerates a missing piece (no NVML, no cuDNN frontend, no torch) by
recording None rather than failing; `stack_lock` names the tier's lock and how this
Python differs from it (gpuengine/bench/stack_lock.py). `checkout_commit` names the code measured,
for the records written outside pytest-benchmark (profiles, the power study).
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import subprocess
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from ..config import EngineConfig
from . import stack_lock

REPO = Path(__file__).resolve().parents[2]
CPU_TIER = "cpu-tier"
NO_GPU = "none (CPU tier, NumPy backend)"
UNCOMMITTED = "_uncommited-changes"   # pytest-benchmark's spelling: stored names read alike whoever wrote them


@dataclass(frozen=True)
class Tier:
    """The class of machine a run belongs to: timings compare only within one tier."""

    name: str              # folder under baselines_store/
    gpu_name: str | None   # None on the CPU tier

    @property
    def on_gpu(self) -> bool:
        return self.gpu_name is not None

    @property
    def gpu_label(self) -> str:
        return self.gpu_name or NO_GPU


def tier_slug(gpu_name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3': a folder name that survives any filesystem."""
    return re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-") or "unnamed-gpu"


def current_tier(on_gpu: bool) -> Tier:
    """The tier of the engine's device: the current CUDA device when it runs on a GPU."""
    if not on_gpu:
        return Tier(CPU_TIER, None)
    name = _cuda_device_name() or "unnamed GPU"
    return Tier(tier_slug(name), name)


def _cuda_device_name() -> str | None:
    try:
        import cupy
        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
        name = props["name"]
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # a missing or broken CUDA stack reads as "no name"
        return None


def _probe(fn):
    """fn() or None: one missing library or query must not lose the rest of the record."""
    try:
        return fn()
    except Exception:
        return None


def _distribution_version(name: str) -> str | None:
    """An installed package's version without importing it (torch takes seconds to import)."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cuda_version_text(version: int) -> str:
    """CUDA encodes 13.0 as 13000 and 12.8 as 12080."""
    return f"{version // 1000}.{version % 1000 // 10}"


def cudnn_version_text(version: int) -> str:
    """cuDNN 9 encodes 9.19.0 as 91900; cuDNN 8 encoded 8.9.7 as 8907."""
    if version >= 90000:
        return f"{version // 10000}.{version % 10000 // 100}.{version % 100}"
    return f"{version // 1000}.{version % 1000 // 100}.{version % 100}"


def _cudnn_version() -> str | None:
    """From the cuDNN frontend the engine uses, else from torch's bundled cuDNN."""
    def frontend():
        import cudnn
        return cudnn.backend_version()

    def torch_bundled():
        if importlib.util.find_spec("torch") is None:
            return None
        import torch
        return torch.backends.cudnn.version()

    version = _probe(frontend) or _probe(torch_bundled)
    return cudnn_version_text(int(version)) if version else None


def _cupy_facts() -> dict:
    import cupy
    runtime = cupy.cuda.runtime
    return {"cupy": cupy.__version__, "cuda_runtime": _cuda_version_text(runtime.runtimeGetVersion()),
            "cuda_driver_api": _cuda_version_text(runtime.driverGetVersion())}


def _nvml_facts() -> dict:
    """Driver, clocks and power limit of the engine's device, found by PCI bus id (CUDA and NVML number devices differently)."""
    import cupy
    import pynvml
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByPciBusId(cupy.cuda.Device().pci_bus_id)
        sm, mem = pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_MEM
        driver = pynvml.nvmlSystemGetDriverVersion()
        return {
            "gpu_driver": driver.decode() if isinstance(driver, bytes) else driver,
            "gpu_clocks_mhz": {
                "sm_current": _probe(lambda: pynvml.nvmlDeviceGetClockInfo(handle, sm)),
                "sm_max": _probe(lambda: pynvml.nvmlDeviceGetMaxClockInfo(handle, sm)),
                "mem_current": _probe(lambda: pynvml.nvmlDeviceGetClockInfo(handle, mem)),
                "mem_max": _probe(lambda: pynvml.nvmlDeviceGetMaxClockInfo(handle, mem)),
            },
            "gpu_power_limit_w": _probe(lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000),
        }
    finally:
        pynvml.nvmlShutdown()


def collect_machine_info(tier: Tier, config: EngineConfig) -> dict:
    """The GPU-side facts stored with every run; keys are present (maybe None) on every tier."""
    info = {
        "tier": tier.name,
        "gpu": tier.gpu_label,
        "gpu_driver": None,
        "cuda_runtime": None,
        "cudnn": None,
        "cupy": None,
        "torch": _distribution_version("torch"),
        "nvmath": _distribution_version("nvmath-python"),
        "gpu_clocks_mhz": None,
        "gpu_power_limit_w": None,
        "gpuengine_config": config.describe(),
        "stack_lock": stack_lock.current_record(),   # the lock this run's packages came from, and what differed
    }
    if tier.on_gpu:
        info.update(_probe(_cupy_facts) or {})
        info.update(_probe(_nvml_facts) or {})
        info["cudnn"] = _cudnn_version()
    return info


def named_commit() -> tuple[str, bool] | None:
    """(commit, dirty) as GATE_COMMIT_ID and GATE_COMMIT_DIRTY=1 name them, or None where they are not set: a copy
    of the tree on a lent GPU has no .git, or a stale one, so whoever copied it names the commit."""
    named = os.environ.get("GATE_COMMIT_ID", "").strip()
    return (named, os.environ.get("GATE_COMMIT_DIRTY", "0") == "1") if named else None


def named_commit_info() -> dict | None:
    """The commit_info fields a stored run takes from GATE_COMMIT_ID (`named_commit`, the branch from
    GATE_COMMIT_BRANCH, main by default), or None where it is not set: git's answer stands then."""
    named = named_commit()
    if named is None:
        return None
    commit, dirty = named
    return {"id": commit, "dirty": dirty, "branch": os.environ.get("GATE_COMMIT_BRANCH", "main"), "error": None}


def run_tag(commit: str, dirty: bool | None, when: datetime | None = None) -> str:
    """A stored run's name as pytest-benchmark's autosave writes it: `<commit>_<UTC date>_<time>`, plus
    `_uncommited-changes` when the tree differs from the commit."""
    when = datetime.now(timezone.utc) if when is None else when.astimezone(timezone.utc)
    return f"{commit}_{when:%Y%m%d_%H%M%S}" + (UNCOMMITTED if dirty else "")


def checkout_commit() -> tuple[str, bool | None]:
    """(commit, whether tracked files differ from it) of the code measured: `named_commit`, else what git says."""
    named = named_commit()
    if named:
        return named
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True)
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                                capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return "unversioned", None
    return head.stdout.strip(), bool(status.stdout.strip())
