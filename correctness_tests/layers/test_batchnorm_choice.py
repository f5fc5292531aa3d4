"""batchnorm=auto's rule: which maps train on the engine's kernels, by the toggle, the precision and the map's rows
(N*H*W), as ResNet-50 CIFAR's maps at batch 128 meet it."""
from __future__ import annotations

import pytest

from gpuengine.layers.batchnorm import AUTO_ENGINE_ROWS, engine_trains

# ResNet-50 CIFAR at batch 128: the stem's 16x16 maps, then 8x8, 4x4, 2x2 and 1x1
ROWS = {"16x16": 32768, "8x8": 8192, "4x4": 2048, "2x2": 512, "1x1": 128}


@pytest.mark.parametrize("precision", sorted(AUTO_ENGINE_ROWS))
def test_engine_and_cudnn_take_every_map_whatever_its_rows(precision):
    assert all(engine_trains("engine", precision, rows) for rows in ROWS.values())
    assert not any(engine_trains("cudnn", precision, rows) for rows in ROWS.values())


@pytest.mark.parametrize("precision, engine_maps", [("bf16", {"4x4", "2x2", "1x1"}), ("tf32", {"1x1"}),
                                                    ("fp32", set())])
def test_auto_gives_the_engine_the_maps_of_few_rows(precision, engine_maps):
    assert {name for name, rows in ROWS.items() if engine_trains("auto", precision, rows)} == engine_maps
