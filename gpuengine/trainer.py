"""The training loop: data -> network -> loss -> backward -> Adam, eager or captured.

One step is: gather the batch on the device, forward, loss and its gradient,
backward, fused Adam, advance the device step counter. With cuda_graph = N the
trainer captures N steps per graph and replays it; a remainder of fewer than N
steps replays a captured single step. A warm-up epoch runs eagerly first
(kernel compilation, cuBLASLt plans, allocator), then graphs are captured, so
`train()` starts on an epoch boundary. Losses stay on the device and are read
once per `train()` call; every buffer is allocated at construction. Data
parallel (parallel/sync.py): the optional gradient sync's hook runs after each
backward step, and the all-reduced gradients are waited for before Adam.
"""
from __future__ import annotations

import functools
import statistics

import numpy as np

from . import checks
from .config import ConfigError, EngineConfig
from .data.checks import check_batch, check_training_data
from .data.resident import ResidentDataset
from .data.streamed import StreamedDataset
from .layers.base import BuildContext
from .model.network import Network, checked_network
from .model.program import TrainingProgram
from .ops import cudnn
from .optim import Adam
from .runtime.backend import GIB, get_backend
from .runtime.capture import GraphCapturedStep
from .runtime.memory import Allocator
from .runtime.params import FlatParameters
from .runtime.precision import policy_for
from .runtime.step_state import StepState

PHASES = ("gather", "forward", "loss_backward", "optimizer")
PROFILE_STEPS = 10   # steps a profiled train() times, at least (whole epochs)
# Adam reads bf16 weight gradients from their scratches where it can (optim.py); False widens them first, one launch
READ_NARROW_GRADIENTS = True


class TrainingDiverged(FloatingPointError):
    """A step's loss was inf or nan: the weights Adam made from it are not usable. `step` is the first such
    step (counted from 0 over the trainer's life), `losses` the epoch losses this train() call read."""

    def __init__(self, step: int, steps_per_epoch: int, lr: float, losses: list[float]):
        self.step, self.losses = step, losses
        epoch, index = divmod(step, steps_per_epoch)
        super().__init__(f"training diverged: the loss of step {step} (epoch {epoch}, batch {index + 1} of "
                         f"{steps_per_epoch}) is inf or nan, and every weight Adam updated from it is too; "
                         f"lower lr (now {lr:g}) or check the data")


