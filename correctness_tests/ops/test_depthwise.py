"""Depthwise convolution's second path on the CPU: which layers take it, its kernels' defines, and `FasterOf`,
the chooser that times the cuDNN graph against the direct kernels on the GPU and keeps the faster.

The kernels themselves compile in test_kernels_compile.py and are checked against NumPy on a GPU in
test_gpu_depthwise.py; here the chooser runs against a stand-in of the device (events reporting set times).
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from gpuengine.layers import Conv2D
from gpuengine.ops import autotune, depthwise
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


class StandInDevice:
    """A backend whose events report, for the last way run, the milliseconds `costs` gives it."""

    def __init__(self, costs: dict, capturing: bool = False):
        self.costs, self.ran, self.last = costs, [], None
        device = self

        class Event:
            def record(self, stream): pass
            def synchronize(self): pass

        self.stream = SimpleNamespace(is_capturing=lambda: capturing)
        self.xp = SimpleNamespace(cuda=SimpleNamespace(
            Event=Event, get_elapsed_time=lambda a, b: device.costs[device.last] * autotune.TIMING_REPEATS))

    def way(self, name):
        def run():
            self.last = name
            self.ran.append(name)
        return run


@pytest.fixture
def choices(monkeypatch):
    fresh = autotune.PlanChoices()
    monkeypatch.setattr(autotune, "PLAN_CHOICES", fresh)
    return fresh


KEY = ("conv_forward_choice", "tf32", "window", ("relu", False))


def test_the_first_run_times_every_way_keeps_the_fastest_and_records_it(choices):
    device = StandInDevice({"cudnn": 0.30, "direct": 0.12})
    chooser = autotune.FasterOf(device, KEY, {"cudnn": device.way("cudnn"), "direct": device.way("direct")})
    chooser.run()
    assert chooser.chosen == "direct" and chooser.times_ms == {"cudnn": 0.30, "direct": 0.12}
    timed = 1 + autotune.TIMING_PASSES * autotune.TIMING_REPEATS   # a first run, then the timed passes
    assert device.ran.count("cudnn") == timed and device.ran.count("direct") == timed + 1   # + the real run
    assert choices.tuned == {autotune.key_text(KEY): {"plan": "direct", "ms": 0.12}}
    device.ran.clear()
    chooser.run()
    assert device.ran == ["direct"]   # chosen for good


def test_a_preset_choice_is_taken_without_timing_and_a_single_way_needs_no_choice(choices):
    autotune.use_plan_choices({autotune.key_text(KEY): "cudnn"})
    device = StandInDevice({"cudnn": 0.30, "direct": 0.12})
    chooser = autotune.FasterOf(device, KEY, {"cudnn": device.way("cudnn"), "direct": device.way("direct")})
    chooser.run()
    assert chooser.chosen == "cudnn" and device.ran == ["cudnn"] and chooser.times_ms == {}
    alone = autotune.FasterOf(device, KEY, {"cudnn": device.way("cudnn"), "direct": None})
    assert alone.chosen == "cudnn"
    with pytest.raises(ValueError, match="no way to run it"):
        autotune.FasterOf(device, KEY, {"cudnn": None, "direct": None})


def test_a_choice_is_never_timed_inside_graph_capture(choices):
    device = StandInDevice({"cudnn": 0.3, "direct": 0.1}, capturing=True)
    chooser = autotune.FasterOf(device, KEY, {"cudnn": device.way("cudnn"), "direct": device.way("direct")})
    with pytest.raises(RuntimeError, match="first ran inside CUDA-graph capture"):
        chooser.run()
    assert device.ran == [] and chooser.chosen is None
