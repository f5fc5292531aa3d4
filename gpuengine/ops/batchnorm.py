"""The engine's own batch-norm kernels (training, NHWC), in place of cuDNN's graphs: the `batchnorm=engine` toggle.

This module plans their grid and launches them; batchnorm_forward.py and batchnorm_backward.py hold their source and
say how they work, batchnorm_kernels.py what they share.
"""
from __future__ import annotations

import functools

import numpy as np

from ..runtime.kernels import compute_capability, get_kernel, max_active_clusters, multiprocessor_count, vector_width
from . import autotune
from .batchnorm_backward import BACKWARD_SOURCE
from .batchnorm_forward import FORWARD_SOURCE
from .reductions import ChunkPlan, plan_chunks

# Channels of a ticket's column tile whatever VEC: wider tiles leave fewer, longer ones, whose last block adds 2 VEC
# sums of every chunk while the tile's other blocks wait (3x slower on an H200 with 32 packs a tile).
_TILE_CHANNELS = 32
# The row chunks a column tile may take where they meet on chip: one block, or a cluster of CUDA's portable sizes
# (sm_90); () leaves every map to the ticket's plan.
ON_CHIP_CHUNKS = (1, 2, 4, 8)
_BLOCKS_PER_SM = 2    # __launch_bounds__(256, 2)
# The (narrowest, widest) tiles, in packs (widest None: 32 channels), of the plans a layer's first run times
# (autotune.FasterOf on its live buffers): which wins moves with the map, the direction and the dtype, and no rule of
# trips and blocks foretold it (ResNet-50 CIFAR on an H200, bf16: the best per layer 947 us against 1,060 for today's
# plan everywhere, log nvidia-h200/logs/20261130_1038_*). The first, today's, is kept where they are too close to tell.
TILE_CHOICES = ((1, None), (2, None), (4, None), (4, 8), (8, 8))
# scripts/bn_layers.py's override: (narrowest, widest) packs of the one plan to build (widest None: 32 channels);
# None times TILE_CHOICES.
FORCED_TILES = None
# Bytes of each thread's registers that keep its first trips' packs between the passes (CACHE trips of two packs
# each: x and the residual forward, x and dz backward, whose sums keep more registers live across the tile's wait).
FORWARD_CACHE_BYTES, BACKWARD_CACHE_BYTES = 128, 64
# Launch each kernel early (programmatic dependent launch, sm_90): its blocks ask L2 for what older launches wrote
# while the kernel before it ends (batchnorm_kernels.py, "Launched early"): ResNet-50 CIFAR's TF32 step 1.1% faster,
# bf16 unchanged (H200, log nvidia-h200/logs/20261201_0130_*); scripts/gpu_session.sh step bn-early sets it.
LAUNCH_EARLY = True


