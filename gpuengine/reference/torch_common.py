"""PyTorch's training reference shared by every workload (MLP, CNN, ResNet-50, Transformer), and its modes.

Four modes (docs/architecture.md, "The references we compare against"):

- `torch_eager`: the plain loop, shuffled batches indexed from a device-resident
  dataset, `Adam(fused=True)` on CUDA (foreach on CPU), `zero_grad(set_to_none=True)`.
- `torch_compile`: the same loop around `torch.compile(model)`. `compile_backend`
  and `compile_mode` pass through to `torch.compile`; on CPU, inductor needs a
  C++ compiler and takes tens of seconds, so a CPU test may pass
  `compile_backend="aot_eager"` (no code generation) when it only checks plumbing.
- `torch_graph` (CUDA only): the whole training step (gather into static buffers,
  forward, loss, backward, `Adam(fused=True, capturable=True)`) captured once in a
  `torch.cuda.CUDAGraph` after warm-up on a side stream, following the PyTorch
  CUDA-graphs docs, "Whole-network capture". The graph reads batch k of the epoch
  from a static permutation through a device offset it advances itself.
- `torch_compile_graph` (CUDA only): PyTorch at its strongest, torch_graph's step
  with the model compiled by Inductor (`torch.compile`, default mode): the same
  code path, the forward compiled. Warm-up on the side stream compiles forward
  and backward before the capture. Where Inductor's step fails to compile or to
  capture, `prepare()` raises `ReferenceUnavailable` with the error, and the
  suite leaves this reference out (torch_graph's failures stay failures).

Autocast's weight cache is off in both graph modes (the autocast-with-graphs docs).

The twins share two conversions from here: NHWC engine images to NCHW
(`to_nchw`), and tensors or arrays to host arrays (`host_array`).

The runners (this module's training runner, torch_infer.py's inference runner)
satisfy `gpuengine.bench.benchmarking.Runner`. The training runner's `prepare()`
warms up and then restores the model's weights, buffers and optimizer state, so the first
timed epoch starts from the given weights in every mode (parity tests rely on
it). Losses are summed on the device; only `last_epoch_loss()` reads them
(docs/architecture.md, "Measuring honestly": no host sync inside timing).
"""
from __future__ import annotations

import contextlib
from typing import Callable, ContextManager, Iterator

import numpy as np
import torch

from ..config import PRECISIONS
from . import ReferenceUnavailable

MODES = ("torch_eager", "torch_compile", "torch_graph", "torch_compile_graph")
GRAPH_MODES = ("torch_graph", "torch_compile_graph")      # the whole step captured in a CUDA graph
COMPILED_MODES = ("torch_compile", "torch_compile_graph")  # the model compiled by torch.compile
WARMUP_STEPS = 3   # the CUDA-graphs docs warm up three iterations before capture
# Other threads of the process (the engine's streamed loader, alternating with this reference) may call CUDA while
# torch captures; torch's default "global" mode turns such a call into a failed capture.
CAPTURE_MODE = "thread_local"
# Runners of one session compile the same model classes at many shapes and precisions; past Dynamo's per-function
# limit (8) the rest would run eagerly, with only a log line to say so.
RECOMPILE_LIMIT = 64


def torch_precision(precision: str, device: str = "cuda") -> Callable[..., ContextManager]:
    """Apply the TF32 policy globally; return a factory of the forward's autocast context.

    fp32: IEEE matmuls and convolutions; tf32: TF32 tensor cores; bf16: TF32 on and
    bf16 autocast. The factory takes `cache_enabled` (False inside CUDA graphs, as
    the autocast-with-graphs docs require).
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} is not accepted; use one of {', '.join(PRECISIONS)}")
    tf32 = precision != "fp32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    # Set last so the legacy flags and the matmul precision agree (torch >= 2.9 refuses to read a mix).
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    if precision != "bf16":
        return lambda cache_enabled=True: contextlib.nullcontext()
    device_type = torch.device(device).type

    def bf16_autocast(cache_enabled: bool = True) -> ContextManager:
        return torch.autocast(device_type, dtype=torch.bfloat16, cache_enabled=cache_enabled)
    return bf16_autocast


@contextlib.contextmanager
def unavailable_if_compiled_capture_fails(mode: str, name: str) -> Iterator[None]:
    """Around a graph mode's warm-up and capture: in torch_compile_graph, Inductor's step failing to compile or to
    capture makes the reference unavailable on this machine, with the error; in any other mode a failure stays one."""
    if mode != "torch_compile_graph":
        yield
        return
    try:
        yield
    except ReferenceUnavailable:
        raise
    except Exception as exc:   # Dynamo, Inductor, Triton and the capture raise many kinds
        first_line = next((line for line in str(exc).splitlines() if line.strip()), "")[:300]
        raise ReferenceUnavailable(f"{name}: Inductor's compiled step could not be warmed up and captured in a "
                                   f"CUDA graph here: {type(exc).__name__}: {first_line}") from exc


def allow_recompiles(limit: int) -> None:
    """Raise Dynamo's per-function recompile limit to at least `limit` (its name before torch 2.6: cache_size_limit)."""
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, name, max(getattr(config, name), limit))


