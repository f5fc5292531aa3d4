"""batchnorm=auto's rule: which maps train on the engine's kernels, by the toggle, the precision and the map's rows
(N*H*W) and values (rows x channels), as ResNet-50 CIFAR's maps at batch 128 and ResNet-50's at 224, batch 16,
meet it."""
from __future__ import annotations

import pytest

from gpuengine.layers.batchnorm import AUTO_ENGINE, engine_trains

# (rows, channels): ResNet-50 CIFAR at batch 128 (16x16 stem, then 8x8 .. 1x1), and at 224 with batch 16
MAPS = {"16x16x64": (32768, 64), "8x8x64": (8192, 64), "8x8x256": (8192, 256), "4x4x128": (2048, 128),
        "4x4x256": (2048, 256), "4x4x512": (2048, 512), "2x2x256": (512, 256), "2x2x1024": (512, 1024),
        "1x1x512": (128, 512), "1x1x2048": (128, 2048),
        "224: 14x14x256": (3136, 256), "224: 7x7x512": (784, 512), "224: 7x7x2048": (784, 2048)}


@pytest.mark.parametrize("precision", sorted(AUTO_ENGINE))
def test_engine_and_cudnn_take_every_map_whatever_its_size(precision):
    assert all(engine_trains("engine", precision, *size) for size in MAPS.values())
    assert not any(engine_trains("cudnn", precision, *size) for size in MAPS.values())


@pytest.mark.parametrize("precision, engine_maps", [
    ("bf16", {"4x4x128", "4x4x256", "2x2x256", "2x2x1024", "1x1x512", "1x1x2048", "224: 7x7x512"}),
    ("tf32", {"1x1x512", "1x1x2048"}),
    ("fp32", set())])
def test_auto_gives_the_engine_the_small_maps(precision, engine_maps):
    assert {name for name, size in MAPS.items() if engine_trains("auto", precision, *size)} == engine_maps
