"""The engine batch norm's grid (ops/batchnorm.py plan_tiles): the ticket's plan where one row chunk covers the map
or the GPU has no clusters, else a cluster of row chunks per tile whose threads keep all their rows in registers.
A stand-in GPU of 132 SMs (an H100 SXM's or an H200's) with the compute capability the test gives."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from gpuengine.ops import batchnorm as ops_batchnorm, reductions
from gpuengine.ops.batchnorm import plan_tiles
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
@pytest.mark.parametrize("rows,packs,cache,tile,cluster", [
    (2048, 16, 8, 1, 8),     # 4x4x128: 128 blocks of one trip, in place of 16 blocks and a ticket
    (8192, 8, 8, 1, 8),      # 8x8x64: 64 blocks of four trips
    (8192, 32, 4, 1, 8),     # 8x8x256 backward: 256 blocks of four trips
    (8192, 32, 8, 1, 8),     # forward: the same, the fewest trips first
])
def test_a_map_of_several_chunks_takes_the_cluster_of_fewest_trips(gpu, rows, packs, cache, tile, cluster):
    plan, size = plan_tiles(gpu, rows, packs, 8, cache)
    assert (plan.tile_cols, size, plan.chunks) == (tile, cluster, cluster)
    assert plan.tiles * plan.tile_cols >= packs and plan.rows_per_chunk * plan.chunks >= rows
    assert _trips(plan) <= cache and plan.tiles * plan.chunks <= 2 * SMS


@pytest.mark.parametrize("rows,packs,vec,cache", [(2048, 16, 8, 8), (8192, 8, 8, 4), (784, 256, 8, 8),
                                                  (2048, 12, 1, 8), (3136, 3, 8, 2), (5000, 7, 8, 1)])
def test_every_cluster_keeps_its_rows_in_registers_and_its_blocks_resident(gpu, rows, packs, vec, cache):
    plan, size = plan_tiles(gpu, rows, packs, vec, cache)
    if size == 1:
        assert cache * plan.threads * 8 < rows   # no cluster of 8 one-pack tiles keeps the map: the ticket's plan
        return
    assert size in ops_batchnorm.CLUSTER_SIZES and plan.chunks == size
    assert plan.tile_cols & (plan.tile_cols - 1) == 0 and plan.tile_cols * vec <= 32
    assert plan.tiles * plan.tile_cols >= packs > (plan.tiles - 1) * plan.tile_cols
    assert plan.rows_per_chunk * size >= rows > plan.rows_per_chunk * (size - 1)
    assert _trips(plan) <= cache and plan.tiles * size <= 2 * SMS


def test_a_map_one_chunk_covers_keeps_the_ticket_plan(gpu):
    plan, size = plan_tiles(gpu, 512, 32, 8, 8)   # ResNet's 2x2x256 maps: one chunk a tile, no ticket drawn
    assert size == 1 and plan.chunks == 1 and plan.tile_cols == 4


def test_a_map_no_cluster_keeps_in_registers_takes_the_ticket(gpu):
    rows, packs = 32768, 8   # 16x16x64: eight chunks of 4,096 rows are 16 trips of one-pack tiles
    plan, size = plan_tiles(gpu, rows, packs, 8, 8)
    assert size == 1 and plan == reductions.plan_chunks(gpu, rows, packs, widest_tile=4) and plan.chunks > 1


def test_no_clusters_before_sm_90_or_when_none_are_allowed(gpu, monkeypatch):
    ticket = reductions.plan_chunks(gpu, 2048, 16, widest_tile=4)
    monkeypatch.setattr(ops_batchnorm, "compute_capability", lambda: 80)
    assert plan_tiles(gpu, 2048, 16, 8, 8) == (ticket, 1)
    monkeypatch.setattr(ops_batchnorm, "compute_capability", lambda: 90)
    monkeypatch.setattr(ops_batchnorm, "CLUSTER_SIZES", ())
    assert plan_tiles(gpu, 2048, 16, 8, 8) == (ticket, 1)


def test_the_cpu_backend_plans_without_a_device():
    plan, size = plan_tiles(Backend("cpu"), 2048, 16, 8, 8)
    assert size == 1 and plan.tile_cols == 4