def resolve_device(device: str) -> torch.device:
    """A torch.device with an explicit index on CUDA (generators must match it exactly)."""
    dev = torch.device(device)
    if dev.type not in ("cuda", "cpu"):
        raise ValueError(f"device={device!r} is not accepted; use cuda or cpu")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ReferenceUnavailable(f"device={device!r} needs CUDA, but torch {torch.__version__} "
                                       "sees no CUDA device")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def to_device(array, device: torch.device) -> torch.Tensor:
    """A NumPy array or tensor copied to the device once (resident for the whole run)."""
    if isinstance(array, np.ndarray):
        # Cached data sets are read-only; torch wants writable memory, so copy only those.
        array = np.require(array, requirements=["C_CONTIGUOUS", "WRITEABLE"])
    tensor = torch.from_numpy(array) if isinstance(array, np.ndarray) else array
    return tensor.to(device).contiguous()


def to_nchw(x: np.ndarray) -> np.ndarray:
    """Engine NHWC images as the float32 NCHW array torch modules take."""
    return np.ascontiguousarray(np.asarray(x, dtype=np.float32).transpose(0, 3, 1, 2))


def host_array(value) -> np.ndarray:
    """A tensor (any device) or array as a NumPy array; bf16 and fp16 tensors widen to float32."""
    if not torch.is_tensor(value):
        return np.asarray(value)
    value = value.detach().cpu()
    if value.is_floating_point() and value.dtype not in (torch.float32, torch.float64):
        value = value.float()   # NumPy has no bfloat16
    return value.numpy()


def snapshot_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Copies of the model's weights and buffers, to undo warm-up with."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@torch.no_grad()
def restore_training_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                           snapshot: dict[str, torch.Tensor]) -> None:
    """Undo warm-up in place (captured addresses stay valid): weights, buffers, Adam state."""
    for key, value in model.state_dict().items():
        value.copy_(snapshot[key])
    for state in optimizer.state.values():
        for value in state.values():
            if torch.is_tensor(value):
                value.zero_()   # zero moments and step count are exactly a fresh Adam


