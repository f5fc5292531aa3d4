"""Gradient checks of every op on the NumPy backend in float64 (see gradient_check.py).

Layers: Dense and the activations. Losses: MSE and the fused tanh -> Dense(1) ->
MSE head. Reductions: the column sum behind every bias gradient. Networks: the
whole MLP, fused and unfused, which must also agree with each other. The first
tests show the checker itself fails on a wrong gradient, so a pass means something.
"""
from __future__ import annotations

import numpy as np
import pytest

from gpuengine.layers import Dense, ReLU, Tanh
from gpuengine.layers.activations import Activation
from gpuengine.losses import MSELoss
from gpuengine.losses.fused_head import TanhLinearMSEHead
from gpuengine.model.network import Sequential
from gpuengine.model.program import TrainingProgram
from gpuengine.model.passes import tanh_linear_mse_head
from gpuengine.ops.reductions import ColumnSum
from gpuengine.runtime.backend import Backend
from gpuengine.runtime.memory import Allocator
from gpuengine.runtime.params import ParamSpec
from gpuengine.config import EngineConfig
from gpuengine.trainer import Trainer
from gpuengine.workloads.mlp import MLPShape, build_mlp, mlp_data

from ..gradient_check import assert_not_trivial, check_backward, directional_check, random_weights
from ..layer_harness import _step_state, make_context, run_layer, run_loss, run_network

BATCH, WIDTH = 11, 7


def inputs(seed: int, shape=(BATCH, WIDTH)) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape)


def away_from_zero(seed: int, shape=(BATCH, WIDTH), margin: float = 0.1) -> np.ndarray:
    """Inputs at least `margin` from ReLU's kink, half of them negative."""
    x = inputs(seed, shape)
    return np.sign(x) * (margin + np.abs(x))


# -- the checker can fail --------------------------------------------------------------

class MisscaledTanh(Activation):
    """tanh whose backward is 0.01% too large."""

    def __init__(self):
        super().__init__("tanh", "misscaled")

    def backward(self):
        super().backward()
        self.dx *= 1.0001


def test_checker_catches_a_slightly_wrong_input_gradient():
    with pytest.raises(AssertionError, match="finite difference"):
        check_backward(MisscaledTanh(), inputs(0))


def test_checker_catches_a_missing_bias_gradient():
    dense = Dense(3, "dense")
    dense.bias_grad_fused = True   # claims a fused consumer writes db: nobody does, db stays 0
    with pytest.raises(AssertionError, match="finite difference"):
        check_backward(dense, inputs(1))


# -- layers ----------------------------------------------------------------------------

@pytest.mark.parametrize("needs_input_grad", [True, False])
@pytest.mark.parametrize("units", [1, 5])
def test_dense(units, needs_input_grad):
    pairs = check_backward(Dense(units, "dense"), inputs(units), needs_input_grad=needs_input_grad, seed=units)
    assert_not_trivial(pairs)


def test_dense_without_input_grad_still_makes_every_parameter_gradient():
    x, dy = inputs(2), inputs(3, (BATCH, 4))
    w = random_weights(Dense(4, "dense").param_specs((WIDTH,)), np.random.default_rng(4))
    both = run_layer(Dense(4, "dense"), x, dy, weights=w, needs_input_grad=True)
    params_only = run_layer(Dense(4, "dense"), x, dy, weights=w, needs_input_grad=False)
    assert "dx" not in params_only
    for name in ("grad:dense.weight", "grad:dense.bias"):
        np.testing.assert_array_equal(params_only[name], both[name])


def test_tanh():
    assert_not_trivial(check_backward(Tanh("act"), inputs(5)))


def test_relu_away_from_its_kink():
    x = away_from_zero(6)
    assert (x < 0).any() and (x > 0).any()
    assert_not_trivial(check_backward(ReLU("act"), x))


def test_relu_passes_gradient_only_where_positive():
    x, dy = away_from_zero(7), inputs(8)
    dx = run_layer(ReLU("act"), x, dy)["dx"]
    np.testing.assert_array_equal(dx, np.where(x > 0, dy, 0.0))


# -- losses ----------------------------------------------------------------------------

@pytest.mark.parametrize("outputs", [1, 3])
def test_mse(outputs):
    y, t = inputs(9, (BATCH, outputs)), inputs(10, (BATCH, outputs))
    assert_not_trivial(check_backward(MSELoss(), y, t))


