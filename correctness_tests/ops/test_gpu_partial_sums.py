"""On a GPU: the one launch that finishes a training program's partial column sums (gpuengine/ops/partial_sums.py)
adds each column's rows as float64 does, the same bits every run, eager and replayed; networks whose LayerNorm,
convolution and Dense sums it finishes have the gradients of each kernel finishing its own (its last block's
ticket)."""
from __future__ import annotations

import numpy as np
import pytest

from gpuengine.layers import Add, Conv2D, Dense, Flatten, LayerNorm, Linear, ReLU, Tanh
from gpuengine.losses import MSELoss, SoftmaxCrossEntropy
from gpuengine.model import program
from gpuengine.model.network import INPUT, NetworkBuilder, Sequential
from gpuengine.ops.partial_sums import PartialSums
from gpuengine.runtime.backend import Backend, gpu_visible
from gpuengine.runtime.capture import GraphCapturedStep
from gpuengine.runtime.memory import Allocator

from ..gpu_checks import rel_err
from ..gradient_check import random_weights
from ..layer_harness import run_network

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_visible(), reason="no CUDA GPU visible (CuPy missing or no device)")]

# (blocks, columns of partials, [(first column, count)]): one block, runs of a whole warp and a ragged one, more
# blocks than the 16 warps share evenly, a LayerNorm's three sums of 256 features over 132 blocks
SHAPES = [(1, 8, [(0, 8)]), (5, 70, [(0, 33), (33, 37)]), (17, 64, [(3, 1), (32, 32)]),
          (132, 768, [(0, 256), (256, 256), (512, 256)]), (200, 40, [(0, 40)])]


def filled(backend, shapes):
    """(sums, [(destination, expected float64)]): partials of `shapes`, a step each, destinations of nan."""
    xp, rng = backend.xp, np.random.default_rng(5)
    sums, out = PartialSums(backend, Allocator(backend)), []
    with backend.activate():
        for step, (blocks, cols, segments) in enumerate(shapes):
            values = rng.standard_normal((blocks, cols)).astype(np.float32)
            partials, dsts = xp.asarray(values), []
            for first, count in segments:
                dst = xp.full(count, np.nan, np.float32)
                dsts.append((first, dst))
                out.append((dst, values[:, first:first + count].astype(np.float64).sum(axis=0)))
            sums.step = step
            sums.add(partials, dsts)
        sums.build()
    return sums, out


