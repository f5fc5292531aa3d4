"""The engine as `benchmarking.Runner`s: what the perf suite times against references.

A training round is a number of whole epochs (all batches of the shuffled data
set, every step on the device); an inference round is a number of forward
passes over rotating resident inputs, so the GPU cache cannot serve the same
batch twice in a row. The one-shot inference runner times `predict()` with
its host round trips included, as seed note 000 did for the convenience path.
Every engine gets the power study's step hook (bench/injected_delay.py): None
outside a study.
"""
from __future__ import annotations

import numpy as np

from ..config import EngineConfig
from ..inference import Predictor, ResidentPredictor
from ..model.network import Network
from ..trainer import Trainer
from . import injected_delay


def samples_in_rotation(sizes: list[int], batches: int) -> int:
    """Samples in `batches` passes taken in turn from batches of these sizes (they need not be equal)."""
    return sum(sizes[i % len(sizes)] for i in range(batches))


class EngineTrainRunner:
    name = "gpuengine"

    def __init__(self, net: Network, x: np.ndarray, t: np.ndarray, batch: int, config: EngineConfig,
                 epochs_per_round: int = 1, lr: float = 1e-3, seed: int = 0, sync=None):
        """sync: a parallel.GradientSync: data parallel, `batch` the global batch (samples counted over ranks)."""
        self.trainer = Trainer(net, x, t, batch, config, lr=lr, seed=seed, sync=sync,
                               step_hook=injected_delay.step_hook(config))
        self.epochs_per_round = epochs_per_round
        steps = self.trainer.steps_per_epoch * epochs_per_round
        self.samples_per_round = steps * self.trainer.batch

    def parameter_count(self) -> int:
        return self.trainer.params.count

    def state_dict(self) -> dict:
        """The weights as host arrays by name: references start from them."""
        return self.trainer.params.state_dict()

    def bytes_per_step(self) -> int:
        """Host bytes one step's batch carries (streamed data: what the gather reads over PCIe per step)."""
        return self.trainer.data.bytes_per_step

    def buffers_dict(self) -> dict | None:
        """Non-trained state (BatchNorm running statistics) by name; None where the network has none."""
        return self.trainer.params.buffers_dict() or None

    def prepare(self):
        self.trainer.warm_up()

    def run_round(self):
        self.trainer.run_epochs(self.epochs_per_round)

    def synchronize(self):
        self.trainer.synchronize()

    def train(self, epochs: int) -> list[float]:
        """Epoch losses (host read): used before and after timing to check that training trains."""
        return self.trainer.train(epochs)


class EngineInferRunner:
    """Resident inference: inputs already on the device, outputs left there."""

    name = "gpuengine"

    def __init__(self, net: Network, inputs: list[np.ndarray], config: EngineConfig,
                 batches_per_round: int = 20, params=None):
        if not inputs:
            raise ValueError("inference needs at least one input batch")
        self.predictor = Predictor(net, config, params, step_hook=injected_delay.step_hook(config))
        self.workspaces = []
        for x in inputs:
            workspace = ResidentPredictor(self.predictor, len(x))
            workspace.load(x)
            self.workspaces.append(workspace)
        self.batches_per_round = batches_per_round
        self.samples_per_round = samples_in_rotation([len(x) for x in inputs], batches_per_round)

    def parameter_count(self) -> int:
        return self.predictor.params.count

    def state_dict(self) -> dict:
        return self.predictor.params.state_dict()

    def prepare(self):
        for workspace in self.workspaces:
            workspace.run()
        self.synchronize()

    def run_round(self):
        for i in range(self.batches_per_round):
            self.workspaces[i % len(self.workspaces)].run()

    def synchronize(self):
        self.predictor.backend.synchronize()

    def outputs(self) -> list[np.ndarray]:
        return [self.predictor.backend.to_host(w.output) for w in self.workspaces]


class EngineOneShotRunner:
    """The convenience path: host array in, host array out (upload, forward, copy back every call)."""

    name = "gpuengine_oneshot"

    def __init__(self, net: Network, inputs: list[np.ndarray], config: EngineConfig,
                 batches_per_round: int = 5, params=None):
        if not inputs:
            raise ValueError("inference needs at least one input batch")
        self.predictor = Predictor(net, config, params, step_hook=injected_delay.step_hook(config))
        self.inputs = inputs
        self.batches_per_round = batches_per_round
        self.samples_per_round = samples_in_rotation([len(x) for x in inputs], batches_per_round)

    def prepare(self):
        self.predictor.predict(self.inputs[0])

    def run_round(self):
        for i in range(self.batches_per_round):
            self.predictor.predict(self.inputs[i % len(self.inputs)])

    def synchronize(self):
        self.predictor.backend.synchronize()
