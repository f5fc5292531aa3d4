"""Shared checks for the GPU-vs-NumPy tests: tolerances, relative error, steady-state allocation, every
candidate algorithm of a GEMM."""
from __future__ import annotations

import numpy as np

from gpuengine.config import EngineConfig
from gpuengine.ops import autotune
from gpuengine.ops.gemm import algorithm_name
from gpuengine.trainer import Trainer

# fp32 kernels vs NumPy float32: rounding only. tf32/bf16: tensor-core rounding.
TOLERANCE = {"fp32": 2e-5, "tf32": 5e-3, "bf16": 3e-2}


def rel_err(a, b) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def assert_close(gpu: dict, cpu: dict, tol: float):
    """Same keys, finite values, and each within `tol` relative error of the CPU result."""
    assert gpu.keys() == cpu.keys()
    for key in cpu:
        assert np.isfinite(gpu[key]).all(), key
        assert rel_err(gpu[key], cpu[key]) < tol, (key, rel_err(gpu[key], cpu[key]))


def losses_by_graph_group(net, x, t, batch: int, precision: str, groups, epochs: int, **toggles) -> dict:
    """Epoch losses of the same training run, eager (0) and with each number of steps per graph launch. Every
    trainer runs the kernels the first one chose: a timed choice (depthwise by cuDNN or direct kernels) that flips
    between trainers would change the rounding, and bf16 MobileNetV2's losses moved 1% on one such flip."""
    saved = autotune.PLAN_CHOICES
    choices = autotune.use_plan_choices({})
    losses = {}
    try:
        for g in groups:
            config = EngineConfig(precision=precision, cuda_graph=g, **toggles)
            losses[g] = Trainer(net, x, t, batch, config).train(epochs)
            chosen = {**choices.preset, **{key: way["plan"] for key, way in choices.tuned.items()}}
            choices = autotune.use_plan_choices(chosen)
    finally:
        autotune.PLAN_CHOICES = saved
    return losses


def assert_steady_state_allocates_nothing(net, x, t, batch: int, configs):
    """After warm-up, further epochs take no memory from the pool, for every config."""
    import cupy
    for config in configs:
        trainer = Trainer(net, x, t, batch, config)
        trainer.train(1)
        pool = cupy.get_default_memory_pool()
        before = pool.used_bytes()
        trainer.run_epochs(3)
        trainer.synchronize()
        assert pool.used_bytes() == before, config.describe()


def check_every_candidate(monkeypatch, backend, build, reset, check):
    """A GEMM from build() run with the algorithm its first run chooses, then with each candidate pinned in turn
    through the plan choices a gate run would preset; reset() refills its outputs (NaN) before each pinned run,
    check(name) judges them after it ("chosen" first). Returns the first GEMM (freed) and the plan choices its
    run recorded."""
    choices = autotune.PlanChoices()
    monkeypatch.setattr(autotune, "PLAN_CHOICES", choices)
    with backend.activate():
        gemm = build()
        gemm.run()
        backend.synchronize()
    check("chosen")
    for name in [algorithm_name(algorithm) for algorithm in gemm._algorithms]:
        monkeypatch.setattr(autotune, "PLAN_CHOICES", autotune.PlanChoices({autotune.key_text(gemm.key): name}))
        reset()
        with backend.activate():
            pinned = build()
            pinned.run()
            backend.synchronize()
        check(name)
        pinned.free()
    gemm.free()
    return gemm, choices
