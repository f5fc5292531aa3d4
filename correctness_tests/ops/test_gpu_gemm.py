"""On a GPU: a GEMM computes the same product by whichever cuBLASLt algorithm it chose, eager and replayed.

The first eager run times the heuristic's algorithms (ops/gemm.py) and records the choice; each algorithm
is then pinned in turn through the plan choices a gate run would preset and checked against float64.
"""
from __future__ import annotations

import numpy as np
import pytest

from gpuengine.ops import autotune
from gpuengine.ops.gemm import Gemm
from gpuengine.runtime.backend import Backend, gpu_visible
from gpuengine.runtime.capture import GraphCapturedStep
from gpuengine.runtime.precision import policy_for

from ..gpu_checks import TOLERANCE, check_every_candidate, rel_err

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_visible(), reason="no CUDA GPU visible (CuPy missing or no device)")]

SHAPES = {"mlp-infer-b512": (512, 1000, 1000), "mlp-dgrad-b8000": (8000, 1000, 1000), "skinny": (16, 256, 1024)}


def operands(backend, precision: str, m: int, k: int, n: int, seed: int):
    """a (m, k), b as the transposed view of a row-major (n, k) weight, a bias, and the float64 result."""
    rng = np.random.default_rng(seed)
    a, w, bias = rng.standard_normal((m, k)), rng.standard_normal((n, k)) / np.sqrt(k), rng.standard_normal(n)
    dtype = policy_for(precision).compute_dtype
    xp = backend.xp
    on_device = [xp.asarray(v.astype(dtype)) for v in (a, w, bias)]
    expected = a.astype(dtype).astype(np.float64) @ w.astype(dtype).astype(np.float64).T + bias.astype(dtype)
    return on_device, xp.full((m, n), np.nan, dtype=dtype), expected


@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=list(SHAPES))
def test_every_candidate_algorithm_computes_the_product(shape, precision, monkeypatch):
    backend = Backend("cuda")
    (a, w, bias), out, expected = operands(backend, precision, *SHAPES[shape], seed=len(shape))

    def reset():
        out[...] = np.nan

    def check(name):
        assert rel_err(out.get().astype(np.float64), expected) < TOLERANCE[precision], name

    gemm, choices = check_every_candidate(monkeypatch, backend, lambda: Gemm(backend, policy_for(precision), out, a,
                                                                             w.T, bias), reset, check)
    assert len(gemm._algorithms) == 1 or list(choices.tuned) == [autotune.key_text(gemm.key)]


def test_a_captured_replay_runs_the_chosen_algorithm(monkeypatch):
    """Captured as a training step is (runtime/capture.py), after the eager run that chose."""
    monkeypatch.setattr(autotune, "PLAN_CHOICES", autotune.PlanChoices())
    backend = Backend("cuda")
    (a, w, bias), out, expected = operands(backend, "tf32", 512, 1000, 1000, seed=3)
    with backend.activate():
        gemm = Gemm(backend, policy_for("tf32"), out, a, w.T, bias)
        gemm.run()   # eager: chooses
        step = GraphCapturedStep(backend, gemm.run, 2, {"out": out, "a": a, "w": w})
        step.capture()
        out[...] = np.nan
        step.launch()
        backend.synchronize()
    assert rel_err(out.get().astype(np.float64), expected) < TOLERANCE["tf32"]
    gemm.free()
