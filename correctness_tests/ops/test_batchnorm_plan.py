"""The engine batch norm's grid (ops/batchnorm.py plan_tiles): a tile's row chunks meet on chip (one block, or on
sm_90 a cluster) where their threads keep all their rows in registers, else the ticket's plan. A stand-in GPU of
132 SMs (an H100 SXM's or an H200's) with the compute capability the test gives."""
from __future__ import annotations

from contextlib import nullcontext
from types import SimpleNamespace

import numpy as np
import pytest

from gpuengine.ops import autotune, batchnorm as ops_batchnorm, reductions
from gpuengine.ops.batchnorm import _Timed, plan_tiles, tile_sums
from gpuengine.runtime.backend import Backend

SMS = 132


@pytest.fixture
def gpu(monkeypatch):
    """plan_tiles' view of a GPU: its SM count and compute capability (90 unless a test sets another)."""
    monkeypatch.setattr(reductions, "multiprocessor_count", lambda: SMS)
    monkeypatch.setattr(ops_batchnorm, "multiprocessor_count", lambda: SMS)
    monkeypatch.setattr(ops_batchnorm, "compute_capability", lambda: 90)
    return SimpleNamespace(is_gpu=True)


def _trips(plan) -> int:
    return -(-plan.rows_per_chunk // (plan.threads // plan.tile_cols))


# ResNet-50 CIFAR bf16 at batch 128 (rows = 128 H W, packs of 8 channels, trips kept forward 8 / backward 4)
@pytest.mark.parametrize("rows,packs,cache,tile,chunks", [
    (2048, 16, 8, 1, 8),     # 4x4x128: 128 blocks of one trip, in place of 16 blocks and a ticket
    (8192, 8, 8, 1, 8),      # 8x8x64: 64 blocks of four trips
    (8192, 32, 4, 1, 8),     # 8x8x256 backward: 256 blocks of four trips
    (2048, 64, 4, 1, 4),     # 4x4x512: 256 blocks of two trips (clusters of 8 would be 512 blocks)
    (512, 32, 4, 1, 2),      # 2x2x256: one trip in clusters of 2, not two trips in one block
    (128, 64, 8, 2, 1),      # 1x1x512: one block a tile of two packs, one trip each
])
def test_each_map_takes_the_fewest_trips_then_the_fewest_blocks(gpu, rows, packs, cache, tile, chunks):
    plan, cluster = plan_tiles(gpu, rows, packs, 8, cache)
    assert (plan.tile_cols, plan.chunks, cluster) == (tile, chunks, chunks)


# the same maps under the cluster counts an H200 runs at once at two blocks an SM (30 of 8; 60 of 4 assumed)
@pytest.mark.parametrize("rows,packs,cache,tile,chunks", [
    (8192, 32, 8, 1, 4),     # 8x8x256 forward: 32 clusters of 8 would exceed 30; 32 of 4, eight trips
    (8192, 32, 4, 4, None),  # 8x8x256 backward: no cluster of four trips fits; the ticket's plan
    (2048, 64, 4, 1, 2),     # 4x4x512: 64 clusters of 4 would exceed 60; 64 of 2, four trips
    (8192, 8, 8, 1, 8),      # 8x8x64: 8 clusters of 8, within the ceiling as before
])
def test_a_cluster_size_takes_no_more_clusters_than_run_at_once(gpu, rows, packs, cache, tile, chunks):
    plan, cluster = plan_tiles(gpu, rows, packs, 8, cache, most_clusters={8: 30, 4: 60})
    if chunks is None:
        assert (plan, cluster) == (reductions.plan_chunks(gpu, rows, packs, widest_tile=4), 1)
    else:
        assert (plan.tile_cols, plan.chunks, cluster) == (tile, chunks, chunks)
        assert plan.tiles <= {8: 30, 4: 60, 2: SMS}[cluster]


@pytest.mark.parametrize("rows,packs,vec,cache", [(2048, 16, 8, 8), (8192, 8, 8, 4), (784, 256, 8, 8), (128, 64, 8, 8),
                                                  (2048, 12, 1, 8), (3136, 3, 8, 2), (512, 32, 8, 4)])
def test_every_on_chip_plan_keeps_its_rows_in_registers_and_its_blocks_resident(gpu, rows, packs, vec, cache):
    plan, cluster = plan_tiles(gpu, rows, packs, vec, cache)
    assert cluster in ops_batchnorm.ON_CHIP_CHUNKS and plan.chunks == cluster
    assert plan.tile_cols & (plan.tile_cols - 1) == 0 and plan.tile_cols * vec <= 32
    assert plan.tiles * plan.tile_cols >= packs > (plan.tiles - 1) * plan.tile_cols
    assert plan.rows_per_chunk * cluster >= rows > plan.rows_per_chunk * (cluster - 1)
    assert _trips(plan) <= cache and plan.tiles * cluster <= 2 * SMS


@pytest.mark.parametrize("cache", [8, 1])
def test_a_map_no_cluster_keeps_in_registers_takes_the_ticket(gpu, cache):
    rows, packs = 32768, 8   # 16x16x64: eight chunks of 4,096 rows are 16 trips of one-pack tiles
    plan, cluster = plan_tiles(gpu, rows, packs, 8, cache)
    assert cluster == 1 and plan == reductions.plan_chunks(gpu, rows, packs, widest_tile=4) and plan.chunks > 1


def test_before_sm_90_a_map_meets_in_one_block_or_by_ticket(gpu, monkeypatch):
    monkeypatch.setattr(ops_batchnorm, "compute_capability", lambda: 80)
    plan, cluster = plan_tiles(gpu, 2048, 16, 8, 8)   # one block a pack: 2,048 rows in 8 trips of 256 lanes
    assert (plan.tile_cols, plan.chunks, cluster) == (1, 1, 1)
    plan, cluster = plan_tiles(gpu, 2048, 16, 8, 4)   # 4 trips kept: no block keeps them, no cluster on sm_80
    assert cluster == 1 and plan == reductions.plan_chunks(gpu, 2048, 16, widest_tile=4)


def test_no_on_chip_chunks_leave_every_map_to_the_ticket(gpu, monkeypatch):
    monkeypatch.setattr(ops_batchnorm, "ON_CHIP_CHUNKS", ())
    for rows, packs in ((2048, 16), (128, 64)):
        assert plan_tiles(gpu, rows, packs, 8, 8) == (reductions.plan_chunks(gpu, rows, packs, widest_tile=4), 1)


def test_the_cpu_backend_plans_without_a_device():
    plan, cluster = plan_tiles(Backend("cpu"), 2048, 16, 8, 8)
    assert cluster == 1 and plan.tile_cols == 4


# the sweep's plans (scripts/bn_layers.py --narrowest): tiles of whole 32-byte sectors of bf16 or wider
@pytest.mark.parametrize("rows,packs,cache,narrowest,tile,chunks", [
    (8192, 32, 8, 2, 2, 8),     # 8x8x256 forward: 16 clusters of 8 two-pack tiles, eight trips (not 32 of 4)
    (8192, 8, 8, 2, 2, 8),      # 8x8x64: 4 clusters of 8 two-pack tiles, eight trips
    (2048, 16, 8, 4, 4, 8),     # 4x4x128: 4 clusters of 8 four-pack tiles, four trips
    (128, 64, 8, 4, 4, 2),      # 1x1x512: four-pack tiles in clusters of 2, one trip each
])
def test_a_narrowest_tile_keeps_the_plans_tiles_at_least_that_wide(gpu, rows, packs, cache, narrowest, tile, chunks):
    plan, cluster = plan_tiles(gpu, rows, packs, 8, cache, narrowest=narrowest)
    assert (plan.tile_cols, plan.chunks, cluster) == (tile, chunks, chunks)
    assert plan.tile_cols >= narrowest and _trips(plan) <= cache


def test_a_narrowest_tile_wider_than_the_map_plans_the_widest_there_is(gpu):
    plan, cluster = plan_tiles(gpu, 2048, 1, 8, 8, narrowest=4)   # 8 channels: one pack, so tiles of one
    assert plan.tile_cols == 1 and _trips(plan) <= 8


def test_a_widest_tile_of_eight_packs_reads_whole_lines_of_bf16(gpu):
    plan, cluster = plan_tiles(gpu, 2048, 64, 8, 8, narrowest=8, widest=8)   # 4x4x512: 128 bytes of a row a tile
    assert (plan.tile_cols, plan.tiles, cluster) == (8, 8, 8) and _trips(plan) == 8
    assert plan_tiles(gpu, 2048, 64, 8, 8)[0].tile_cols <= 4   # the default keeps to 32 channels
    # 8x8x256: 32 row lanes of an eight-pack tile would take 32 trips in clusters of 8: the ticket's plan
    assert plan_tiles(gpu, 8192, 32, 8, 8, narrowest=8, widest=8) == (
        reductions.plan_chunks(gpu, 8192, 32, widest_tile=4), 1)


# -- the plans a layer's first run times (tile_sums, _Timed) --------------------------------------------------------

class _DeviceArray(SimpleNamespace):
    """What planning reads of a GPU array: its shape, size, dtype and address (16-byte aligned)."""

    def __init__(self, shape, itemsize: int):
        size = 1
        for n in shape:
            size *= n
        super().__init__(shape=shape, size=size, itemsize=itemsize, dtype=np.dtype(f"u{itemsize}"),
                         data=SimpleNamespace(ptr=4096))


class _Allocator:
    def zeros(self, shape, dtype, category):
        return np.zeros(shape, dtype)


def _tile_sums(gpu, monkeypatch, shape, forced=None):
    monkeypatch.setattr(ops_batchnorm, "max_active_clusters", lambda *args: 1000)   # no ceiling: no device to ask
    monkeypatch.setattr(ops_batchnorm, "FORCED_TILES", forced)
    return tile_sums(gpu, _Allocator(), "BatchNormForward", lambda defines: None, {"MASK": 0},
                     _DeviceArray(shape, 2), None, (), ops_batchnorm.FORWARD_CACHE_BYTES)


@pytest.mark.parametrize("shape", [(128, 4, 4, 512), (128, 8, 8, 256), (128, 1, 1, 2048), (128, 16, 16, 64)])
def test_the_plans_timed_are_the_distinct_ones_today_s_first(gpu, monkeypatch, shape):
    plans = _tile_sums(gpu, monkeypatch, shape)
    names = [plan.name for plan in plans]
    assert len(set(names)) == len(names) >= 1
    rows, packs = shape[0] * shape[1] * shape[2], shape[3] // 8
    assert plans[0].plan == plan_tiles(gpu, rows, packs, 8, 8)[0]   # one-pack tiles at the narrowest: the default
    assert [plan.plan.tile_cols for plan in plans] == sorted(plan.plan.tile_cols for plan in plans)
    assert len({id(plan.scratch) for plan in plans}) == 1 and len({id(plan.partials) for plan in plans}) == len(plans)


def test_forced_tiles_build_one_plan(gpu, monkeypatch):
    plans = _tile_sums(gpu, monkeypatch, (128, 4, 4, 512), forced=(8, 8))
    assert [plan.plan.tile_cols for plan in plans] == [8]


def test_the_timed_choice_puts_back_what_the_kernels_update_in_place(monkeypatch):
    """The timing launches the forward many times, each moving the running statistics: only the run after the choice
    may count."""
    stats, launched = np.zeros(3), []

    class Plan(SimpleNamespace):
        def launch(self, args):
            launched.append(self.name)
            args[0][...] += 1

    def tune(xp, stream, key, ways, names=None):
        for run in ways.values():
            run()
        return "wide", {}

    monkeypatch.setattr(autotune, "tune", tune)
    monkeypatch.setattr(autotune, "PLAN_CHOICES", autotune.PlanChoices())
    backend = SimpleNamespace(stream=SimpleNamespace(is_capturing=lambda: False), xp=None, activate=nullcontext)
    timed = _Timed(backend, "forward", [Plan(name="narrow"), Plan(name="wide")], lambda plan: (stats,),
                   np.zeros((2, 3)), {"MASK": 0}, kept=(stats,))
    assert timed.sums.name == "narrow"   # before the first run: today's plan
    timed.run()
    assert timed.sums.name == "wide" and launched[-1] == "wide" and len(launched) > 2
    assert stats.tolist() == [1, 1, 1]
    timed.run()
    assert stats.tolist() == [2, 2, 2] and launched[-1] == "wide"
