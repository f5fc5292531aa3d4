"""The perf gate's cuDNN plan choices, kept with its baselines in `baselines_store/<tier>/cudnn_plans.json`.

The engine autotunes every cuDNN graph on its first run (ops/cudnn.py), and
every GEMM's cuBLASLt algorithm and every depthwise convolution's way
(ops/autotune.py): it times the candidates' kernels and keeps the heuristic's
first unless another is clearly faster. Done afresh in every process, that
costs minutes of set-up for ResNet-50 and the zoo. The gate therefore keeps
each choice by name beside its stored runs, so a later run of the same GPU
kind builds and runs the very plans its baseline ran without timing them,
and a difference between runs is the code's, not the autotuner's (before
choices were timed by their kernels, two autotunings of ResNet-50 kept
different plans for 53 of 96 graphs and trained 1.5% apart). The file is
tied to the stack that chose the plans (cuDNN version, frontend version, GPU
name, and the lock the gate installed the stack from, gpuengine/bench/stack_lock.py):
on another stack it is set aside, saying what changed, and every graph is autotuned again.

    {"format": 1, "stack": {"cudnn": "91900", "cudnn_frontend": "1.22.1", "gpu": "NVIDIA H100 80GB HBM3",
                            "stack_lock": "cuda13 lock 1a2b3c4d5e6f"},
     "plans": {"<graph key>": {"plan": "<engine tag>", "ms": 0.0123}, ...}}
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from . import stack_lock
from .json_files import JsonFileError, load_json, write_json

PLAN_FILE = "cudnn_plans.json"
FORMAT = 1
LOCK_KEY = "stack_lock"
HAND_OFF_ENV = "GATE_PLANS_OUT"   # a spread run's per-GPU session: where its new choices go instead of the file


def current_stack() -> dict[str, str]:
    """The facts a plan choice depends on, read from the live cuDNN and GPU."""
    import cudnn
    import cupy
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return {"cudnn": str(cudnn.backend_version()), "cudnn_frontend": str(cudnn.__version__), "gpu": name,
            LOCK_KEY: stack_lock.lock_identity(stack_lock.current_record())}


@dataclass
class PlanFile:
    path: Path
    stack: dict[str, str]
    plans: dict[str, dict] = field(default_factory=dict)   # graph key text -> {"plan": name, "ms": time}
    set_aside: str | None = None   # why the stored choices were not used (another stack)

    def presets(self) -> dict[str, str]:
        return {key: entry["plan"] for key, entry in self.plans.items()}

    def save(self, tuned: dict[str, dict]) -> int:
        """Merge this run's new choices in and write the file; returns how many were new or changed."""
        if not tuned:
            return 0
        self.plans = {**self.plans, **tuned}
        write_json(self.path, {"format": FORMAT, "stack": self.stack, "plans": dict(sorted(self.plans.items()))})
        return len(tuned)


def hand_off(path: Path, kept: PlanFile, tuned: dict[str, dict]) -> int:
    """Write a session's new choices to `path` for another process to keep (a spread run's per-GPU sessions:
    two writers of one file would drop each other's); returns how many."""
    write_json(Path(path), {"format": FORMAT, "file": str(kept.path), "stack": kept.stack, "plans": tuned})
    return len(tuned)


def keep_handed(path: Path) -> tuple[Path, int]:
    """Merge the choices hand_off wrote to `path` into the file they belong to; returns it and how many were new."""
    handed = load_json(Path(path))
    if not (isinstance(handed, dict) and handed.get("format") == FORMAT and isinstance(handed.get("file"), str)
            and isinstance(handed.get("stack"), dict) and isinstance(handed.get("plans"), dict)):
        raise JsonFileError(f"{path}: not a hand-off of cuDNN plan choices of format {FORMAT} "
                            "(an object with format, file, stack, plans)")
    kept = load(Path(handed["file"]), handed["stack"])
    return kept.path, kept.save(handed["plans"])


def load(path: Path, stack: dict[str, str]) -> PlanFile:
    """The stored choices for `stack`; none where the file is missing or was made on another stack."""
    path = Path(path)
    if not path.exists():
        return PlanFile(path, stack)
    content = load_json(path)
    if not isinstance(content, dict) or content.get("format") != FORMAT:
        raise JsonFileError(f"{path}: not a cuDNN plan file of format {FORMAT} (an object with format, stack, plans)")
    plans, stored_stack = content.get("plans"), content.get("stack")
    if not isinstance(plans, dict) or not isinstance(stored_stack, dict):
        raise JsonFileError(f"{path}: 'stack' and 'plans' must be objects")
    for key, entry in plans.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("plan"), str):
            raise JsonFileError(f"{path}: plans[{key!r}] must be an object with a 'plan' name")
    if stored_stack != stack:
        changed = sorted(k for k in stack.keys() | stored_stack.keys() if stack.get(k) != stored_stack.get(k))
        why = ", ".join(_change(k, stored_stack.get(k), stack.get(k)) for k in changed)
        return PlanFile(path, stack, set_aside=f"made on another stack ({why}): every graph is autotuned again")
    return PlanFile(path, stack, plans)


def _change(key: str, old, new) -> str:
    if key == LOCK_KEY:   # plans kept before locks existed name none
        return f"lock: {old or 'no lock'} -> {new or 'no lock'}"
    return f"{key} {old} -> {new}"
