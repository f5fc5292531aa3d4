"""On a GPU: bias gradients in the weight-gradient GEMM's epilogue (bias_grad=epilogue, cuBLASLt's BGRADB).

The GEMM writes dW = dy^T x and db = dy's column sums with every candidate algorithm, in place of the
gradient buffer's own bias slot, eagerly and in a captured replay, allocating nothing per run; the Transformer
and the CNN train with it as with the column-sum kernel, and two runs give the same bits.
"""
from __future__ import annotations

import numpy as np
import pytest

from gpuengine.config import EngineConfig
from gpuengine.ops import autotune
from gpuengine.ops.gemm import Gemm
from gpuengine.runtime.backend import Backend, gpu_visible
from gpuengine.runtime.capture import GraphCapturedStep
from gpuengine.runtime.precision import policy_for
from gpuengine.trainer import Trainer
from gpuengine.workloads import cnn, transformer

from ..gpu_checks import TOLERANCE, check_every_candidate, rel_err

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_visible(), reason="no CUDA GPU visible (CuPy missing or no device)")]

# (rows, units, fan_in): the seed Transformer's d_model projections at seq 128, its feed-forward, the seed MLP
SHAPES = {"transformer-proj": (2048, 512, 512), "transformer-ffn": (2048, 2048, 512), "mlp": (8000, 1000, 1000)}


def operands(backend, precision: str, rows: int, units: int, fan_in: int, seed: int):
    """dy and x in the compute dtype, float32 dW and a bias slot inside a larger gradient buffer (as the flat
    parameters hold it), and the float64 expectations."""
    rng = np.random.default_rng(seed)
    dy, x = rng.standard_normal((rows, units)), rng.standard_normal((rows, fan_in))
    dtype, xp = policy_for(precision).compute_dtype, backend.xp
    dy, x = dy.astype(dtype).astype(np.float64), x.astype(dtype).astype(np.float64)
    flat = xp.full(units * fan_in + 64 + units, np.nan, dtype=np.float32)
    grad_w, grad_b = flat[:units * fan_in].reshape(units, fan_in), flat[units * fan_in + 64:]
    return xp.asarray(dy.astype(dtype)), xp.asarray(x.astype(dtype)), grad_w, grad_b, dy.T @ x, dy.sum(axis=0)


@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=list(SHAPES))
def test_every_candidate_algorithm_writes_the_weight_and_bias_gradients(shape, precision, monkeypatch):
    backend = Backend("cuda")
    with backend.activate():
        dy, x, grad_w, grad_b, dw, db = operands(backend, precision, *SHAPES[shape], seed=len(shape))

    def reset():
        grad_w[...], grad_b[...] = np.nan, np.nan

    def check(name):
        assert rel_err(grad_w.get().astype(np.float64), dw) < TOLERANCE[precision], name
        assert rel_err(grad_b.get().astype(np.float64), db) < TOLERANCE[precision], name

    check_every_candidate(monkeypatch, backend, lambda: Gemm(backend, policy_for(precision), grad_w, dy.T, x,
                                                             a_sums=grad_b), reset, check)


def test_a_captured_replay_writes_the_sums_in_place_and_runs_allocate_nothing(monkeypatch):
    monkeypatch.setattr(autotune, "PLAN_CHOICES", autotune.PlanChoices())
    backend = Backend("cuda")
    pool = backend.xp.get_default_memory_pool()
    with backend.activate():
        dy, x, grad_w, grad_b, dw, db = operands(backend, "bf16", 2048, 512, 512, seed=5)
        gemm = Gemm(backend, policy_for("bf16"), grad_w, dy.T, x, a_sums=grad_b)
        gemm.run()   # eager: chooses, and nvmath takes its workspace
        backend.synchronize()
        used = pool.used_bytes()
        for _ in range(3):
            gemm.run()
        backend.synchronize()
        assert pool.used_bytes() == used
        step = GraphCapturedStep(backend, gemm.run, 2, {"grad_w": grad_w, "grad_b": grad_b, "dy": dy, "x": x})
        step.capture()
        grad_w[...], grad_b[...] = np.nan, np.nan
        step.launch()
        backend.synchronize()
    assert rel_err(grad_w.get().astype(np.float64), dw) < TOLERANCE["bf16"]
    assert rel_err(grad_b.get().astype(np.float64), db) < TOLERANCE["bf16"]
    gemm.free()


NETWORKS = {
    "transformer": lambda: (transformer.build_transformer(transformer.SMOKE_SHAPE.with_length(64)),
                            *transformer.transformer_data(128, transformer.SMOKE_SHAPE.with_length(64), seed=4)),
    "cnn": lambda: (cnn.build_cnn(), *cnn.cnn_data(1024, seed=6)),   # its dense head's bias (the MLP's is fused)
}


def losses(name: str, precision: str, bias_grad: str) -> list[float]:
    net, x, t = NETWORKS[name]()
    config = EngineConfig(precision=precision, cuda_graph=1, bias_grad=bias_grad)
    return Trainer(net, x, t, 128 if name == "cnn" else 16, config).train(3)


@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16"])
@pytest.mark.parametrize("name", NETWORKS)
def test_networks_train_alike_with_either_bias_gradient_and_repeat_bit_for_bit(name, precision, monkeypatch):
    monkeypatch.setattr(autotune, "PLAN_CHOICES", autotune.PlanChoices())
    epilogue, again = losses(name, precision, "epilogue"), losses(name, precision, "epilogue")
    assert epilogue == again
    assert epilogue[-1] < epilogue[0]
    np.testing.assert_allclose(epilogue, losses(name, precision, "sum"), rtol=1e-3 if precision == "fp32" else 0.02)