def cache_trips(vec: int, itemsize: int, cache_bytes: int) -> int:
    """CACHE: the trips a thread keeps, 1 to 8 (plan_chunks gives a chunk at least 8 trips of its row lanes, or the
    whole map where it has fewer rows; plan_tiles' on-chip plans keep them all)."""
    return max(1, min(8, cache_bytes // (vec * itemsize)))


def pack_width(channels: int, *arrays) -> int:
    """Channels a thread moves in one vector access, VEC: 8 (one byte of the mask, 16 bytes of bf16) where the
    channels and every array allow it, else 1 (a lane a channel, the mask by ballot)."""
    return 8 if vector_width(channels, *arrays, widest=8) == 8 else 1


def plan_tiles(backend, rows: int, packs: int, vec: int, cache: int,
               most_clusters: dict | None = None, narrowest: int = 1,
               widest: int | None = None) -> tuple[ChunkPlan, int]:
    """(plan, CLUSTER) of a map of `rows` x `packs` packs of VEC channels whose threads keep `cache` trips.

    A tile's ON_CHIP_CHUNKS row chunks (clusters from sm_90 on) where they keep every row of their blocks in
    registers (trips <= cache) with up to two blocks an SM and, for a cluster size in `most_clusters`, at most
    that many clusters (the device's measured ceiling: more run in a second wave), tiles of `narrowest` (at most
    the widest there is) to `widest` packs (None: 32 channels): the fewest trips (each costs its loads and its
    dependent adds again), then the fewest blocks, the smallest cluster and the widest tile.
    Where none does, the ticket's plan (plan_chunks, 32 channels a tile), whose chunks meet in global memory."""
    ticket = plan_chunks(backend, rows, packs, widest_tile=max(1, _TILE_CHANNELS // vec))
    if not backend.is_gpu:
        return ticket, 1
    sizes = [size for size in ON_CHIP_CHUNKS if size == 1 or compute_capability() >= 90]
    most_blocks = _BLOCKS_PER_SM * multiprocessor_count()
    bound = min(widest or ticket.tile_cols, 1 << (packs - 1).bit_length(), 32)   # a tile is at most a warp wide
    best, tile = None, min(max(1, narrowest), bound)
    while tile <= bound:
        tiles, lanes = -(-packs // tile), ticket.threads // tile
        for size in sizes:
            rows_per_chunk = -(-rows // size)
            trips, blocks = -(-rows_per_chunk // lanes), tiles * size
            if trips <= cache and blocks <= most_blocks and tiles <= (most_clusters or {}).get(size, tiles):
                key = (trips, blocks, size, -tile)
                if best is None or key < best[0]:
                    best = key, ChunkPlan(tile, ticket.threads, tiles, rows_per_chunk, size)
        tile *= 2
    return (ticket, 1) if best is None else (best[1], best[1].chunks)


class _Sums:
    """What both directions share: the grid of their column sums over x (rows x packs of VEC channels), its
    workspace and each tile's generation (tile_barrier), the kernel's defines and the kernel `build` compiles of
    them, fixed at build so that a step only launches. `narrowest`, `widest`: plan_tiles' bounds of a tile.
    `allocate` gives it its workspace (tile_sums plans every bound first, then allocates the distinct plans)."""

    def __init__(self, backend, who: str, build, defines: dict, x, mask, arrays: tuple, cache_bytes: int,
                 dy_parts: int = 1, narrowest: int = 1, widest: int | None = None):
        if bool(defines["MASK"]) != (mask is not None):
            raise ValueError(f"{who}: MASK={defines['MASK']} but mask is {'given' if mask is not None else None}")
        self.channels = x.shape[-1]
        self.vec = vec = pack_width(self.channels, x, *(a for a in arrays if a is not None))
        cache = cache_trips(vec, x.dtype.itemsize, cache_bytes)
        self.rows = x.size // self.channels   # M = N*H*W, the batch statistics' count
        self.early = LAUNCH_EARLY and backend.is_gpu and compute_capability() >= 90
        self.sums = 2 * vec   # a thread's sums: two per channel of its pack
        most_clusters = {}
        while True:   # a cluster size whose grid would run in waves is planned again under its kernel's ceiling
            self.plan, cluster = plan_tiles(backend, self.rows, self.channels // vec, vec, cache, most_clusters,
                                            narrowest, widest)
            self.defines = {**defines, "VEC": vec, "CACHE": cache, "DY_PARTS": dy_parts, "CLUSTER": cluster,
                            "EARLY": int(self.early)}
            self.kernel = build(self.defines)
            if cluster == 1:
                break
            most = max_active_clusters(self.kernel, (self.plan.tiles, self.plan.chunks), self.plan.threads,
                                       self.plan.shared_bytes(self.sums))
            if self.plan.tiles <= most:
                break
            most_clusters[cluster] = most

    @property
    def name(self) -> str:
        """The plan as a way's name: a tile's packs, the row chunks and the cluster size (1: the ticket's ending)."""
        return f"tile_packs={self.plan.tile_cols},chunks={self.plan.chunks},cluster={self.defines['CLUSTER']}"

    def allocate(self, allocator, scratch):
        """This plan's partials, ticket counters and tile generations; `scratch`: the tiles' finished sums, which
        a launch writes before it reads them (one buffer serves every plan of a layer)."""
        self.partials, self.counters = self.plan.workspace(allocator, self.channels // self.vec, sums=self.sums)
        self.generations = allocator.zeros((self.plan.tiles,), np.uint32, "workspace")
        self.scratch = scratch

    def tail(self) -> tuple:
        """The kernels' last arguments but their own: workspace, generations, rows, chunk rows, tile width."""
        return (self.partials, self.counters, self.generations, np.int32(self.rows), *self.plan.grid_args())

    def launch(self, args: tuple):
        self.plan.launch(self.kernel, args, sums=self.sums, early=self.early)


def tile_sums(backend, allocator, who: str, build, defines: dict, x, mask, arrays: tuple, cache_bytes: int,
              dy_parts: int = 1) -> list[_Sums]:
    """The distinct plans of TILE_CHOICES' tile bounds (or of FORCED_TILES alone), in that order, each with its
    workspace."""
    bounds = [FORCED_TILES] if FORCED_TILES is not None else TILE_CHOICES
    found: dict[str, _Sums] = {}
    for narrowest, widest in bounds:
        sums = _Sums(backend, who, build, defines, x, mask, arrays, cache_bytes, dy_parts, narrowest, widest)
        found.setdefault(sums.name, sums)
    scratch = allocator.zeros((2 * x.shape[-1],), np.float32, "workspace")
    for sums in found.values():
        sums.allocate(allocator, scratch)
    return list(found.values())


class _Timed:
    """A direction's plans as the ways of one autotune.FasterOf, keyed by the layer's shape and defines: the first
    run times them on the live buffers (or takes a kept choice) and every run launches the one kept. `kept`: buffers
    the kernel updates in place (the running statistics), which the timing puts back."""

    def __init__(self, backend, direction: str, plans: list[_Sums], args, x, defines: dict, kept: tuple = ()):
        self.plans = {plan.name: plan for plan in plans}
        key = (f"bn_{direction}_choice", tuple(x.shape), tuple(sorted(defines.items())))
        self.ways = autotune.FasterOf(backend, key, {name: functools.partial(plan.launch, args(plan))
                                                     for name, plan in self.plans.items()}, restores=kept)
        self.run = self.ways.run

    @property
    def sums(self) -> _Sums:
        """The plan kept (before the first run: the first plan, today's default)."""
        return self.plans[self.ways.chosen or next(iter(self.plans))]


class _OneLaunch:
    """A direction launched as its kept plan (`_timed`); `run()` like a bound cuDNN graph."""

    _timed: _Timed

    @property
    def sums(self) -> _Sums:
        return self._timed.sums

    def run(self):
        self._timed.run()


class BatchNormForward(_OneLaunch):
    """BN training forward [+ residual] [+ activation] into y in one launch; `run()` like a bound cuDNN graph.

    `mask` (with an activation): a uint8 buffer of mask_shape(x.shape) that gets its gradient's bits."""

    def __init__(self, backend, allocator, defines: dict, x, gamma, beta, running_mean, running_var, y, saved_mean,
                 saved_inv_std, epsilon: float, momentum: float, residual=None, mask=None):
        plans = tile_sums(backend, allocator, "BatchNormForward",
                          lambda given: get_kernel(FORWARD_SOURCE, "bn_forward", **given), defines, x, mask,
                          (y, residual), FORWARD_CACHE_BYTES)

        def args(sums):
            return (x, gamma, beta, running_mean, running_var, saved_mean, saved_inv_std, sums.scratch,
                    x if residual is None else residual, y, y if mask is None else mask, *sums.tail(),
                    np.float32(epsilon), np.float32(momentum))

        self._timed = _Timed(backend, "forward", plans, args, x, defines, kept=(running_mean, running_var))


class BatchNormBackward(_OneLaunch):
    """[dz = act'(dy)] -> BN backward into dx, dgamma, dbeta in one launch; `run()`.

    The activation's gradient comes from `mask` (MASK) or from the forward's output `y`; `dz` given: written;
    `dx` None: only the parameters' gradients; `dy2` given: dy is the sum of dy and dy2, added as they load."""

    def __init__(self, backend, allocator, defines: dict, dy, x, y, gamma, saved_mean, saved_inv_std, dx, dgamma,
                 dbeta, mask=None, dz=None, dy2=None):
        plans = tile_sums(backend, allocator, "BatchNormBackward",
                          lambda given: get_kernel(BACKWARD_SOURCE, "bn_backward", **given), defines, x, mask,
                          (dy, dy2, y, dx, dz), BACKWARD_CACHE_BYTES, dy_parts=1 if dy2 is None else 2)

        def args(sums):
            return (dy, dy if dy2 is None else dy2, x, y, y if mask is None else mask, gamma, saved_mean,
                    saved_inv_std, dgamma, dbeta, sums.scratch, dy if dz is None else dz, np.int32(dz is not None),
                    x if dx is None else dx, np.int32(dx is not None), *sums.tail())

        writes = dict(DY_PARTS=1 if dy2 is None else 2, WRITES_DX=int(dx is not None), WRITES_DZ=int(dz is not None))
        self._timed = _Timed(backend, "backward", plans, args, x, {**defines, **writes})
