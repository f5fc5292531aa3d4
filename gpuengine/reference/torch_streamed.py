"""PyTorch's streamed reference: `DataLoader(pin_memory=True, num_workers=N)` with non-blocking copies.

The yardstick for the engine's streamed loader, the usual PyTorch way
to feed a GPU from host arrays. Item k of the data set is the whole batch of
global step k, gathered with NumPy in a worker process in the engine's own
Feistel order (data/shuffle.py), so both sides train on the same batches; the
DataLoader's pin-memory thread pins it and the step copies it to the device
with `non_blocking=True`. One endless iterator feeds every round (persistent
workers, so no refill bubble at epoch ends): the DataLoader at its strongest.
The step is the plain loop of torch_common's `torch_eager` (or `torch_compile`):
forward under the precision policy, loss, backward, `Adam(fused=True)`.
Workers are forked: they only gather with NumPy and never touch CUDA.
"""
from __future__ import annotations

import itertools
from typing import Callable

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from ..data.shuffle import batch_rows
from .torch_common import GRAPH_MODES, WARMUP_STEPS, _TorchRunner, restore_training_state, snapshot_state

NAME = "torch_dataloader"


class StepBatches(Dataset):
    """Item `step`: the rows of global training step `step`, gathered from host arrays."""

    def __init__(self, x: np.ndarray, t: np.ndarray, batch: int, seed: int):
        self.x, self.t, self.batch, self.seed = x, t, batch, seed
        self.steps_per_epoch = len(x) // batch

    def __len__(self) -> int:
        return self.steps_per_epoch   # one epoch's items; the sampler runs on past it into later epochs

    def __getitem__(self, step: int):
        rows = batch_rows(len(self.x), self.seed, step, self.batch, self.steps_per_epoch)
        return torch.from_numpy(self.x[rows]), torch.from_numpy(self.t[rows])


class EndlessSteps(Sampler):
    """Global step numbers 0, 1, 2, ...: one iterator serves every round."""

    def __iter__(self):
        return itertools.count()


class TorchStreamedTrainRunner(_TorchRunner):
    """`epochs_per_round` epochs per round, every batch streamed from host memory through a DataLoader."""

    def __init__(self, model: torch.nn.Module, loss_fn: Callable, x: np.ndarray, t: np.ndarray, batch_size: int,
                 precision: str = "tf32", lr: float = 1e-3, device: str = "cuda", seed: int = 0, workers: int = 4,
                 prefetch_factor: int = 4, epochs_per_round: int = 1, mode: str = "torch_eager",
                 warmup_steps: int = WARMUP_STEPS, compile_backend: str | None = None, name: str = NAME):
        if mode in GRAPH_MODES:
            raise ValueError(f"mode={mode!r} does not stream: a graph replays fixed buffers, while a "
                             "DataLoader hands out a new tensor each step; use torch_eager or torch_compile")
        super().__init__(mode, model, precision, device, False, compile_backend, None, name)
        if len(x) != len(t):
            raise ValueError(f"x has {len(x)} samples but t has {len(t)}")
        if not 1 <= batch_size <= len(x):
            raise ValueError(f"batch_size={batch_size} must be between 1 and the {len(x)} samples")
        if workers < 0 or prefetch_factor < 1 or epochs_per_round < 1 or warmup_steps < 1:
            raise ValueError(f"workers={workers} (>= 0), prefetch_factor={prefetch_factor}, "
                             f"epochs_per_round={epochs_per_round}, warmup_steps={warmup_steps} (>= 1) out of range")
        self.loss_fn, self.batch_size, self.workers = loss_fn, batch_size, workers
        self.batches = StepBatches(np.ascontiguousarray(x, np.float32), np.ascontiguousarray(t, np.float32),
                                   batch_size, seed)
        self.steps_per_epoch = self.batches.steps_per_epoch
        self.epochs_per_round, self.warmup_steps = epochs_per_round, warmup_steps
        self.samples_per_round = self.steps_per_epoch * batch_size * epochs_per_round
        self.loader = DataLoader(self.batches, batch_size=None, sampler=EndlessSteps(), num_workers=workers,
                                 pin_memory=self.device.type == "cuda", persistent_workers=workers > 0,
                                 prefetch_factor=prefetch_factor if workers else None,
                                 multiprocessing_context="fork" if workers else None)
        options = dict(fused=True) if self.device.type == "cuda" else dict(foreach=True)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=lr, **options)
        self.model.train()
        self._loss_sum = torch.zeros((), dtype=torch.float32, device=self.device)
        self._batches_iter = None
        self.epochs_run = 0

    def _steps(self, count: int) -> None:
        for _ in range(count):
            xb, tb = next(self._batches_iter)
            xb = xb.to(self.device, non_blocking=True)   # from the pin-memory thread's page-locked copy
            tb = tb.to(self.device, non_blocking=True)
            with self._autocast():
                loss = self.loss_fn(self._forward(xb), tb)
            loss.backward()
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self._loss_sum.add_(loss.detach())

    def prepare(self) -> None:
        """Start the workers and warm up (compilation, allocator), then restore the given weights."""
        if self._prepared:
            return
        self._use_precision()
        snapshot = snapshot_state(self.model)
        self._batches_iter = iter(self.loader)
        self._steps(self.warmup_steps)
        self.synchronize()
        restore_training_state(self.model, self.optimizer, snapshot)
        self._batches_iter = iter(self.loader)   # back to step 0 (persistent workers reset, not restarted)
        self._prepared = True

    def run_round(self) -> None:
        self._start_round()
        for _ in range(self.epochs_per_round):
            self._loss_sum.zero_()
            self._steps(self.steps_per_epoch)
            self.epochs_run += 1

    def last_epoch_loss(self) -> float:
        """Mean step loss of the last epoch (a host sync: call it outside timing)."""
        if self.epochs_run == 0:
            raise RuntimeError(f"{self.name}: no epoch has run yet")
        return self._loss_sum.item() / self.steps_per_epoch

    def close(self) -> None:
        """Stop the worker processes: the loader holds its persistent iterator, whose end shuts them down."""
        self._batches_iter = self.loader = None
