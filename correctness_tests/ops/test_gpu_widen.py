"""On a GPU: the one launch that widens a training program's bf16 weight gradients into their fp32 masters
(gpuengine/ops/widen.py) writes exactly what a cast does, eager and replayed, and a bf16 convolution network's
gradients are those of each layer widening its own."""
from __future__ import annotations

import numpy as np
import pytest

from gpuengine.layers import Conv2D, Dense, Flatten, ReLU
from gpuengine.losses import SoftmaxCrossEntropy
from gpuengine.model import program
from gpuengine.model.network import Sequential
from gpuengine.ops import widen
from gpuengine.ops.widen import Widening
from gpuengine.runtime.backend import Backend, bfloat16_dtype, gpu_visible
from gpuengine.runtime.capture import GraphCapturedStep
from gpuengine.runtime.memory import Allocator

from ..gradient_check import random_weights
from ..layer_harness import run_network

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_visible(), reason="no CUDA GPU visible (CuPy missing or no device)")]

SIZES = [1, 3, 16383, 16384, 16385, 100_003]   # within a chunk, at its edges, over several


def filled(backend, offset: int):
    """(widening, [(scratch, master, expected)]): bf16 scratches of SIZES, masters of nan, `offset` values into
    their buffers (1: addresses no vector access allows)."""
    xp, rng = backend.xp, np.random.default_rng(offset)
    widening, pairs = Widening(backend, Allocator(backend)), []
    with backend.activate():
        for step, size in enumerate(SIZES):
            values = rng.standard_normal(size + offset).astype(bfloat16_dtype())
            scratch = xp.asarray(values)[offset:]
            master = xp.full(size + offset, np.nan, np.float32)[offset:]
            widening.step = step
            widening.add(scratch, master)
            pairs.append((scratch, master, values[offset:].astype(np.float32)))
        widening.build()
    return widening, pairs


@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "misaligned"])
def test_one_launch_widens_every_pair_as_a_cast_does(offset):
    backend = Backend("cuda")
    widening, pairs = filled(backend, offset)
    kernel, grid, _ = widening._launches[None]
    assert grid == (sum(-(-n // widen.CHUNK) for n in SIZES),)
    with backend.activate():
        widening.run()
        backend.synchronize()
    for _, master, expected in pairs:
        np.testing.assert_array_equal(backend.to_host(master), expected)


def test_a_step_widens_its_own_pairs_and_a_replay_widens_them_again():
    backend = Backend("cuda")
    widening, pairs = filled(backend, 0)
    with backend.activate():
        widening.run_step(2)
        backend.synchronize()
    hosts = [backend.to_host(master) for _, master, _ in pairs]
    np.testing.assert_array_equal(hosts[2], pairs[2][2])
    assert all(np.isnan(h).all() for i, h in enumerate(hosts) if i != 2)
    with backend.activate():
        for _, master, _ in pairs:
            master.fill(np.nan)
    graph = GraphCapturedStep(backend, widening.run, 1, {})
    graph.capture()
    graph.launch()
    backend.synchronize()
    for _, master, expected in pairs:
        np.testing.assert_array_equal(backend.to_host(master), expected)


class EachLayer(Widening):
    """Takes no pair: every convolution widens its own weight gradient, as outside a training program."""

    def add(self, scratch, master) -> bool:
        return False


def test_a_bf16_convolution_network_widened_in_one_launch_has_each_layers_gradients_bit_for_bit(monkeypatch):
    taken = []
    monkeypatch.setattr(Widening, "build", lambda self, build=Widening.build: (taken.append(len(self)),
                                                                               build(self)))
    net = Sequential([Conv2D(16, name="c1"), ReLU(), Conv2D(16, name="c2"), ReLU(), Flatten(), Dense(10, name="d")],
                     input_shape=(8, 8, 8), loss=SoftmaxCrossEntropy())
    rng = np.random.default_rng(3)
    x = rng.standard_normal((32, 8, 8, 8)).astype(bfloat16_dtype()).astype(np.float64)
    t = np.eye(10)[rng.integers(0, 10, 32)]
    weights = random_weights(net.param_specs(), rng, 0.2)
    batched = run_network(net, x, t, device="cuda", precision="bf16", weights=weights)
    assert taken == [2]   # both convolutions' weight gradients, in one launch
    monkeypatch.setattr(program, "Widening", EachLayer)
    each = run_network(net, x, t, device="cuda", precision="bf16", weights=weights)
    assert taken == [2, 0]
    assert batched.keys() == each.keys()
    for key in batched:
        np.testing.assert_array_equal(batched[key], each[key], err_msg=key)
