"""What a profile runs, per workload: the engine's runner and each PyTorch reference's, as the perf tests build them.

The networks, data, shapes, learning rates, batches and twins come from the
workload table (gpuengine/workloads/registry.py; the zoo's networks from
zoo.py), the engine's runner from bench/runners.py and the references from
each twin's `twin_train_runner` in gpuengine/reference, with the arguments
the perf tests give them (perf_tests/test_<workload>.py): the same batch by
default, the references starting from the engine's weights (and
batch-norm statistics). Only the data set differs: a profile replays one
epoch at a time, so the data set holds `steps_per_replay` batches, two at
least so that the engine gathers its batch as it does in every perf test (a
data set of exactly one batch is its own batch buffer, resident.py) and
`cuda_graph` of them when one launch holds more. "seed" shapes run on a GPU;
"smoke" shapes (the CPU tier's, the perf tests' own) let a CPU test build
every runner. A workload is one entry of the table; the zoo takes a network
name, `zoo:alexnet`.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from ...config import EngineConfig
from ...workloads import zoo
from ...workloads.registry import ENTRIES, WORKLOADS as REGISTRY, Workload
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
        """The engine on a data set of `case.steps_per_replay` batches, data resident, one epoch a round, with
        the case's toggles and `toggles` (deterministic=False) over them."""
        x, t = self.arrays(case.batch * case.steps_per_replay, smoke)
        config = EngineConfig(precision=case.precision, cuda_graph=case.cuda_graph, resident_data=True, device=device,
                              **{**dict(case.engine_toggles), **toggles})
        return EngineTrainRunner(self.network(smoke), x, t, case.batch, config, epochs_per_round=1, lr=self.lr)

    def reference_runner(self, mode: str, case: ProfileCase, weights: dict, buffers: dict | None,
                         device: str = "cuda", smoke: bool = False):
        """PyTorch in `mode` on the same data, from the engine's weights and batch-norm statistics (its
        runner's state_dict() and buffers_dict())."""
        x, t = self.arrays(case.batch * case.steps_per_replay, smoke)
        return self.torch_runner(mode, x, t, case.batch, case.precision, weights, buffers, device, smoke)


def _registered(entry: Workload, length: int | None = None) -> ProfileWorkload:
    """A workload of the table: its network, data and learning rate at its seed or smoke shape (at `length`
    positions where given), its twin's runner (the module the entry names, imported when a reference is built:
    torch is optional)."""
    def shape(smoke: bool):
        shape = entry.shape("smoke" if smoke else "seed")
        return shape if length is None else shape.with_length(length)

    def network(smoke: bool):
        return entry.build(shape(smoke))

    def arrays(samples: int, smoke: bool):
        return entry.data(samples, shape(smoke))

    def reference(mode, x, t, batch, precision, weights, buffers, device, smoke):
        return importlib.import_module(entry.twin).twin_train_runner(
            mode, x, t, batch, precision, lr=entry.lr, device=device, shape=shape(smoke), weights=weights,
            buffers=buffers)
    return ProfileWorkload(entry.name, entry.batch, entry.smoke_batch, entry.lr, network, arrays, reference)


def zoo_workload(network: str) -> ProfileWorkload:
    """One zoo network (workloads/zoo.py): torchvision's model on a GPU, the hand-written twin at smoke size."""
    family, net = ENTRIES["zoo"], zoo.zoo_net(network)

    def arrays(samples: int, smoke: bool):
        shape = net.shape(smoke)
        return zoo.zoo_data(samples, shape.size, shape.classes)

    def torch_runner(mode, x, t, batch, precision, weights, buffers, device, smoke):
        return importlib.import_module(family.twin).zoo_train_runner(
            mode, network, x, t, batch, precision, weights, buffers, reduced=smoke, torchvision=not smoke,
            lr=family.lr, device=device)
    return ProfileWorkload(f"zoo:{network}", family.batch, family.smoke_batch, family.lr,
                           lambda smoke: net.network(reduced=smoke), arrays, torch_runner)


WORKLOADS = {name: _registered(entry) for name, entry in REGISTRY.items()}
ACCEPTED = ", ".join([*WORKLOADS, f"zoo:NAME (NAME one of {', '.join(zoo.NAMES)})"])
LENGTHED = tuple(name for name, entry in REGISTRY.items() if hasattr(entry.seed_shape, "with_length"))


def get_workload(text: str, length: int | None = None) -> ProfileWorkload:
    """The workload named `text` ('mlp', 'zoo:alexnet'), at sequence length `length` where given (a workload whose
    shape has one: the Transformer's); ValueError saying what is accepted otherwise."""
    name, colon, network = text.strip().partition(":")
    if length is not None:
        if colon or name not in LENGTHED:
            raise ValueError(f"{text!r} has no sequence length to set; {', '.join(LENGTHED)} has")
        if length < 1:
            raise ValueError(f"sequence length {length}: at least 1")
        return _registered(REGISTRY[name], length)
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
