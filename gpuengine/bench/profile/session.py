"""One profile session: the engine, then each PyTorch reference, built, warmed, profiled and let go in turn.

Runners run one after another, never interleaved, so the profiler's events of
a replay are one runner's alone, and a runner's memory is given back before the
next is built. Every runner starts from the engine's initial weights, as in
the perf tests. The engine starts from the cuDNN plans the gate keeps for
this GPU kind (bench/cudnn_plans.py, read here, never written), so it runs
the plans of the stored timings rather than a fresh autotuning's. A
reference this machine cannot run (`ReferenceUnavailable`: no torchvision
for the zoo, say) or one that fails is recorded as such, with why; the
engine's failure stops the session.
"""
from __future__ import annotations

import gc
from pathlib import Path
from typing import Callable

from ..json_files import JsonFileError
from .capture import is_device_work, profile_runner
from .record import ENGINE, FAILED, UNAVAILABLE, ProfileCase
from .workloads import ProfileWorkload


def reuse_cudnn_plans(store: Path, tier_name: str) -> str:
    """Start the engine's cuDNN graphs from the plans stored for this GPU kind; what was done, for the record."""
    from ...ops import autotune
    from .. import cudnn_plans
    path = Path(store) / tier_name / cudnn_plans.PLAN_FILE
    try:
        stored = cudnn_plans.load(path, cudnn_plans.current_stack())
    except (ImportError, JsonFileError) as exc:
        return f"autotuned afresh ({exc})"
    if stored.set_aside:
        return f"autotuned afresh: {path} {stored.set_aside}"
    if not stored.plans:
        return f"autotuned afresh: no stored plans in {path}"
    autotune.use_plan_choices(stored.presets())
    return f"{len(stored.plans)} stored choices from {path} (graphs without one autotuned)"


def _let_go(device: str) -> None:
    """Give a finished runner's device memory back before the next runner allocates."""
    gc.collect()
    if device == "cuda":
        import torch
        torch.cuda.empty_cache()


def measure(case: ProfileCase, workload: ProfileWorkload, references: list[str], replays: int,
            log: Callable[[str], None], device: str = "cuda", smoke: bool = False, activities=None,
            keep: Callable = is_device_work) -> dict[str, dict]:
    """{runner: its profile (capture.summarise) or {"unavailable": why, "failed": bool}}, the engine first.

    `device`, `smoke`, `activities` and `keep` let a CPU test run the plumbing (CPU events of torch runners)."""
    from ...reference.torch_common import ReferenceUnavailable
    steps = case.steps_per_replay
    engine = workload.engine_runner(case, device, smoke)
    weights, buffers = engine.state_dict(), engine.buffers_dict()   # before warm-up trains them
    log(f"profile: {ENGINE}: warm-up and capture, then {replays} replays of {steps} steps")
    runners = {ENGINE: profile_runner(engine, replays, steps, activities, keep)}
    del engine
    _let_go(device)
    for mode in references:
        log(f"profile: {mode}: build, warm-up and capture, then {replays} replays of {steps} steps")
        try:
            runner = workload.reference_runner(mode, case, weights, buffers, device, smoke)
            runners[mode] = profile_runner(runner, replays, steps, activities, keep)
        except ReferenceUnavailable as exc:
            runners[mode] = {UNAVAILABLE: str(exc), FAILED: False}
        except Exception as exc:   # noqa: BLE001  one reference failing must not lose the others' profiles
            runners[mode] = {UNAVAILABLE: f"{type(exc).__name__}: {exc}", FAILED: True}
        if UNAVAILABLE in runners[mode]:
            log(f"profile: {mode}: not profiled: {runners[mode][UNAVAILABLE]}")
        runner = None   # the last reference to its model and graphs, so that _let_go can free them
        _let_go(device)
    return runners
