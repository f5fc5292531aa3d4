"""On a GPU: a depthwise Conv2D agrees with the NumPy backend by either way of running it, and picks one by time.

A depthwise layer runs cuDNN's grouped graphs or depthwise.py's direct kernels, whichever measured faster on the
first eager run. Each way is pinned here in turn (through the plan choices a gate run would preset), so both are
checked against NumPy whichever wins on this GPU: forward, input gradient and weight gradient (the direct path
writes the fp32 master gradient itself, bf16 included), on MobileNetV2's shapes at 224, a stride-2 one with an
odd size, a 5x5 window, and a fused bias + ReLU.
"""
from __future__ import annotations

import pytest

from gpuengine.ops import autotune
from gpuengine.runtime.backend import gpu_visible

from ..gpu_checks import TOLERANCE, assert_close
from ..layers.test_gpu_conv import conv_on_both

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_visible(), reason="no CUDA GPU visible (CuPy missing or no device)")]

# (batch, input (H, W, C), Conv2D arguments)
CASES = {
    "mobilenet-112x112x32": (8, (112, 112, 32), dict(filters=32, groups=32, padding=1, use_bias=False)),
    "mobilenet-stride2-56x56x144": (8, (56, 56, 144), dict(filters=144, groups=144, stride=2, padding=1,
                                                           use_bias=False)),
    "mobilenet-7x7x960": (16, (7, 7, 960), dict(filters=960, groups=960, padding=1, use_bias=False)),
    "stride2-odd-15x15x40": (4, (15, 15, 40), dict(filters=40, groups=40, stride=2, padding=1, use_bias=False)),
    "5x5-bias-relu-20x20x72": (4, (20, 20, 72), dict(filters=72, groups=72, kernel_size=5, padding=2,
                                                     activation="relu")),
}


class Pinned(autotune.PlanChoices):
    """Plan choices that take `way` for every depthwise choice (cuDNN's own plans still autotune)."""

    def __init__(self, way: str):
        super().__init__()
        self.way = way

    def chosen_for(self, key):
        return self.way if str(key[0]).endswith("_choice") else super().chosen_for(key)


@pytest.mark.parametrize("way", ["direct", "cudnn"])
@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_each_way_matches_numpy(case, precision, way, monkeypatch):
    batch, shape, kwargs = CASES[case]
    if kwargs.get("activation") and precision != "fp32":
        pytest.skip("the fused ReLU is compared in fp32 only (as in test_gpu_conv.py): under TF32 or bf16 a few "
                    "pre-activations near 0 change sign and move whole dy terms in or out of the sums")
    monkeypatch.setattr(autotune, "PLAN_CHOICES", Pinned(way))
    layer, gpu, cpu = conv_on_both(CASES[case], precision)
    assert layer._forward.chosen == way or len(layer._forward.ways) == 1   # one way only where cuDNN has no engine
    assert_close(gpu, cpu, TOLERANCE[precision])


def test_the_first_run_times_both_ways_and_keeps_the_faster_unless_too_close(monkeypatch):
    choices = autotune.PlanChoices()
    monkeypatch.setattr(autotune, "PLAN_CHOICES", choices)
    layer, _, _ = conv_on_both(CASES["mobilenet-stride2-56x56x144"], "tf32")
    for chooser in (layer._forward, layer._grad_x, layer._grad_w):
        assert chooser.timings.keys() == {"cudnn", "direct"}
        assert chooser.chosen == autotune.choose(list(chooser.ways), chooser.timings)
    kept = [key for key in choices.tuned if "_choice" in key]
    assert len(kept) == 3   # forward, dgrad, wgrad: what a gate run would keep