def test_one_launch_adds_every_sum_as_float64_does_and_the_same_bits_again():
    backend = Backend("cuda")
    sums, out = filled(backend, SHAPES)
    _, grid, _ = sums._launches[None]
    assert grid == (sum(-(-count // 32) for _, _, segments in SHAPES for _, count in segments),)
    with backend.activate():
        sums.run()
        backend.synchronize()
    first = [backend.to_host(dst) for dst, _ in out]
    for got, (_, expected) in zip(first, out):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)
    with backend.activate():
        for dst, _ in out:
            dst.fill(np.nan)
        sums.run()
        backend.synchronize()
    for got, (dst, _) in zip(first, out):
        np.testing.assert_array_equal(backend.to_host(dst), got)   # deterministic: no atomics


def test_a_step_finishes_its_own_sums_and_a_replay_finishes_them_again():
    backend = Backend("cuda")
    sums, out = filled(backend, SHAPES[:2])
    with backend.activate():
        sums.run_step(0)
        backend.synchronize()
    assert not np.isnan(backend.to_host(out[0][0])).any()
    assert all(np.isnan(backend.to_host(dst)).all() for dst, _ in out[1:])   # step 1's sums wait for their step
    with backend.activate():
        sums.run()
        backend.synchronize()
    eager = [backend.to_host(dst) for dst, _ in out]
    with backend.activate():
        for dst, _ in out:
            dst.fill(np.nan)
    graph = GraphCapturedStep(backend, sums.run, 1, {})
    graph.capture()
    graph.launch()
    backend.synchronize()
    for got, (dst, _) in zip(eager, out):
        np.testing.assert_array_equal(backend.to_host(dst), got)


class EachLayer(PartialSums):
    """Takes no sum: every LayerNorm's last block finishes its own, as outside a training program."""

    def add(self, partials, segments) -> bool:
        return False


def _residual_block(dim: int):
    """Linear -> Add(x, .) -> LayerNorm -> Linear -> LayerNorm -> tanh: one LayerNorm sums the first Linear's bias
    gradient too (three sums), the other two."""
    b = NetworkBuilder((32, dim))
    norm = b.add(LayerNorm(), b.add(Add(), INPUT, b.add(Linear(dim), INPUT, name="linear"), name="res"),
                 name="norm")
    top = b.add(LayerNorm(), b.add(Linear(dim), norm, name="linear2"), name="norm2")
    return b.network(MSELoss(), b.add(Tanh(), top, name="out"))


@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16"])
def test_layernorm_gradients_finished_by_the_program_are_those_finished_by_each_layer(precision, monkeypatch):
    taken = []
    monkeypatch.setattr(PartialSums, "build", lambda self, build=PartialSums.build: (taken.append(len(self)),
                                                                                     build(self)))
    rng = np.random.default_rng(13)
    dim = 256
    x, t = rng.standard_normal((64, 32, dim)), rng.standard_normal((64, 32, dim))
    weights = {"linear.weight": rng.standard_normal((dim, dim)) / np.sqrt(dim), "linear.bias": rng.standard_normal(dim),
               "linear2.weight": rng.standard_normal((dim, dim)) / np.sqrt(dim),
               "linear2.bias": rng.standard_normal(dim)}
    for norm in ("norm", "norm2"):
        weights |= {f"{norm}.weight": 1 + 0.1 * rng.standard_normal(dim),
                    f"{norm}.bias": 0.1 * rng.standard_normal(dim)}
    together = run_network(_residual_block(dim), x, t, device="cuda", precision=precision, weights=weights)
    assert taken == [5]   # norm2's dgamma and dbeta (it computes dx for linear2), norm's three
    data_parallel = run_network(_residual_block(dim), x, t, device="cuda", precision=precision, weights=weights,
                                each_step=True)
    assert taken == [5, 0]   # built as data parallel builds it: each kernel finishes its own sums
    monkeypatch.setattr(program, "PartialSums", EachLayer)
    each = run_network(_residual_block(dim), x, t, device="cuda", precision=precision, weights=weights)
    assert taken == [5, 0, 0]
    for key in (k for k in each if k.startswith("grad:")):
        np.testing.assert_array_equal(data_parallel[key], each[key], err_msg=key)
    summed = {"grad:norm.weight", "grad:norm.bias", "grad:linear.bias", "grad:norm2.weight", "grad:norm2.bias"}
    for key in (k for k in together if k.startswith("grad:")):
        assert np.abs(together[key]).max() > 1e-6, key   # a gradient, not the zeros nobody wrote
        if key in summed:   # the same float partials, added in another fixed order
            assert rel_err(together[key], each[key]) < 1e-5, key
        else:
            np.testing.assert_array_equal(together[key], each[key], err_msg=key)


def test_convolution_and_dense_bias_gradients_finished_by_the_program_are_each_layers(monkeypatch):
    """The column tiles' sums: a convolution's fused ReLU gradient and bias sum (BackwardColumnSum), a Dense bias
    (ColumnSum, as auto takes it for a flat layer), against each kernel's last block finishing its own."""
    taken = []
    monkeypatch.setattr(PartialSums, "build", lambda self, build=PartialSums.build: (taken.append(len(self)),
                                                                                     build(self)))
    net = Sequential([Conv2D(16, activation="relu", name="c1"), Conv2D(32, activation="relu", name="c2"), Flatten(),
                      Dense(64, name="d1"), ReLU(), Dense(10, name="d2")],
                     input_shape=(8, 8, 8), loss=SoftmaxCrossEntropy())
    rng = np.random.default_rng(17)
    x = rng.standard_normal((512, 8, 8, 8))
    t = np.eye(10)[rng.integers(0, 10, 512)]
    weights = random_weights(net.param_specs(), rng, 0.2)
    together = run_network(net, x, t, device="cuda", precision="fp32", weights=weights)
    assert taken and taken[0] >= 2   # at least c2's and a Dense layer's sums (c1 may take the direct kernel)
    monkeypatch.setattr(program, "PartialSums", EachLayer)
    each = run_network(net, x, t, device="cuda", precision="fp32", weights=weights)
    assert taken[1:] == [0]
    for key in (k for k in together if k.startswith("grad:")):
        assert np.abs(together[key]).max() > 1e-6, key
        if key.endswith(".bias"):
            assert rel_err(together[key], each[key]) < 1e-5, key
        else:
            np.testing.assert_array_equal(together[key], each[key], err_msg=key)
