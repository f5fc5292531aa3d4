"""What a profile runs, per workload: the engine's runner and each PyTorch reference's, as the perf tests build them.

The networks, data, shapes and learning rates come from gpuengine/workloads
(registry.py; the zoo's networks from zoo.py), the engine's runner from
bench/runners.py and the references from gpuengine/reference, with the
arguments the perf tests give them (perf_tests/test_<workload>.py): the same
batch by default, the references starting from the engine's weights (and
batch-norm statistics). Only the data set differs: a profile replays one
epoch at a time, so the data set holds `steps_per_replay` batches, two at
least so that the engine gathers its batch as it does in every perf test (a
data set of exactly one batch is its own batch buffer, resident.py) and
`cuda_graph` of them when one launch holds more. "seed" shapes run on a GPU;
"smoke" shapes (the CPU tier's, the perf tests' own) let a CPU test build
every runner. A workload is one entry of WORKLOADS; the zoo takes a network
name, `zoo:alexnet`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ...config import EngineConfig
from ...workloads import cnn, mlp, resnet, transformer, zoo
from ...workloads.registry import WORKLOADS as REGISTRY
from ..runners import EngineTrainRunner
from .record import ProfileCase

# The references a profile can run: the captured step, and torch.compile inside that capture where
# gpuengine/reference/torch_common.py offers it (its MODES say; `offered_references`).
REFERENCE_CANDIDATES = ("torch_graph", "torch_compile_graph")


@dataclass(frozen=True)
class ProfileWorkload:
    name: str
    batch: int                                # the perf tests' batch on a GPU
    smoke_batch: int                          # theirs on the CPU tier
    lr: float
    network: Callable                         # smoke -> Network
    arrays: Callable                          # (samples, smoke) -> (x, t) host arrays
    torch_runner: Callable                    # (mode, x, t, batch, precision, weights, buffers, device, smoke)

    def default_batch(self, smoke: bool = False) -> int:
        return self.smoke_batch if smoke else self.batch

    def engine_runner(self, case: ProfileCase, device: str = "cuda", smoke: bool = False, **toggles):
        """The engine on a data set of `case.steps_per_replay` batches, data resident, one epoch a round;
        `toggles`: other engine toggles than the case's (deterministic=False)."""
        x, t = self.arrays(case.batch * case.steps_per_replay, smoke)
        config = EngineConfig(precision=case.precision, cuda_graph=case.cuda_graph, resident_data=True, device=device,
                              **toggles)
        return EngineTrainRunner(self.network(smoke), x, t, case.batch, config, epochs_per_round=1, lr=self.lr)

    def reference_runner(self, mode: str, case: ProfileCase, weights: dict, buffers: dict | None,
                         device: str = "cuda", smoke: bool = False):
        """PyTorch in `mode` on the same data, from the engine's weights and batch-norm statistics (its
        runner's state_dict() and buffers_dict())."""
        x, t = self.arrays(case.batch * case.steps_per_replay, smoke)
        return self.torch_runner(mode, x, t, case.batch, case.precision, weights, buffers, device, smoke)


def _registered(name: str, batch: int, smoke_batch: int, torch_runner: Callable) -> ProfileWorkload:
    """A workload of workloads/registry.py: its network, data and learning rate at its seed or smoke shape."""
    entry = REGISTRY[name]

    def shape(smoke: bool):
        return entry.shape("smoke" if smoke else "seed")

    def network(smoke: bool):
        return entry.build(shape(smoke))

    def arrays(samples: int, smoke: bool):
        return entry.data(samples, shape(smoke))

    def reference(mode, x, t, batch, precision, weights, buffers, device, smoke):
        return torch_runner(mode, x, t, batch, precision, weights, buffers, device, shape(smoke))
    return ProfileWorkload(name, batch, smoke_batch, entry.lr, network, arrays, reference)


def _mlp_torch(mode, x, t, batch, precision, weights, buffers, device, shape):
    from ...reference import torch_mlp
    return torch_mlp.mlp_train_runner(mode, x, t, batch, precision, lr=mlp.LEARNING_RATE, device=device,
                                      weights=weights)


def _cnn_torch(mode, x, t, batch, precision, weights, buffers, device, shape):
    from ...reference import torch_cnn
    return torch_cnn.cnn_train_runner(mode, x, t, batch, precision, lr=cnn.LEARNING_RATE, device=device, shape=shape,
                                      weights=weights)


def _resnet_torch(mode, x, t, batch, precision, weights, buffers, device, shape):
    from ...reference import torch_resnet
    return torch_resnet.resnet_train_runner(mode, x, t, batch, precision, lr=resnet.LEARNING_RATE, device=device,
                                            shape=shape, weights=weights, buffers=buffers)


def _transformer_torch(mode, x, t, batch, precision, weights, buffers, device, shape):
    from ...reference import torch_transformer
    return torch_transformer.transformer_train_runner(mode, x, t, batch, precision, lr=transformer.LEARNING_RATE,
                                                      device=device, shape=shape, weights=weights)


def zoo_workload(network: str) -> ProfileWorkload:
    """One zoo network (workloads/zoo.py): torchvision's model on a GPU, the hand-written twin at smoke size."""
    entry = zoo.zoo_net(network)

    def arrays(samples: int, smoke: bool):
        shape = entry.shape(smoke)
        return zoo.zoo_data(samples, shape.size, shape.classes)

    def torch_runner(mode, x, t, batch, precision, weights, buffers, device, smoke):
        from ...reference import torch_zoo
        return torch_zoo.zoo_train_runner(mode, network, x, t, batch, precision, weights, buffers, reduced=smoke,
                                          torchvision=not smoke, lr=zoo.LEARNING_RATE, device=device)
    return ProfileWorkload(f"zoo:{network}", zoo.BATCH, 8, zoo.LEARNING_RATE,
                           lambda smoke: entry.network(reduced=smoke), arrays, torch_runner)


WORKLOADS = {
    "mlp": _registered("mlp", mlp.TRAIN_BATCH, 256, _mlp_torch),
    "cnn": _registered("cnn", cnn.TRAIN_BATCHES[0], 32, _cnn_torch),
    "resnet": _registered("resnet", resnet.TRAIN_BATCH, 16, _resnet_torch),
    "transformer": _registered("transformer", transformer.TRAIN_BATCH, 8, _transformer_torch),
}
ACCEPTED = ", ".join([*WORKLOADS, f"zoo:NAME (NAME one of {', '.join(zoo.NAMES)})"])


def get_workload(text: str) -> ProfileWorkload:
    """The workload named `text` ('mlp', 'zoo:alexnet'); ValueError saying what is accepted otherwise."""
    name, colon, network = text.strip().partition(":")
    if name == "zoo":
        if not colon or network not in zoo.NAMES:
            given = "no network name" if not network else f"no network {network!r}"
            raise ValueError(f"{text!r} is not accepted: the zoo takes a network name and {text!r} gives {given}; "
                             f"use zoo:NAME, NAME one of {', '.join(zoo.NAMES)}")
        return zoo_workload(network)
    if colon or name not in WORKLOADS:
        raise ValueError(f"{text!r} is not accepted; use one of {ACCEPTED}")
    return WORKLOADS[name]


def offered_references() -> tuple[str, ...]:
    """REFERENCE_CANDIDATES that the installed gpuengine/reference/torch_common.py runs (imports torch)."""
    from ...reference.torch_common import MODES
    return tuple(mode for mode in REFERENCE_CANDIDATES if mode in MODES)
