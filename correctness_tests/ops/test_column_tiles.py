"""The column sums' grids (ops/reductions.py): column tiles a power of two wide (plan_chunks), since a warp's row
lanes meet by shuffles tile_cols apart, and a block of whole warps; whole rows (row_grid) where rows are wide."""
from __future__ import annotations

import pytest

from gpuengine.ops.reductions import plan_chunks, plan_rows, row_grid
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


@pytest.mark.parametrize("rows, cols, width", [(6144, 1024, 8), (6144, 1024, 4), (999, 300, 4), (777, 512, 8),
                                               (3, 256, 8), (100_000, 4096, 4), (16, 4096, 4)])
def test_whole_rows_cover_the_rows_a_row_lane_at_a_time_within_a_block(rows, cols, width):
    plan = row_grid(rows, cols, width, 132)
    per_row = cols // width
    lanes = plan.threads // per_row
    assert plan.width == width and plan.threads % per_row == 0 and plan.threads <= 1024
    assert 4 * plan.threads * width <= 48 * 1024   # the lanes' column sums in shared memory without the opt-in
    assert plan.rows_per_block % lanes == 0 and plan.blocks <= 132
    assert (plan.blocks - 1) * plan.rows_per_block < rows <= plan.blocks * plan.rows_per_block   # every row once


@pytest.mark.parametrize("cols, width", [(64, 8), (16, 4), (302, 2), (8192, 4), (301, 1)])
def test_narrow_unaligned_or_too_wide_rows_keep_the_column_tiles(cols, width):
    assert row_grid(1000, cols, width, 132) is None


def test_the_numpy_backend_takes_no_whole_rows():
    assert plan_rows(Backend("cpu"), 6144, 1024) is None