class _TorchRunner:
    """Mode, device, precision and (compiled) model shared by the train and infer runners."""

    def __init__(self, mode: str, model: torch.nn.Module, precision: str, device: str,
                 channels_last: bool, compile_backend: str | None, compile_mode: str | None, name: str | None):
        if mode not in MODES:
            raise ValueError(f"mode={mode!r} is not accepted; use one of {', '.join(MODES)}")
        self.mode = mode
        self.name = name or mode
        self.device = resolve_device(device)
        if mode in GRAPH_MODES and self.device.type != "cuda":
            raise ReferenceUnavailable(f"{mode} captures a torch.cuda.CUDAGraph and needs device='cuda', "
                                       f"not {device!r}")
        self.precision = precision
        self._autocast = torch_precision(precision, self.device.type)
        self.channels_last = channels_last
        layout = torch.channels_last if channels_last else torch.contiguous_format
        self.model = model.to(self.device, memory_format=layout)
        if self.device.type == "cuda":
            torch.backends.cudnn.benchmark = True   # fixed shapes: let cuDNN autotune during warm-up
        self._forward = self.model
        if self.compiled:   # the one difference between torch_graph and torch_compile_graph
            allow_recompiles(RECOMPILE_LIMIT)
            # Static shapes: what an earlier test compiled must not turn this one's kernels dynamic.
            self._forward = torch.compile(self.model, backend=compile_backend or "inductor", mode=compile_mode,
                                          dynamic=False)
        self._prepared = False

    @property
    def captures(self) -> bool:
        """Whether prepare() captures the work in CUDA graphs that the rounds replay."""
        return self.mode in GRAPH_MODES

    @property
    def compiled(self) -> bool:
        """Whether the model runs compiled by torch.compile."""
        return self.mode in COMPILED_MODES

    def parameter_count(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _use_precision(self) -> None:
        # The TF32 flags are process-global and runners interleave: re-assert this runner's policy
        # (before capture too, which bakes the chosen kernels into the graph).
        torch_precision(self.precision, self.device.type)

    def _start_round(self) -> None:
        if not self._prepared:
            raise RuntimeError(f"{self.name}: call prepare() before run_round() so warm-up stays untimed")
        self._use_precision()


class TorchTrainRunner(_TorchRunner):
    """`epochs_per_round` epochs of training per round on a dataset resident on the device."""

    def __init__(self, mode: str, model: torch.nn.Module, loss_fn: Callable, x, t, batch_size: int,
                 precision: str = "tf32", lr: float = 1e-3, device: str = "cuda", seed: int = 0,
                 channels_last: bool = False, compile_backend: str | None = None,
                 compile_mode: str | None = None, warmup_steps: int = WARMUP_STEPS, name: str | None = None,
                 epochs_per_round: int = 1):
        super().__init__(mode, model, precision, device, channels_last, compile_backend, compile_mode, name)
        samples = len(x)
        if epochs_per_round < 1:
            raise ValueError(f"epochs_per_round={epochs_per_round}: at least one epoch per round")
        if len(t) != samples:
            raise ValueError(f"x has {samples} samples but t has {len(t)}")
        if not 1 <= batch_size <= samples:
            raise ValueError(f"batch_size={batch_size} must be between 1 and the {samples} samples")
        if warmup_steps < 1:
            raise ValueError(f"warmup_steps={warmup_steps}: at least one warm-up step is needed")
        self.loss_fn = loss_fn
        self.batch_size = batch_size
        self.steps_per_epoch = samples // batch_size     # the remainder is dropped: every step has one shape
        self.epochs_per_round = epochs_per_round   # short epochs need several per round to time them
        self.samples_per_round = self.steps_per_epoch * batch_size * epochs_per_round
        self.warmup_steps = warmup_steps
        self._x = to_device(x, self.device)
        if channels_last and self._x.dim() == 4:
            # NHWC storage: a row gather is contiguous and its NCHW view is channels-last for free.
            self._x = self._x.permute(0, 2, 3, 1).contiguous()
        self._t = to_device(t, self.device)
        self._seed = seed
        self._generator = torch.Generator(device=self.device)
        self._perm = torch.empty(samples, dtype=torch.int64, device=self.device)
        self._loss_sum = torch.zeros((), dtype=torch.float32, device=self.device)
        options = dict(fused=True, capturable=self.captures) if self.device.type == "cuda" else dict(foreach=True)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=lr, **options)
        self.model.train()
        self._graph = None
        self.epochs_run = 0
        self._first_step_taken = False

    def _model_input(self, xb: torch.Tensor) -> torch.Tensor:
        if self.channels_last and xb.dim() == 4:
            return xb.permute(0, 3, 1, 2)
        return xb

    def _loss(self, xb: torch.Tensor, tb: torch.Tensor) -> torch.Tensor:
        with self._autocast(cache_enabled=not self.captures):
            return self.loss_fn(self._forward(self._model_input(xb)), tb)

    def _shuffle(self) -> None:
        torch.randperm(len(self._perm), generator=self._generator, out=self._perm)

    def _eager_step(self, k: int) -> None:
        idx = self._perm[k * self.batch_size:(k + 1) * self.batch_size]
        loss = self._loss(self._x.index_select(0, idx), self._t.index_select(0, idx))
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._loss_sum.add_(loss.detach())

    def _graph_step(self) -> None:
        """One capture-safe step: every tensor it reads or writes outlives the graph."""
        idx = self._perm.index_select(0, self._offset + self._arange)
        torch.index_select(self._x, 0, idx, out=self._xb)
        torch.index_select(self._t, 0, idx, out=self._tb)
        self._offset.add_(self.batch_size)   # the next replay reads the permutation's next batch
        loss = self._loss(self._xb, self._tb)
        loss.backward()
        self.optimizer.step()
        self._loss_sum.add_(loss.detach())

    def _snapshot(self) -> dict[str, torch.Tensor]:
        return snapshot_state(self.model)

    def _restore(self, snapshot: dict[str, torch.Tensor]) -> None:
        restore_training_state(self.model, self.optimizer, snapshot)
        self._generator.manual_seed(self._seed)

    def prepare(self) -> None:
        if self._prepared:
            return
        self._use_precision()
        snapshot = self._snapshot()
        self._generator.manual_seed(self._seed)
        self._shuffle()
        if self.captures:
            with unavailable_if_compiled_capture_fails(self.mode, self.name):
                self._capture(snapshot)
        else:
            for k in range(self.warmup_steps):   # compiles forward and backward in torch_compile
                self._eager_step(k % self.steps_per_epoch)
            self._restore(snapshot)
        self.synchronize()
        self._prepared = True

    def _capture(self, snapshot: dict[str, torch.Tensor]) -> None:
        batch = self.batch_size
        self._offset = torch.zeros(1, dtype=torch.int64, device=self.device)
        self._arange = torch.arange(batch, dtype=torch.int64, device=self.device)
        self._xb = torch.empty((batch,) + tuple(self._x.shape[1:]), dtype=self._x.dtype, device=self.device)
        self._tb = torch.empty((batch,) + tuple(self._t.shape[1:]), dtype=self._t.dtype, device=self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):   # warm-up off the default stream, as the docs require
            for _ in range(self.warmup_steps):
                self._offset.zero_()     # every warm-up step reads batch 0: never past the permutation's end
                self.optimizer.zero_grad(set_to_none=True)
                self._graph_step()
        torch.cuda.current_stream(self.device).wait_stream(side)
        self._restore(snapshot)
        # Grads set to None, so backward inside capture allocates them from the graph's pool.
        self.optimizer.zero_grad(set_to_none=True)
        self._graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self._graph, capture_error_mode=CAPTURE_MODE):
            self._graph_step()

    def _step(self, k: int) -> None:
        """Step k of the epoch: the captured graph's replay (it reads its batch itself), else the loop's step."""
        if self._graph is not None:
            self._graph.replay()
        else:
            self._eager_step(k)

    def _start_epoch(self) -> None:
        self._shuffle()
        self._loss_sum.zero_()
        if self._graph is not None:
            self._offset.zero_()

    def run_round(self) -> None:
        """`epochs_per_round` epochs, each a fresh device shuffle then its steps; nothing read back."""
        self._start_round()
        for _ in range(self.epochs_per_round):
            self._start_epoch()
            for k in range(self.steps_per_epoch):
                self._step(k)
            self.epochs_run += 1

    def first_step(self) -> tuple[float, dict[str, np.ndarray]]:
        """The loss and parameter gradients of the first step of the first epoch, through this mode's own step (the
        replayed graph in the graph modes), as float32 host arrays: parity tests compare the modes with it. It
        trains that step, so call it once, on a prepared runner that has run no round."""
        if self.epochs_run or self._first_step_taken:
            raise RuntimeError(f"{self.name}: first_step() reads the first step of a prepared runner that has "
                               "trained none; this one has")
        self._first_step_taken = True
        self._start_round()
        self._start_epoch()
        grads: dict[str, np.ndarray] = {}

        def keep_gradients(*_):   # after the optimizer's step, before the loop sets the gradients to None
            grads.update({name: host_array(p.grad) for name, p in self.model.named_parameters()})
        hook = self.optimizer.register_step_post_hook(keep_gradients)
        try:
            self._step(0)
        finally:
            hook.remove()
        self.synchronize()
        if self._graph is not None:   # a replay runs no Python hook: the gradients sit in the graph's buffers
            keep_gradients()
        return self._loss_sum.item(), grads

    def last_epoch_loss(self) -> float:
        """Mean step loss of the last epoch (a host sync: call it outside timing)."""
        if self.epochs_run == 0:
            raise RuntimeError(f"{self.name}: no epoch has run yet")
        return self._loss_sum.item() / self.steps_per_epoch
