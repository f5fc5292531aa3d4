"""On a GPU: the fusions a program makes of a Transformer (model/passes.py). A ReLU after a Dense or Linear
layer runs in that layer's GEMM epilogue (cuBLASLt's RELU_BIAS), a residual Add read only by a LayerNorm is
summed by the LayerNorm's forward kernel, and the two gradients of a LayerNorm's output by its backward kernel,
which also sums the bias gradient of a Linear layer only that Add reads. A token embedding adds the positional
encoding above it.

Every candidate algorithm of the fused GEMM computes relu(a @ b + bias) against float64; the fused LayerNorm
writes the sum and normalises it as NumPy does; the Transformer trains with both fusions as without them,
repeating bit for bit.
"""
from __future__ import annotations

import numpy as np
import pytest

from gpuengine.config import EngineConfig
from gpuengine.losses import MSELoss
from gpuengine.model.network import INPUT, NetworkBuilder
from gpuengine.layers import Add, LayerNorm, Linear, SinusoidalPositionalEncoding, Tanh, TokenEmbedding
from gpuengine.layers.merge import GradientSum
from gpuengine.ops import autotune
from gpuengine.ops.gemm import Gemm
from gpuengine.runtime.backend import Backend, gpu_visible
from gpuengine.runtime.precision import policy_for
from gpuengine.trainer import Trainer
from gpuengine.workloads import transformer

from ..gpu_checks import TOLERANCE, check_every_candidate, rel_err
from ..layer_harness import make_context, run_network

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


@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16"])
def test_a_layernorm_over_a_residual_sum_writes_the_sum_and_normalises_it(precision):
    rng = np.random.default_rng(9)
    dtype = policy_for(precision).compute_dtype
    r1, r2 = (rng.standard_normal((64, 32, 256)).astype(dtype) for _ in range(2))
    add, norm = Add(name="res"), LayerNorm(name="norm")
    ctx = make_context("cuda", precision, 64, norm.param_specs((32, 256)), None)
    xp = ctx.backend.xp
    with ctx.backend.activate():
        s = add.build_forward(ctx, xp.asarray(r1), xp.asarray(r2))
        add.summed_by_reader, norm.residual = True, add
        y = norm.build_forward(ctx, s)
        add.forward()   # summed by the LayerNorm: nothing runs
        norm.forward()
        ctx.backend.synchronize()
    summed = (r1.astype(np.float32) + r2.astype(np.float32)).astype(dtype)
    np.testing.assert_array_equal(s.get().astype(np.float32), summed.astype(np.float32))
    x = summed.astype(np.float64)
    expected = (x - x.mean(axis=-1, keepdims=True)) / np.sqrt(x.var(axis=-1, keepdims=True) + 1e-5)
    assert rel_err(y.get().astype(np.float64), expected) < TOLERANCE[precision]


@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16"])
def test_a_layernorm_adds_its_output_gradients_as_their_sum_would(precision):
    """dy's two parts added in the one-launch backward, rounded as add2 rounds them: dx, dgamma and dbeta are the
    bits of GradientSum's add2 followed by the one-launch backward of its sum."""
    rng = np.random.default_rng(10)
    dtype = policy_for(precision).compute_dtype
    x, dy1, dy2 = (rng.standard_normal((64, 32, 256)).astype(dtype) for _ in range(3))
    ctx = make_context("cuda", precision, 64, LayerNorm(name="norm").param_specs((32, 256)), None)
    xp, results = ctx.backend.xp, []
    with ctx.backend.activate():
        x, parts = xp.asarray(x), [xp.asarray(dy1), xp.asarray(dy2)]
        for reads_parts in (True, False):
            norm = LayerNorm(name="norm")
            norm.build_forward(ctx, x)
            summed = GradientSum(ctx, parts)
            norm.gradient_sum = summed if reads_parts else None
            dx = norm.build_backward(ctx, summed.out, True)
            assert summed.summed_by_reader == reads_parts and norm.fused is not None
            norm.forward()
            summed.run()
            norm.backward()
            ctx.backend.synchronize()
            results.append([dx.get(), norm.dgamma.get(), norm.dbeta.get()])
    for fused, unfused in zip(*results):
        np.testing.assert_array_equal(fused, unfused)