def test_mse_value_is_the_mean_square():
    y, t = inputs(11, (BATCH, 3)), inputs(12, (BATCH, 3)).astype(np.float32)
    # rtol: the 1/n scale is a float32 constant, also under fp64
    np.testing.assert_allclose(run_loss(MSELoss(), y, t)["loss"], ((y - t) ** 2).mean(), rtol=1e-7)


def head_specs(hidden: int) -> list[ParamSpec]:
    return [ParamSpec("d1.bias", (hidden,), "zeros"), ParamSpec("d2.weight", (1, hidden), "glorot", hidden, 1),
            ParamSpec("d2.bias", (1,), "zeros")]


@pytest.mark.parametrize("hidden", [1, 9])
def test_fused_head_loss_gradients(hidden):
    z, t = inputs(13, (BATCH, hidden)), inputs(14, (BATCH, 1))
    pairs = check_backward(TanhLinearMSEHead("d2", "d1"), z, t, specs=head_specs(hidden),
                           wrt=("d2.weight", "d2.bias"), seed=hidden)
    assert_not_trivial(pairs)


def test_fused_head_bias_gradient_of_the_layer_below_is_the_row_sum_of_dz():
    hidden = 9
    z, t = inputs(15, (BATCH, hidden)), inputs(16, (BATCH, 1))
    specs = head_specs(hidden)
    result = run_loss(TanhLinearMSEHead("d2", "d1"), z, t, specs=specs,
                      weights=random_weights(specs, np.random.default_rng(17)))
    assert np.abs(result["dy"]).max() > 1e-3
    np.testing.assert_allclose(result["grad:d1.bias"], result["dy"].sum(axis=0), rtol=1e-12, atol=1e-15)


def test_fused_head_on_batch_innermost_z_hands_on_the_same_gradients_so():
    hidden = 9
    z, t = inputs(15, (BATCH, hidden)), inputs(16, (BATCH, 1))
    specs = head_specs(hidden)
    weights = random_weights(specs, np.random.default_rng(17))
    ctx = make_context("cpu", "fp64", BATCH, specs, weights)
    head = TanhLinearMSEHead("d2", "d1", batch_innermost=True)
    dz = head.build(ctx, np.ascontiguousarray(z.T).T, t.astype(np.float32), _step_state(ctx))
    assert head.batch_innermost and dz.strides == (8, 8 * BATCH)   # over z: a (B, H) view of an (H, B) buffer
    head.forward_backward()
    assert np.abs(weights["d1.bias"]).max() > 0.1   # the head adds the bias batch-innermost z comes without
    plain = run_loss(TanhLinearMSEHead("d2", "d1"), z + weights["d1.bias"], t, specs=specs, weights=weights)
    np.testing.assert_allclose(dz, plain["dy"], rtol=1e-12, atol=1e-15)   # NumPy's sums may run in another order
    for key, value in ctx.params.grads_dict().items():
        np.testing.assert_allclose(value, plain[f"grad:{key}"], rtol=1e-12, atol=1e-15, err_msg=key)


def test_fused_head_takes_the_layout_it_is_told_and_refuses_the_other():
    # at H = 1 a row-major (B, 1) z has strides (itemsize, itemsize), a (1, B) buffer's view (itemsize, B * itemsize)
    specs = head_specs(1)
    ctx = make_context("cpu", "fp64", BATCH, specs, random_weights(specs, np.random.default_rng(18)))
    rows_z, innermost_z = inputs(19, (BATCH, 1)), np.zeros((1, BATCH)).T   # a fresh (1, B) buffer's view
    innermost_z[...] = rows_z
    t = inputs(20, (BATCH, 1)).astype(np.float32)
    assert not _built(TanhLinearMSEHead("d2", "d1"), ctx, rows_z, t).batch_innermost
    assert _built(TanhLinearMSEHead("d2", "d1", batch_innermost=True), ctx, innermost_z, t).batch_innermost
    for batch_innermost, z in ((False, innermost_z), (True, rows_z)):
        with pytest.raises(ValueError, match="fused head: z .* has strides"):
            _built(TanhLinearMSEHead("d2", "d1", batch_innermost), ctx, z, t)


def _built(head, ctx, z, t):
    head.build(ctx, z, t, _step_state(ctx))
    return head


