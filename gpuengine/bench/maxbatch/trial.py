"""One max-batch trial, in a process of its own: does this batch fit under the memory cap?

    python -m gpuengine.bench.maxbatch.trial --workload mlp --mode train --engine gpuengine \
        --batch 400000 --precision tf32 --cap-gib 6 --batch-pool 2

prints one JSON line {status, peak_bytes, measured_by, error, ...} and exits 0;
a process that dies without printing it is an ERROR for the caller. A fresh
process per trial because an out-of-memory error can leave a CUDA context
(and a framework's allocator) unusable.

The cap is enforced, not trusted (seed note 000 caught a driver silently
spilling into host RAM): it covers the whole process, as a real card of that
size would, context and library memory included. The allocator is limited to
the cap minus what the process holds right after creating its CUDA context
(CuPy's pool for the engine, `set_per_process_memory_fraction` for torch),
and the process's device memory is sampled from outside (gpu_memory.py)
while the trial runs; a peak above the cap does not fit either.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass

from ...runtime.backend import GIB
from ..gpu_memory import is_out_of_memory

ENGINES = ("gpuengine", "torch_eager", "torch_compile", "torch_graph")
MODES = ("train", "infer")
FITS, OOM, ERROR = "fits", "oom", "error"


@dataclass(frozen=True)
class TrialSpec:
    """Everything that defines a trial except the batch: the same for every trial of one search."""

    workload: str = "mlp"
    mode: str = "train"
    engine: str = "gpuengine"
    precision: str = "tf32"
    cap_gib: float | None = 6.0     # None: the whole device
    batch_pool: int = 2
    data: str = "resident"          # the engine's data placement: resident | streamed
    shape: str = "seed"             # the workload's shape: seed | smoke
    device: str = "cuda"

    def to_argv(self, batch: int) -> list[str]:
        argv = []
        for key, value in asdict(self).items():
            flag = "--" + key.replace("_", "-")
            argv += [flag, "full" if key == "cap_gib" and value is None else str(value)]
        return argv + ["--batch", str(batch)]

    @property
    def label(self) -> str:
        """The runner's name in tables: torch references by mode, the engine with its data placement."""
        if self.engine != "gpuengine" or self.mode == "infer":
            return self.engine
        return f"gpuengine[{self.data},pool={self.batch_pool}]" if self.data == "streamed" else "gpuengine[resident]"


def parse_cap(text: str) -> float | None:
    if text.strip().lower() == "full":
        return None
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):   # NaN fails here too
        raise argparse.ArgumentTypeError(f"{text!r} is not accepted; use a positive number of GiB, or 'full'")
    return value


def parse_args(argv=None) -> tuple[TrialSpec, int]:
    p = argparse.ArgumentParser(prog="python -m gpuengine.bench.maxbatch.trial", description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", default="mlp")
    p.add_argument("--mode", choices=MODES, default="train")
    p.add_argument("--engine", choices=ENGINES, default="gpuengine")
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--precision", default="tf32")
    p.add_argument("--cap-gib", type=parse_cap, default=6.0)
    p.add_argument("--batch-pool", type=int, default=2)
    p.add_argument("--data", choices=("resident", "streamed"), default="resident")
    p.add_argument("--shape", default="seed")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    a = p.parse_args(argv)
    if a.batch < 1:
        p.error(f"--batch {a.batch}: at least 1")
    spec = TrialSpec(a.workload, a.mode, a.engine, a.precision, a.cap_gib, a.batch_pool, a.data, a.shape, a.device)
    return spec, a.batch


def describe(exc: BaseException) -> str:
    return f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}".strip()


