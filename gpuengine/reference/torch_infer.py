"""PyTorch's inference reference: forward passes over resident batches, plain, compiled or graph-captured.

The same modes as training (torch_common.py): `torch_eager` runs the model,
`torch_compile` runs `torch.compile(model)`, and `torch_graph` captures one
forward pass per resident input batch in a `torch.cuda.CUDAGraph` after
warm-up on a side stream, the graphs sharing one memory pool, so replaying
them times no input copy; `torch_compile_graph` captures the compiled model's
passes the same way (or is unavailable, with Inductor's error). Every pass
runs under `torch.inference_mode()`; the last pass's output stays on the
device (`output`).
"""
from __future__ import annotations

from typing import Sequence

import torch

from .torch_common import CAPTURE_MODE, WARMUP_STEPS, _TorchRunner, to_device, unavailable_if_compiled_capture_fails


class TorchInferRunner(_TorchRunner):
    """`batches_per_round` forward passes over a few rotating resident input batches."""

    def __init__(self, mode: str, model: torch.nn.Module, x_batches: Sequence, precision: str = "tf32",
                 device: str = "cuda", batches_per_round: int = 20, channels_last: bool = False,
                 compile_backend: str | None = None, compile_mode: str | None = None,
                 warmup_passes: int = WARMUP_STEPS, name: str | None = None):
        super().__init__(mode, model, precision, device, channels_last, compile_backend, compile_mode, name)
        if len(x_batches) == 0:
            raise ValueError("x_batches is empty: give at least one input batch")
        if batches_per_round < 1 or warmup_passes < 1:
            raise ValueError(f"batches_per_round={batches_per_round} and warmup_passes={warmup_passes} must be >= 1")
        layout = torch.channels_last if channels_last else torch.contiguous_format
        self._batches = [to_device(b, self.device) for b in x_batches]
        self._batches = [b.contiguous(memory_format=layout) if b.dim() == 4 else b for b in self._batches]
        shapes = {tuple(b.shape) for b in self._batches}
        if len(shapes) != 1:
            raise ValueError(f"all input batches must have one shape, got {sorted(shapes)}")
        self.batch_size = self._batches[0].shape[0]
        self.batches_per_round = batches_per_round
        self.samples_per_round = batches_per_round * self.batch_size
        self.warmup_passes = warmup_passes
        self.model.eval()
        self._graphs: list[torch.cuda.CUDAGraph] = []
        self._static_outputs: list[torch.Tensor] = []
        self.output: torch.Tensor | None = None   # the last pass's result, left on the device

    def _infer(self, x: torch.Tensor) -> torch.Tensor:
        with self._autocast(cache_enabled=not self.captures):
            return self._forward(x)

    @torch.inference_mode()
    def prepare(self) -> None:
        if self._prepared:
            return
        self._use_precision()
        if self.captures:
            with unavailable_if_compiled_capture_fails(self.mode, self.name):
                self._capture()
        else:
            for _ in range(self.warmup_passes):
                for x in self._batches:
                    self.output = self._infer(x)
        self.synchronize()
        self._prepared = True

    def _capture(self) -> None:
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(self.warmup_passes):
                for x in self._batches:
                    self._infer(x)
        torch.cuda.current_stream(self.device).wait_stream(side)
        # One graph per resident batch, so no input copy is timed; they share one memory pool
        # because they replay in capture order.
        for x in self._batches:
            graph = torch.cuda.CUDAGraph()
            pool = self._graphs[0].pool() if self._graphs else None
            with torch.cuda.graph(graph, pool=pool, capture_error_mode=CAPTURE_MODE):
                self._static_outputs.append(self._infer(x))
            self._graphs.append(graph)

    @torch.inference_mode()
    def run_round(self) -> None:
        self._start_round()
        for i in range(self.batches_per_round):
            k = i % len(self._batches)
            if self._graphs:
                self._graphs[k].replay()
                self.output = self._static_outputs[k]
            else:
                self.output = self._infer(self._batches[k])
