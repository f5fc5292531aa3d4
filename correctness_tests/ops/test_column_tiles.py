"""The column sums' grid (ops/reductions.py plan_chunks): tiles a power of two wide, since a warp's row lanes
meet by shuffles tile_cols apart, and a block of whole warps."""
from __future__ import annotations

import pytest

from gpuengine.ops.reductions import plan_chunks
from gpuengine.runtime.backend import Backend


@pytest.mark.parametrize("cols,widest,tile", [(1, 32, 1), (3, 32, 4), (12, 32, 16), (16, 32, 16), (24, 32, 32),
                                              (300, 32, 32), (3, 4, 4), (256, 4, 4)])
def test_tiles_are_the_power_of_two_at_or_above_the_columns(cols, widest, tile):
    plan = plan_chunks(Backend("cpu"), 1000, cols, widest_tile=widest)
    assert plan.tile_cols == tile
    assert plan.threads % 32 == 0 and plan.threads % plan.tile_cols == 0
    assert plan.tiles * plan.tile_cols >= cols > (plan.tiles - 1) * plan.tile_cols


@pytest.mark.parametrize("widest", [0, 3, 24, 64])
def test_a_tile_wider_than_a_warp_or_not_a_power_of_two_is_refused(widest):
    with pytest.raises(ValueError, match=f"widest_tile {widest} is not a power of two up to 32"):
        plan_chunks(Backend("cpu"), 1000, 64, widest_tile=widest)
