"""A GEMM that also writes its first operand's row sums (`Gemm(..., a_sums=)`, the bias_grad=epilogue toggle):
on the NumPy backend the sums and the product as NumPy has them, bad operands refused by name, and a network
trained with either bias gradient alike. The cuBLASLt epilogue itself is checked on a GPU in
correctness_tests/layers/test_gpu_bias_grad.py.
"""
from __future__ import annotations

import numpy as np
import pytest

from gpuengine.config import EngineConfig
from gpuengine.layers import Dense, Linear
from gpuengine.layers.base import BuildContext
from gpuengine.ops.gemm import Gemm, weight_gradients
from gpuengine.ops.reductions import ColumnSum
from gpuengine.runtime.backend import Backend
from gpuengine.runtime.precision import policy_for
from gpuengine.trainer import Trainer
from gpuengine.workloads import mlp, transformer

CPU = Backend("cpu")


def test_the_numpy_backend_writes_the_product_and_the_row_sums():
    rng = np.random.default_rng(0)
    dy, x = rng.standard_normal((12, 5)).astype(np.float32), rng.standard_normal((12, 7)).astype(np.float32)
    grad_w, grad_b = np.full((5, 7), np.nan, np.float32), np.full(5, np.nan, np.float32)
    Gemm(CPU, policy_for("fp32"), grad_w, dy.T, x, a_sums=grad_b).run()
    np.testing.assert_allclose(grad_w, dy.T @ x, rtol=1e-5)
    np.testing.assert_allclose(grad_b, dy.sum(axis=0), rtol=1e-5)


@pytest.mark.parametrize("epilogue", [False, True])
def test_weight_gradients_sum_the_bias_in_the_gemm_or_after_it(epilogue):
    dy, x = np.ones((4, 3), np.float32), np.ones((4, 2), np.float32)
    gemm, column_sum = weight_gradients(CPU, policy_for("fp32"), None, np.zeros((3, 2), np.float32),
                                        np.zeros(3, np.float32), dy, x, epilogue)
    assert (gemm.a_sums is not None) == epilogue and isinstance(column_sum, type(None) if epilogue else ColumnSum)
    gemm, column_sum = weight_gradients(CPU, policy_for("fp32"), None, np.zeros((3, 2), np.float32), None, dy, x,
                                        epilogue)
    assert gemm.a_sums is None and column_sum is None   # a fused consumer wrote db: nothing sums it again


@pytest.mark.parametrize("sums, problem", [
    (np.zeros(4, np.float32), r"a_sums \(4,\) float32 .*expected a contiguous \(3,\) vector"),
    (np.zeros(3, np.float16), r"a_sums \(3,\) float16 .*of the output's dtype float32"),
    (np.zeros(6, np.float32)[::2], r"strides \(8,\): expected a contiguous"),
])
def test_bad_sums_are_refused_by_name(sums, problem):
    with pytest.raises(ValueError, match=problem):
        Gemm(CPU, policy_for("fp32"), np.zeros((3, 2), np.float32), np.ones((3, 4), np.float32),
             np.ones((4, 2), np.float32), a_sums=sums)


def test_a_bias_and_sums_together_are_refused():
    with pytest.raises(ValueError, match="a bias or a_sums, not both"):
        Gemm(CPU, policy_for("fp32"), np.zeros((3, 2), np.float32), np.ones((3, 4), np.float32),
             np.ones((4, 2), np.float32), bias=np.zeros(2, np.float32), a_sums=np.zeros(3, np.float32))


NETWORKS = {
    "mlp": lambda: (mlp.build_mlp(mlp.SMOKE_SHAPE), *mlp.mlp_data(64, mlp.SMOKE_SHAPE, seed=1)),
    "transformer": lambda: (transformer.build_transformer(transformer.SMOKE_SHAPE),
                            *transformer.transformer_data(32, transformer.SMOKE_SHAPE, seed=2)),
}


@pytest.mark.parametrize("name", NETWORKS)
def test_either_bias_gradient_trains_the_same(name):
    runs = {}
    for bias_grad in ("sum", "epilogue"):
        net, x, t = NETWORKS[name]()
        runs[bias_grad] = Trainer(net, x, t, 16, EngineConfig(device="cpu", precision="fp32",
                                                               bias_grad=bias_grad)).train(3)
    assert runs["epilogue"][-1] < runs["epilogue"][0]
    np.testing.assert_allclose(runs["epilogue"], runs["sum"], rtol=1e-5)


@pytest.mark.parametrize("bias_grad, token_major, epilogue", [
    ("auto", True, True), ("auto", False, False), ("sum", True, False), ("sum", False, False),
    ("epilogue", True, True), ("epilogue", False, True)])
def test_the_toggle_picks_the_epilogue_by_layer_under_auto(bias_grad, token_major, epilogue):
    context = BuildContext(CPU, policy_for("fp32"), None, None, 16, bias_grad=bias_grad)
    assert context.bias_grad_in_epilogue(token_major) is epilogue


@pytest.mark.parametrize("name, layer_type, epilogue", [("transformer", Linear, True), ("mlp", Dense, False)])
def test_the_default_sums_token_layers_biases_in_the_gemm_and_dense_ones_after_it(name, layer_type, epilogue):
    net, x, t = NETWORKS[name]()
    trainer = Trainer(net, x, t, 16, EngineConfig(device="cpu", precision="fp32"))
    trainer.train(1)
    layers = [layer for layer in trainer.program.layers.values()
              if type(layer) is layer_type and getattr(layer, "_grad_w", None) is not None]
    assert layers
    for layer in layers:
        if getattr(layer, "bias_grad_by_reader", False):   # the LayerNorm above sums it (model/passes.py)
            assert layer._grad_w.a_sums is None and layer._grad_b is None
            continue
        assert (layer._grad_w.a_sums is not None) is epilogue
        assert isinstance(layer._grad_b, type(None) if epilogue else ColumnSum) or layer.bias_grad_fused
    assert any(getattr(layer, "bias_grad_by_reader", False) for layer in layers) is (name == "transformer")
