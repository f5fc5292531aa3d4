"""Depthwise convolution's second path on the CPU: which layers take it and its kernels' defines.

The kernels themselves compile in test_kernels_compile.py and are checked against NumPy on a GPU in
test_gpu_depthwise.py; `FasterOf`, which chooses between them and cuDNN, is tested in test_autotune.py.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from gpuengine.layers import Conv2D
from gpuengine.ops import depthwise
from gpuengine.workloads import zoo


def test_only_depthwise_layers_with_small_windows_take_the_direct_kernels():
    window = SimpleNamespace(kernel=(3, 3))
    assert depthwise.fits(144, 144, 144, window)
    assert not depthwise.fits(4, 64, 64, window)          # grouped, not depthwise
    assert not depthwise.fits(1, 1, 1, window)            # a plain convolution of one channel
    assert not depthwise.fits(32, 32, 64, window)         # a channel multiplier of 2
    assert depthwise.fits(32, 32, 32, SimpleNamespace(kernel=(5, 5)))
    assert not depthwise.fits(32, 32, 32, SimpleNamespace(kernel=(7, 7)))   # tap sums past the block's shared memory


def test_mobilenet_v2s_depthwise_layers_get_their_geometry_compiled_in():
    net = zoo.ZOO["mobilenet_v2"].network(reduced=False)
    found = {}
    for node in net.nodes:
        if isinstance(node.layer, Conv2D):
            defines = node.layer.depthwise_defines(net.input_shapes(node)[0], np.float32)
            if defines is not None:
                found[node.name] = defines
    assert len(found) == 17   # one 3x3 depthwise convolution per inverted-residual block
    first = next(iter(found.values()))
    assert (first["IN_H"], first["CHANNELS"], first["STRIDE_H"], first["PAD_TOP"], first["HAS_BIAS"]) == \
        (112, 32, 1, 1, 0)
    assert {d["STRIDE_H"] for d in found.values()} == {1, 2} and all(d["WIN_H"] == 3 for d in found.values())
    assert all(d["OUT_H"] == -(-d["IN_H"] // d["STRIDE_H"]) for d in found.values())