class Trainer:
    def __init__(self, net: Network, x: np.ndarray, t: np.ndarray, batch: int, config: EngineConfig | None = None,
                 lr: float = 1e-3, seed: int = 0, fuse: bool = True, sync=None, step_hook=None):
        """sync: a `parallel.GradientSync` for data-parallel training (batch is then the global batch, split
        over the ranks; `train()` returns this rank's losses, `sync.mean_over_ranks` the global ones);
        None trains in this process alone, with no extra work in the step."""
        self.net = net = checked_network(net)
        self.config = EngineConfig.given_or_from_env(config)
        x, t = check_training_data(x, t, net.input_shape, net.target_shape)
        net.check_data(x, t)
        self.batch = check_batch(batch, len(x))
        lr, seed = checks.number("lr", lr, above=0.0), checks.seed("seed", seed)   # Adam checks lr again later
        fuse, step_hook = checks.flag("fuse", fuse), checks.optional_callable("step_hook", step_hook)
        self.backend = backend = get_backend(self.config)
        self.policy = policy_for(self.config.precision)
        self._check_vram_cap(net.param_specs(), net.buffer_specs())
        self.allocator = Allocator(backend)
        steps_per_epoch = len(x) // self.batch
        local_batch, shard = (self.batch, {}) if sync is None else (sync.local_batch(self.batch), sync.shard)
        with backend.activate():
            self.params = FlatParameters(net.param_specs(), self.allocator, self.policy, seed,
                                         buffer_specs=net.buffer_specs())
            self.state = StepState(backend, self.allocator, steps_per_epoch)
            source = ResidentDataset if self.config.resident_data else StreamedDataset
            extra = {} if self.config.resident_data else {"pool": self.config.batch_pool}
            self.data = source(backend, self.allocator, self.policy, self.state, x, t, local_batch, seed,
                               **extra, **shard)
            if backend.is_gpu:   # the graphs built from here on use this setting; those built before keep theirs
                cudnn.PLAN_WORKERS = self.config.plan_workers
            ctx = BuildContext(backend, self.policy, self.allocator, self.params, local_batch,
                               deterministic=self.config.deterministic,
                               batchnorm=self.config.batchnorm, bias_grad=self.config.bias_grad,
                               batch_innermost_input=self.data.batch_innermost_input)
            self.program = TrainingProgram(net, ctx, self.data.batch_x, self.data.batch_t, self.state, fuse,
                                           each_step=sync is not None)
            narrow = self.program.widening.pairs() if sync is None and READ_NARROW_GRADIENTS else ()
            self.optimizer = Adam(backend, self.allocator, self.params, self.state, lr, narrow=narrow)
        self.sync, self.step_hook = sync, step_hook
        self._loss_and_backward = self.program.loss_and_backward
        if self.optimizer.reads_narrow:
            self._loss_and_backward = functools.partial(self.program.loss_and_backward, widen=False)
            self.params.complete_gradients = self._widen
        if sync is not None:
            run = {"batch": self.batch, "samples": len(x), "seed": seed, "precision": self.config.precision, "lr": lr}
            sync.attach(net, self.program, self.params, backend, run)
            self._loss_and_backward = functools.partial(sync.loss_and_backward, self.program)
        self.steps_done = 0          # host mirror of the device step counter
        self.graphs: dict[int, GraphCapturedStep] = {}
        self.warmed_up = False
        self.last_profile: dict[str, float] | None = None

    def _widen(self):
        """The master gradients a step left in bf16 scratches, widened (before they are read)."""
        with self.backend.activate():
            self.program.widening.run()

    def _check_vram_cap(self, specs, buffer_specs):
        """Refuse, before allocating anything, a cap too small for the weights, gradients and Adam moments."""
        cap = self.config.vram_cap_gib
        needed = FlatParameters.planned_bytes(specs, self.policy, buffer_specs=buffer_specs)
        if cap is not None and needed > cap * GIB:
            raise ConfigError(f"vram_cap_gib={cap} ({int(cap * GIB)} bytes) is smaller than the model: its parameters, "
                              f"gradients and Adam moments alone need {needed} bytes ({needed / GIB:.3g} GiB)")

    @property
    def steps_per_epoch(self) -> int:
        return self.state.steps_per_epoch

    def step(self):
        """One training step, enqueued on the engine stream (capturable)."""
        self.data.load_batch()
        self.program.forward()
        self._loss_and_backward()
        self.optimizer.step()
        self.data.end_step()
        self.state.finish_step()
        if self.step_hook is not None:
            self.step_hook()

    def _run_eager(self, steps: int):
        for _ in range(steps):
            self.data.before_launch(self.steps_done, 1)
            self.step()
            self.data.after_launch(self.steps_done, 1)
            self.steps_done += 1

    def _graph(self, steps: int) -> GraphCapturedStep:
        if steps not in self.graphs:
            buffers = {"batch_x": self.data.batch_x, "batch_t": self.data.batch_t, "params": self.params.master,
                       "grads": self.params.grad, "buffers": self.params.buffers, "step": self.state.step,
                       "history": self.state.history}
            graph = GraphCapturedStep(self.backend, self.step, steps, buffers)
            graph.capture()
            self.graphs[steps] = graph
        return self.graphs[steps]

    def _run_graphs(self, steps: int):
        group = self.config.cuda_graph
        while steps > 0:
            n = group if steps >= group else 1
            self.data.before_launch(self.steps_done, n)
            self._graph(n).launch()
            self.data.after_launch(self.steps_done, n)
            self.steps_done += n
            steps -= n

    def release_graphs(self):
        """Drain the stream and drop the captured graphs (a later launch captures again): before what they
        launch is torn down, such as a data-parallel communicator."""
        self.backend.synchronize()
        self.graphs.clear()

    def warm_up(self):
        """One eager epoch, then capture: kernel compilation and cuDNN plan timing (first eager run of
        each graph, on live buffers) stay out of timed work and out of capture."""
        if self.warmed_up:
            return
        with self.backend.activate():
            self._run_eager(self.steps_per_epoch - self.steps_done % self.steps_per_epoch)
            if self.config.cuda_graph:
                self._graph(self.config.cuda_graph)
                if self.config.cuda_graph > 1:
                    self._graph(1)
        self.warmed_up = True

    def run_epochs(self, epochs: int):
        """Enqueue `epochs` epochs of training without reading anything back (0: nothing)."""
        epochs = checks.whole("epochs", epochs, 0)
        if not self.warmed_up:
            self.warm_up()
        with self.backend.activate():
            steps = epochs * self.steps_per_epoch
            if self.config.cuda_graph:
                self._run_graphs(steps)
            else:
                self._run_eager(steps)

    def train(self, epochs: int) -> list[float]:
        """Train `epochs` epochs; the mean loss of each, read back once per history chunk. Raises
        TrainingDiverged, naming the step, once any step so far (timed rounds of run_epochs included) had a
        loss of inf or nan."""
        epochs = checks.whole("epochs", epochs)
        if not self.warmed_up:
            self.warm_up()
        losses: list[float] = []
        if self.config.profile:
            # The first whole epochs (>= 10 steps where there are enough) run eagerly with phase timers:
            # they are part of the `epochs` asked for, not extra training.
            profiled = min(epochs, -(-PROFILE_STEPS // self.steps_per_epoch))
            first_epoch = self.steps_done // self.steps_per_epoch
            self.state.clear_history()
            self.last_profile = self.profile(profiled * self.steps_per_epoch)
            losses += self.state.read_epoch_losses(first_epoch, profiled)
            self._check_diverged(losses)
        while len(losses) < epochs:
            chunk = min(epochs - len(losses), self.state.capacity)
            first_epoch = self.steps_done // self.steps_per_epoch
            self.state.clear_history()
            self.run_epochs(chunk)
            losses += self.state.read_epoch_losses(first_epoch, chunk)
            self._check_diverged(losses)
        return losses

    def _check_diverged(self, losses: list[float]):
        diverged = self.state.read_diverged()
        if diverged is not None:
            raise TrainingDiverged(diverged, self.steps_per_epoch, self.optimizer.lr, losses)

    def profile(self, steps: int = 10) -> dict[str, float]:
        """Median device milliseconds of each phase of an eager step (runs real steps)."""
        steps = checks.whole("steps", steps)
        phases = {"gather": self.data.load_batch, "forward": self.program.forward,
                  "loss_backward": self._loss_and_backward, "optimizer": self.optimizer.step}
        timer = self.backend.timer()
        samples: dict[str, list[float]] = {name: [] for name in PHASES}
        with self.backend.activate():
            for _ in range(steps):
                self.data.before_launch(self.steps_done, 1)
                for name in PHASES:
                    timer.start()
                    phases[name]()
                    samples[name].append(timer.stop())
                self.data.end_step()
                self.state.finish_step()
                self.data.after_launch(self.steps_done, 1)
                self.steps_done += 1
        return {name: statistics.median(v) for name, v in samples.items()}

    def synchronize(self):
        self.backend.synchronize()

    def memory_report(self) -> dict[str, int]:
        return self.allocator.report()
