"""Inference: a one-shot `predict(host_array)` and a device-resident predictor.

Seed note 000: the one-shot entry point (upload the input, allocate a
workspace, run, copy back) is convenient but the wrong thing to time in a
loop; the resident path owns a persistent workspace, reads an input already on
the device and leaves the output there, so a repeated forward pays only its
kernels. With cuda_graph >= 1 the resident forward is also captured and
replayed as one graph launch.
"""
from __future__ import annotations

import numpy as np

from . import checks
from .config import EngineConfig
from .data.checks import DataError, check_features
from .layers.base import BuildContext
from .model.network import Network, checked_network
from .model.program import InferenceProgram
from .runtime.backend import get_backend
from .runtime.capture import GraphCapturedStep
from .runtime.memory import Allocator, merge_reports
from .runtime.params import FlatParameters
from .runtime.precision import policy_for


class Predictor:
    """Forward passes of `net` with the given parameters (or fresh Glorot ones)."""

    def __init__(self, net: Network, config: EngineConfig | None = None, params: FlatParameters | None = None,
                 seed: int = 0, step_hook=None):
        """step_hook: a callable that ends every forward pass of this predictor's workspaces, captured with it
        (the gate's power study hands its injected delay here); None adds no work."""
        self.net = net = checked_network(net)
        self.step_hook = checks.optional_callable("step_hook", step_hook)
        self.config = EngineConfig.given_or_from_env(config)
        if params is not None and not isinstance(params, FlatParameters):
            checks.refuse("params", params, "FlatParameters (a trainer's .params), or None to draw fresh ones")
        seed = checks.seed("seed", seed)
        self.backend = get_backend(self.config)
        self.policy = policy_for(self.config.precision)
        self.allocator = Allocator(self.backend)   # books the weights it owns (none when given a trainer's)
        if params is None:
            with self.backend.activate():
                params = FlatParameters(net.param_specs(), self.allocator, self.policy, seed, training=False,
                                        buffer_specs=net.buffer_specs())
        elif params.policy != self.policy:
            raise ValueError(f"parameters were built for precision {params.policy.name}, "
                             f"the predictor runs {self.policy.name}")
        self.params = params
        self._one_shot: ResidentPredictor | None = None   # predict()'s workspace, kept while the size repeats

    @classmethod
    def from_trainer(cls, trainer) -> "Predictor":
        return cls(trainer.net, trainer.config, trainer.params)

    def predict(self, x: np.ndarray) -> np.ndarray:
        """One-shot: upload, run, copy back. The workspace (buffers and GEMM plans) for len(x) is kept for
        the next call of the same size; another size releases it and plans a new one."""
        x = check_features(x, self.net.input_shape, "inputs")
        if len(x) == 0:
            raise DataError("predict() got 0 samples; pass at least one row")
        self.net.check_data(x)
        with self.backend.activate():
            if self._one_shot is None or self._one_shot.batch != len(x):
                if self._one_shot is not None:
                    self._one_shot.release()
                    self._one_shot = None
                self._one_shot = ResidentPredictor(self, len(x), capture=False)
            self._one_shot.load(x)
            return self.backend.to_host(self._one_shot.run())


class ResidentPredictor:
    """A caller-owned inference workspace for batches of `batch` rows on the device."""

    def __init__(self, predictor: Predictor, batch: int, capture: bool | None = None):
        if not isinstance(predictor, Predictor):
            checks.refuse("predictor", predictor, "a Predictor")
        if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1:
            raise DataError(f"batch size must be a whole number >= 1, got {batch!r}")
        if capture is not None:
            capture = checks.flag("capture", capture)
        self.predictor = predictor
        self.backend = backend = predictor.backend
        self.batch, self.step_hook = int(batch), predictor.step_hook
        self.allocator = Allocator(backend)
        with backend.activate():
            self.input = self.allocator.zeros((self.batch,) + predictor.net.input_shape,
                                              predictor.policy.compute_dtype, "batch")
            ctx = BuildContext(backend, predictor.policy, self.allocator, predictor.params, self.batch, training=False,
                               deterministic=predictor.config.deterministic,
                               batchnorm=predictor.config.batchnorm)
            self.program = InferenceProgram(predictor.net, ctx, self.input)
        capture = predictor.config.cuda_graph > 0 if capture is None else capture
        self._graph = None
        if capture and backend.is_gpu:
            with backend.activate():
                self._forward()   # warm-up: compile kernels and plans before capture
                self._graph = GraphCapturedStep(backend, self._forward, 1, {"input": self.input,
                                                                            "output": self.program.y})
                self._graph.capture()

    @property
    def output(self):
        return self.program.y

    def load(self, x):
        """Copy a batch (host or device array) into the workspace's input buffer.

        A device array may still be being written on the caller's current stream: the engine stream
        waits for that stream's queued work before reading it.
        """
        if tuple(x.shape) != tuple(self.input.shape):
            raise DataError(f"input batch has shape {tuple(x.shape)}, this workspace takes {tuple(self.input.shape)}")
        if isinstance(x, np.ndarray):
            self.predictor.net.check_data(x)   # host data only: checking a device array would cost a sync
            with self.backend.activate():
                self.backend.upload(self.input, x)
            return
        self.backend.wait_for_current_stream()
        with self.backend.activate():
            self.backend.xp.copyto(self.input, x, casting="unsafe")

    def memory_report(self) -> dict[str, int]:
        """Device bytes by category of the predictor's own weights and this workspace, booked before any pass."""
        return merge_reports(self.predictor.allocator.report(), self.allocator.report())

    def _forward(self):
        self.program.run()
        if self.step_hook is not None:
            self.step_hook()

    def run(self):
        """Forward pass on the current input; the output stays on the device."""
        if self._graph is not None:
            self._graph.launch()   # onto the engine stream by name: no current-stream switch per batch
            return self.program.y
        with self.backend.activate():
            self._forward()
        return self.program.y

    def release(self):
        """Free the workspace's GEMM plans now; the workspace cannot run afterwards."""
        self._graph = None
        self.program.release()

    def synchronize(self):
        self.backend.synchronize()
