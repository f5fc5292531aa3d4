"""On a GPU: a ReLU after a Dense or Linear layer in that layer's GEMM epilogue (cuBLASLt's RELU_BIAS,
model/passes.py's relus_after_gemms).

Every candidate algorithm of the fused GEMM computes relu(a @ b + bias) against float64, and the Transformer
(whose feed-forward ReLUs fuse) trains with the fusion as without it, repeating bit for bit.
"""
from __future__ import annotations

import numpy as np
import pytest

from gpuengine.config import EngineConfig
from gpuengine.ops import autotune
from gpuengine.ops.gemm import Gemm
from gpuengine.runtime.backend import Backend, gpu_visible
from gpuengine.runtime.precision import policy_for
from gpuengine.trainer import Trainer
from gpuengine.workloads import transformer

from ..gpu_checks import TOLERANCE, check_every_candidate, rel_err

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_visible(), reason="no CUDA GPU visible (CuPy missing or no device)")]


@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16"])
def test_every_candidate_algorithm_applies_the_relu(precision, monkeypatch):
    backend = Backend("cuda")
    rng = np.random.default_rng(7)
    dtype, xp = policy_for(precision).compute_dtype, backend.xp
    x, w, bias = rng.standard_normal((2048, 512)), rng.standard_normal((2048, 512)) / 23, rng.standard_normal(2048)
    x, w, bias = (v.astype(dtype) for v in (x, w, bias))
    expected = np.maximum(x.astype(np.float64) @ w.astype(np.float64).T + bias.astype(np.float64), 0.0)
    x, w, bias, out = xp.asarray(x), xp.asarray(w), xp.asarray(bias), xp.full((2048, 2048), np.nan, dtype=dtype)

    def reset():
        out[...] = np.nan

    def check(name):
        assert rel_err(out.get().astype(np.float64), expected) < TOLERANCE[precision], name

    check_every_candidate(monkeypatch, backend, lambda: Gemm(backend, policy_for(precision), out, x, w.T, bias,
                                                             relu=True), reset, check)


def losses(precision: str, fuse: bool) -> list[float]:
    shape = transformer.SMOKE_SHAPE.with_length(64)
    net, (x, t) = transformer.build_transformer(shape), transformer.transformer_data(128, shape, seed=8)
    return Trainer(net, x, t, 16, EngineConfig(precision=precision, cuda_graph=1), fuse=fuse).train(3)


@pytest.mark.parametrize("precision", ["tf32", "bf16"])
def test_the_transformer_trains_alike_with_its_relus_in_the_epilogue_and_repeats(precision, monkeypatch):
    monkeypatch.setattr(autotune, "PLAN_CHOICES", autotune.PlanChoices())
    fused, again = losses(precision, True), losses(precision, True)
    assert fused == again and fused[-1] < fused[0]
    np.testing.assert_allclose(fused, losses(precision, False), rtol=0.02)
