"""A PyTorch training runner that copies every batch from pinned host memory (seed note 003's protocol).

The zoo's streamed cases time each training step with its batch's copy from
the host included, as the note did ("including the copy of each batch from
the host"). Here the data set stays in pinned host memory; each step gathers
its shuffled rows on the host into one of two pinned staging buffers, copies
them to the device with a non-blocking copy on the step's stream, and trains
on the device copy: torch_eager and torch_compile run the step after it,
torch_graph (and torch_compile_graph) replays the whole captured step
(forward, backward, fused capturable Adam) on the static buffers the copy
wrote, the copy outside the graph. A staging buffer is rewritten only once its previous copy has
finished (a CUDA event), so the host gathers batch k + 1 while the device
trains on batch k. Everything else (precision, warm-up and restore, losses
summed on the device) is torch_common's `TorchTrainRunner`.
"""
from __future__ import annotations

import torch

from .torch_common import TorchTrainRunner

STAGING_BUFFERS = 2


class PinnedHostBatchRunner(TorchTrainRunner):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        on_gpu = self.device.type == "cuda"
        # The data set moves back to the host (pinned on a GPU machine); the shuffle runs there too.
        self._x, self._t = (a.cpu().pin_memory() if on_gpu else a.cpu() for a in (self._x, self._t))
        self._generator = torch.Generator()
        self._perm = torch.empty(len(self._x), dtype=torch.int64)
        batch = self.batch_size
        self._staging = [tuple(torch.empty((batch,) + tuple(a.shape[1:]), dtype=a.dtype, pin_memory=on_gpu)
                               for a in (self._x, self._t)) for _ in range(STAGING_BUFFERS)]
        self._copied = [torch.cuda.Event() if on_gpu else None for _ in range(STAGING_BUFFERS)]
        self._xb, self._tb = (torch.empty((batch,) + tuple(a.shape[1:]), dtype=a.dtype, device=self.device)
                              for a in (self._x, self._t))
        self._loads = 0

    def _load(self, k: int) -> None:
        """Batch k of the epoch: host gather into a free staging buffer, then a non-blocking copy to the device."""
        slot = self._loads % STAGING_BUFFERS
        if self._copied[slot] is not None:
            self._copied[slot].synchronize()   # its previous copy has left the buffer
        rows = self._perm[k * self.batch_size:(k + 1) * self.batch_size]
        x_stage, t_stage = self._staging[slot]
        torch.index_select(self._x, 0, rows, out=x_stage)
        torch.index_select(self._t, 0, rows, out=t_stage)
        self._xb.copy_(x_stage, non_blocking=True)
        self._tb.copy_(t_stage, non_blocking=True)
        if self._copied[slot] is not None:
            self._copied[slot].record()
        self._loads += 1

    def _eager_step(self, k: int) -> None:
        self._load(k)
        loss = self._loss(self._xb, self._tb)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._loss_sum.add_(loss.detach())

    def _graph_step(self) -> None:
        """The captured step trains on the static device batch; outside capture (warm-up) it loads batch 0 first."""
        if not torch.cuda.is_current_stream_capturing():
            self._load(0)
        loss = self._loss(self._xb, self._tb)
        loss.backward()
        self.optimizer.step()
        self._loss_sum.add_(loss.detach())

    def _step(self, k: int) -> None:
        if self._graph is not None:
            self._load(k)   # the copy stays outside the graph, which trains on the static batch it wrote
            self._graph.replay()
        else:
            self._eager_step(k)