# -- reductions ------------------------------------------------------------------------

@pytest.mark.parametrize("rows", [1, 63, 64, 130])
def test_column_sum_is_the_gradient_of_a_bias_broadcast(rows):
    """f(b) = sum((X + b) * dy) has gradient sum_rows(dy): what ColumnSum computes for every bias."""
    cols = 5
    rng = np.random.default_rng(rows)
    x, dy, b = rng.standard_normal((rows, cols)), rng.standard_normal((rows, cols)), rng.standard_normal(cols)
    backend = Backend("cpu")
    db = np.zeros(cols)
    ColumnSum(backend, Allocator(backend), dy, db, rows_per_chunk=64).run()
    objective = lambda p: float(((x + p["b"]) * dy).sum())
    assert_not_trivial(directional_check(objective, {"b": b}, {"b": db}))


# -- whole networks --------------------------------------------------------------------

MLP = MLPShape(inputs=6, hidden=9)


def mlp_case(seed: int = 0):
    net = build_mlp(MLP)
    rng = np.random.default_rng(seed)
    x, t = rng.standard_normal((BATCH, MLP.inputs)), rng.standard_normal((BATCH, 1))
    return net, x, t, random_weights(net.param_specs(), rng)


@pytest.mark.parametrize("fuse", [True, False])
def test_mlp(fuse):
    net, x, t, weights = mlp_case()
    assert run_network(net, x, t, weights=weights, fuse=fuse)["fused"] is fuse
    assert_not_trivial(check_backward(net, x, t, weights, fuse=fuse, rtol=1e-6))


def test_mlp_fused_and_unfused_give_the_same_loss_and_gradients():
    net, x, t, weights = mlp_case(1)
    fused = run_network(net, x, t, weights=weights, fuse=True)
    unfused = run_network(net, x, t, weights=weights, fuse=False)
    assert fused.pop("fused") and not unfused.pop("fused")
    assert fused.keys() == unfused.keys()
    for key in fused:
        np.testing.assert_allclose(fused[key], unfused[key], rtol=1e-12, atol=1e-15, err_msg=key)


def test_mlp_in_tf32_takes_its_weight_gradient_batch_innermost_and_agrees_with_fp32():
    net, x, t, weights = mlp_case(2)
    ctx = make_context("cpu", "tf32", BATCH, net.param_specs(), weights)
    program = TrainingProgram(net, ctx, x.astype(np.float32), t.astype(np.float32), _step_state(ctx))
    dense = program.layers[net.nodes[0].name]
    assert program.loss.batch_innermost and dense.batch_innermost and dense.out.strides[0] == 4
    tf32, fp32 = (run_network(net, x, t, weights=weights, precision=p) for p in ("tf32", "fp32"))
    assert tf32.keys() == fp32.keys()
    for key in fp32:
        np.testing.assert_allclose(tf32[key], fp32[key], rtol=1e-5, atol=1e-7, err_msg=key)   # float32 sums, reordered


@pytest.mark.parametrize("samples", [64, 16], ids=["gathered", "full-batch"])
def test_tf32_mlp_trains_as_fp32_does_on_the_datas_batch_innermost_copy(samples):
    shape = MLPShape(inputs=12, hidden=16)
    x, t = mlp_data(samples, shape)
    trainers = {p: Trainer(build_mlp(shape), x, t, 16, EngineConfig(device="cpu", precision=p))
                for p in ("tf32", "fp32")}
    losses = {p: trainer.train(5) for p, trainer in trainers.items()}
    assert trainers["tf32"].program.layers[trainers["tf32"].program.nodes[0].name]._x_copy is None   # the data's
    assert losses["tf32"][-1] < losses["tf32"][0]
    np.testing.assert_allclose(losses["tf32"], losses["fp32"], rtol=1e-5)   # float32 sums, reordered


def test_relu_network_with_several_outputs():
    net = Sequential([Dense(8), ReLU(), Dense(3)], MSELoss(), (WIDTH,))
    rng = np.random.default_rng(2)
    x, t = rng.standard_normal((BATCH, WIDTH)), rng.standard_normal((BATCH, 3))
    weights = random_weights(net.param_specs(), rng)
    assert tanh_linear_mse_head(net) is None
    assert_not_trivial(check_backward(net, x, t, weights))
