"""The seed workloads by name: the one table every tool that picks a workload by name reads.

A workload is its network builder, its data generator, its shapes ("seed":
the seed note's sizes, measured on a GPU; "smoke": the CPU tier's small ones,
which exercise the code, not the GPU) and its learning rate. The data-parallel
rank module (`data_parallel.py`), the data-parallel benchmark's ranks
(bench/dp_worker.py) and the max-batch trials (bench/maxbatch/) look
workloads up here; a new workload is one entry below. The zoo's five networks
are a table of their own (zoo.py): one protocol, five models.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from . import cnn, mlp, resnet, transformer

SHAPE_KINDS = ("seed", "smoke")


@dataclass(frozen=True)
class Workload:
    name: str
    build: Callable     # shape -> Network
    data: Callable      # (samples, shape, seed=0) -> (x, t) host arrays
    seed_shape: object
    smoke_shape: object
    lr: float

    def shape(self, kind: str):
        """The workload's "seed" (GPU) or "smoke" (CPU tier) shape."""
        if kind not in SHAPE_KINDS:
            raise ValueError(f"shape must be one of {', '.join(SHAPE_KINDS)}, got {kind!r}")
        return self.seed_shape if kind == "seed" else self.smoke_shape


WORKLOADS = {w.name: w for w in (
    Workload("mlp", mlp.build_mlp, mlp.mlp_data, mlp.SEED_SHAPE, mlp.SMOKE_SHAPE, mlp.LEARNING_RATE),
    Workload("cnn", cnn.build_cnn, cnn.cnn_data, cnn.SEED_SHAPE, cnn.SMOKE_SHAPE, cnn.LEARNING_RATE),
    Workload("resnet", resnet.build_resnet, resnet.resnet_data, resnet.SEED_SHAPE, resnet.SMOKE_SHAPE,
             resnet.LEARNING_RATE),
    Workload("transformer", transformer.build_transformer, transformer.transformer_data, transformer.SEED_SHAPE,
             transformer.SMOKE_SHAPE, transformer.LEARNING_RATE),
)}


def get_workload(name: str) -> Workload:
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}: one of {', '.join(WORKLOADS)}")
    return WORKLOADS[name]
