"""PyTorch reference for data-parallel training: `torch_ddp`, DistributedDataParallel on the engine's shards.

One rank of it per process, as the engine runs. The process group rides on the
engine's rendezvous store (a `PrefixStore` over it, so no second port and no
key clashes): NCCL on CUDA, gloo on the CPU (its CPU tests). Each rank trains
on the rows the engine's rank of the same number reads (shuffle.batch_rows:
the same permutation on every rank, rank r takes positions r*b..r*b+b-1 of
each global batch), its loss a mean over its b rows, DDP averaging gradients
in 25 MiB buckets during backward; Adam is fused (and capturable when
captured). The permutations of `EPOCH_CYCLE` epochs are computed in
`prepare()` and reused in turn, so no host work sits inside a timed round.

`graph=True` captures the whole step (gather, forward, backward with DDP's
all-reduces, Adam) in one CUDA graph, as PyTorch's CUDA-graphs notes allow
for DDP: NCCL >= 2.9.6, TORCH_NCCL_ASYNC_ERROR_HANDLING=0 before the process
group starts, DDP built on a side stream, and at least 11 eager DDP
iterations before capture. If capture raises, the runner trains eagerly and
says why in `mode_note` (the perf test stores it).
NOT YET RUN ON GPUs: written and tested on the CPU (gloo, eager).
"""
from __future__ import annotations

import contextlib
import os
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ..data.shuffle import epoch_key, permute
from .torch_common import TorchTrainRunner

EPOCH_CYCLE = 16           # distinct epoch orders kept on the device, reused in turn
DDP_WARMUP_STEPS = 12      # PyTorch's notes: >= 11 eager DDP iterations before capturing DDP
STORE_PREFIX = "torch_ddp"


def init_process_group(store, rank: int, world: int, device: str, graph: bool) -> None:
    """torch.distributed on the engine's rendezvous store: NCCL on CUDA (device LOCAL_RANK current), gloo else."""
    if dist.is_initialized():
        return
    if device == "cuda":
        if graph:   # the async error watchdog must be off for capture (PyTorch CUDA-graphs notes, DDP)
            os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "0"
            os.environ["NCCL_ASYNC_ERROR_HANDLING"] = "0"   # the variable's name before PyTorch 2.2
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if device == "cuda" else "gloo", store=dist.PrefixStore(STORE_PREFIX, store),
                            rank=rank, world_size=world)


def shard_order(n: int, seed: int, epoch: int, local_batch: int, world: int, rank: int, steps: int) -> np.ndarray:
    """Rank `rank`'s rows of every step of `epoch`, batch after batch: what the engine's rank reads."""
    positions = np.arange(steps * world * local_batch).reshape(steps, world, local_batch)[:, rank, :].ravel()
    return permute(positions, n, epoch_key(seed, epoch))


class DDPTrainRunner(TorchTrainRunner):
    """TorchTrainRunner with the model wrapped in DDP and the engine's sharded order in place of randperm."""

    def __init__(self, model: torch.nn.Module, loss_fn: Callable, x, t, local_batch: int, precision: str,
                 lr: float, device: str, seed: int, graph: bool, channels_last: bool = False,
                 epochs_per_round: int = 1, name: str = "torch_ddp"):
        if not dist.is_initialized():
            raise RuntimeError("torch_ddp: call init_process_group(...) first (every rank, same store)")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        if len(x) < local_batch * self.world:
            raise ValueError(f"{len(x)} samples cannot fill one global batch of {local_batch} x {self.world} ranks")
        graph = graph and device == "cuda"
        super().__init__("torch_graph" if graph else "torch_eager", model, loss_fn, x, t, local_batch, precision,
                         lr, device, seed, channels_last=channels_last, name=name, epochs_per_round=epochs_per_round,
                         warmup_steps=DDP_WARMUP_STEPS if graph else 1)
        # Steps of a global epoch; this rank's rows per epoch; samples of a round counted over every rank.
        self.steps_per_epoch = len(x) // (local_batch * self.world)
        self.samples_per_round = self.steps_per_epoch * local_batch * self.world * epochs_per_round
        self.mode_note = "whole step captured in a CUDA graph" if graph else "eager"
        ids = [self.device.index] if self.device.type == "cuda" else None
        side = torch.cuda.Stream(self.device) if graph else None
        with torch.cuda.stream(side) if graph else contextlib.nullcontext():   # DDP built on a side stream before capture
            self.model = DistributedDataParallel(self.model, device_ids=ids, broadcast_buffers=False,
                                                 static_graph=graph)
        if graph:
            torch.cuda.current_stream(self.device).wait_stream(side)
        self._forward = self.model
        self._orders = None
        self._epoch = 0

    def _shuffle(self) -> None:
        """This rank's rows of the next epoch (a device copy from the precomputed cycle)."""
        if self._orders is None:
            rows = [shard_order(len(self._x), self._seed, e, self.batch_size, self.world, self.rank,
                                self.steps_per_epoch) for e in range(EPOCH_CYCLE)]
            self._orders = torch.from_numpy(np.stack(rows).astype(np.int64)).to(self.device)
        order = self._orders[self._epoch % EPOCH_CYCLE]
        self._perm[:len(order)].copy_(order)
        self._epoch += 1

    def _restore(self, snapshot) -> None:
        super()._restore(snapshot)
        self._epoch = 0   # the first timed epoch reads epoch 0's order, as the engine's first epoch does

    def _capture(self, snapshot) -> None:
        try:
            super()._capture(snapshot)
        except Exception as exc:   # DDP would not be captured here: fall back to eager, and say so
            self._graph = None
            self.mode = "torch_eager"
            self.mode_note = f"eager: capture failed ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})"
            self._restore(snapshot)

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