class DeviceSession:
    """The trial's view of the device: the cap in bytes, the allocator limit, the outside measurement."""

    def __init__(self, spec: TrialSpec):
        from .. import gpu_memory, nvml
        self.spec = spec
        self.framework = "cupy" if spec.engine == "gpuengine" else "torch"
        try:
            self.memory = gpu_memory.ProcessMemory.from_nvml()   # before our context exists
            self.no_nvml = None
        except nvml.NvmlUnavailable as exc:
            self.memory, self.no_nvml = None, str(exc)
        free, total = self._start_context()
        self.total_bytes = total
        if self.memory is not None:
            self.memory.bind(nvml.cuda_bus_id(self.framework))
        self.baseline_bytes = self.memory.used_bytes()[0] if self.memory is not None else total - free
        self.cap_bytes = total if spec.cap_gib is None else int(spec.cap_gib * GIB)
        if self.cap_bytes > total:
            raise ValueError(f"--cap-gib {spec.cap_gib} is more than the device's {total / GIB:.2f} GiB")
        self.limit_bytes = self.cap_bytes - self.baseline_bytes
        if self.limit_bytes <= 0:
            raise ValueError(f"the process holds {self.baseline_bytes} bytes after creating its CUDA context, "
                             f"already more than the cap of {self.cap_bytes}")
        if self.framework == "torch" and spec.cap_gib is not None:
            import torch
            torch.cuda.set_per_process_memory_fraction(self.limit_bytes / total)

    def _start_context(self) -> tuple[int, int]:
        """Create the CUDA context (cudaMemGetInfo does) and return (free, total) bytes."""
        if self.framework == "cupy":
            import cupy
            return cupy.cuda.runtime.memGetInfo()
        import torch
        return torch.cuda.mem_get_info()

    def sampler(self):
        from ..gpu_memory import PeakSampler
        return PeakSampler(self.memory) if self.memory is not None else contextlib.nullcontext()

    def allocator_peak_bytes(self) -> int:
        if self.framework == "cupy":
            import cupy
            return int(cupy.get_default_memory_pool().total_bytes())
        import torch
        return int(torch.cuda.max_memory_reserved())


def run_trial(spec: TrialSpec, batch: int) -> dict:
    from .workloads import get_workload
    workload = get_workload(spec.workload)
    if spec.device == "cpu":   # the plumbing without a device: nothing to cap or measure
        details = workload.run_trial(spec, batch, pool_limit_bytes=None)
        return {"status": FITS, "peak_bytes": None, "measured_by": "none (cpu)", "error": None, **details}
    session = DeviceSession(spec)
    pool_limit = None if spec.cap_gib is None else session.limit_bytes   # 'full': the device itself is the limit
    with session.sampler() as peak:
        details = workload.run_trial(spec, batch, pool_limit_bytes=pool_limit)
    allocator = session.allocator_peak_bytes()
    if session.memory is not None:
        peak_bytes, measured_by = peak.peak_bytes, peak.method
    else:
        peak_bytes, measured_by = session.baseline_bytes + allocator, f"allocator ({session.no_nvml})"
    result = {"status": FITS, "peak_bytes": peak_bytes, "measured_by": measured_by, "error": None,
              "cap_bytes": session.cap_bytes, "baseline_bytes": session.baseline_bytes,
              "allocator_bytes": allocator, **details}
    if peak_bytes > session.cap_bytes:
        result.update(status=OOM, error=f"the process's device memory reached {peak_bytes} bytes "
                                        f"({measured_by}), over the cap of {session.cap_bytes}")
    return result


def main(argv=None) -> dict:
    spec, batch = parse_args(argv)
    start = time.perf_counter()
    try:
        result = run_trial(spec, batch)
    except Exception as exc:   # the verdict is the product: every failure becomes a classified line
        status = OOM if is_out_of_memory(exc) else ERROR
        result = {"status": status, "peak_bytes": None, "measured_by": None, "error": describe(exc)}
    result.update(batch=batch, seconds=round(time.perf_counter() - start, 3))
    return result


if __name__ == "__main__":
    print(json.dumps(main()), flush=True)
    sys.stderr.flush()
    # Skip interpreter teardown: freeing a framework after an OOM can hang or crash, and the verdict is out.
    os._exit(0)