@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16"])
def test_an_embedding_adds_the_positional_table_as_the_encoding_would(precision):
    """The embedding's rows rounded, then the table added and rounded again: the unfused pair's bits."""
    rng = np.random.default_rng(12)
    ids = rng.integers(0, 256, (48, 200)).astype(np.float32)
    weights = {"e.weight": rng.standard_normal((256, 256)) * 0.06}
    ctx = make_context("cuda", precision, 48, TokenEmbedding(256, 256, 40, 160, name="e").param_specs((200,)),
                       weights)
    outputs = []
    with ctx.backend.activate():
        x = ctx.backend.xp.asarray(ids.astype(ctx.policy.compute_dtype))
        for fused in (True, False):
            embed, positions = TokenEmbedding(256, 256, 40, 160, name="e"), SinusoidalPositionalEncoding(name="pe")
            embed.adds_positions = positions.added_by_input = fused
            y = positions.build_forward(ctx, embed.build_forward(ctx, x))
            assert (y is embed.out) == fused
            embed.forward()
            positions.forward()
            ctx.backend.synchronize()
            outputs.append(y.get())
    np.testing.assert_array_equal(outputs[0], outputs[1])
    assert np.abs(outputs[0].astype(np.float32)).max() > 0


def losses(precision: str, fuse: bool) -> list[float]:
    shape = transformer.SMOKE_SHAPE.with_length(64)
    net, (x, t) = transformer.build_transformer(shape), transformer.transformer_data(128, shape, seed=8)
    return Trainer(net, x, t, 16, EngineConfig(precision=precision, cuda_graph=1), fuse=fuse).train(3)


@pytest.mark.parametrize("precision", ["tf32", "bf16"])
def test_the_transformer_trains_alike_fused_and_unfused_and_repeats(precision, monkeypatch):
    monkeypatch.setattr(autotune, "PLAN_CHOICES", autotune.PlanChoices())
    fused, again = losses(precision, True), losses(precision, True)
    assert fused == again and fused[-1] < fused[0]
    np.testing.assert_allclose(fused, losses(precision, False), rtol=0.02)


def _residual_block(dim: int):
    """Linear -> Add(x, .) -> LayerNorm -> tanh over (32, dim) samples: the Linear's bias gradient is dx's."""
    b = NetworkBuilder((32, dim))
    norm = b.add(LayerNorm(), b.add(Add(), INPUT, b.add(Linear(dim), INPUT, name="linear"), name="res"),
                 name="norm")
    return b.network(MSELoss(), b.add(Tanh(), norm, name="out"))


@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16"])
@pytest.mark.parametrize("dim", [256, 640], ids=["one-launch", "column-sum"])
def test_a_layernorm_sums_the_bias_gradient_of_the_linear_below_its_add(dim, precision):
    """256 features: a third column sum in the one-launch backward; 640: a ColumnSum of dx after it. Both against
    the unfused program, whose Linear sums its own bias gradient; every other gradient alike too."""
    rng = np.random.default_rng(11)
    x, t = rng.standard_normal((64, 32, dim)), rng.standard_normal((64, 32, dim))
    weights = {"linear.weight": rng.standard_normal((dim, dim)) / np.sqrt(dim), "linear.bias": rng.standard_normal(dim),
               "norm.weight": 1 + 0.1 * rng.standard_normal(dim), "norm.bias": 0.1 * rng.standard_normal(dim)}
    fused, unfused = (run_network(_residual_block(dim), x, t, device="cuda", precision=precision, weights=weights,
                                  fuse=fuse) for fuse in (True, False))
    for key in ("grad:linear.bias", "grad:linear.weight", "grad:norm.weight", "grad:norm.bias"):
        assert rel_err(fused[key], unfused[key]) < TOLERANCE[precision], key
    assert np.abs(fused["grad:linear.bias"]).max() > 1e-6   # a gradient, not the zeros nobody wrote
