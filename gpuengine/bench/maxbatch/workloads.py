"""What a max-batch trial runs, per workload: one training step or one inference pass, engine or torch.

A training trial builds a trainer on a data set of exactly `batch` samples and
runs its warm-up, which is one eager step (forward, backward, Adam) with
cuda_graph=0; a torch training trial prepares its runner (warm-up steps,
compile or capture) and runs one round, one step on that data set. An
inference trial runs one forward pass of the engine's resident predictor, or
prepares a torch inference runner and runs one round of one pass. Data are
random in the workload's shapes: memory does not depend on the values, and
the real generators would cost more host time and RAM than the trial itself.
A workload's network, shapes and learning rate come from workloads/registry.py;
this table adds what a trial needs beyond them (random data of its shapes, its
torch runners): a later workload adds an entry, the trial logic stays the same.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ...config import EngineConfig
from ...workloads.registry import WORKLOADS, Workload
from ...runtime.backend import GIB


@dataclass(frozen=True)
class MaxBatchWorkload:
    workload: Workload                             # the network, shapes and learning rate (workloads/registry.py)
    random_data: Callable                          # (batch, shape, rng) -> (x, t) host arrays
    torch_train: Callable                          # (mode, x, t, batch, precision, device, shape) -> runner
    torch_infer: Callable                          # (mode, x, precision, device, shape) -> runner

    def run_trial(self, spec, batch: int, pool_limit_bytes: int | None) -> dict:
        """Build and run one step or pass as `spec` says; returns details for the trial's record."""
        shape = self.workload.shape(spec.shape)
        x, t = self.random_data(batch, shape, np.random.default_rng(batch))
        if spec.engine == "gpuengine":
            config = EngineConfig(precision=spec.precision, cuda_graph=0, resident_data=spec.data == "resident",
                                  batch_pool=spec.batch_pool, device=spec.device,
                                  vram_cap_gib=None if pool_limit_bytes is None else pool_limit_bytes / GIB)
            run = engine_train if spec.mode == "train" else engine_infer
            return run(self.workload.build(shape), x, t, batch, config, self.workload.lr)
        if spec.mode == "train":
            runner = self.torch_train(spec.engine, x, t, batch, spec.precision, spec.device, shape)
        else:
            runner = self.torch_infer(spec.engine, x, spec.precision, spec.device, shape)
        del x, t   # the runner holds its device copies; the host arrays may go
        runner.prepare()
        runner.run_round()
        runner.synchronize()
        return {}


def engine_train(net, x, t, batch, config, lr) -> dict:
    from ...trainer import Trainer
    trainer = Trainer(net, x, t, batch, config, lr=lr)
    plan = trainer.memory_report()   # booked at construction: before the step runs
    trainer.warm_up()
    trainer.synchronize()
    return {"plan": plan}


def engine_infer(net, x, t, batch, config, lr) -> dict:
    from ...inference import Predictor, ResidentPredictor
    workspace = ResidentPredictor(Predictor(net, config), batch, capture=False)
    plan = workspace.memory_report()
    workspace.load(x)
    workspace.run()
    workspace.synchronize()
    return {"plan": plan}


# -- the dense Rosenbrock MLP (seed note 000) ---------------------------------------------

def _mlp_data(batch: int, shape, rng: np.random.Generator):
    x = rng.random((batch, shape.inputs), dtype=np.float32)   # float32 straight away: no float64 temporary
    x *= 2
    x -= 1
    return x, rng.standard_normal((batch, shape.outputs), dtype=np.float32)


def _mlp_torch_train(mode, x, t, batch, precision, device, shape):
    from ...reference.torch_mlp import mlp_train_runner
    from ...workloads.mlp import LEARNING_RATE
    return mlp_train_runner(mode, x, t, batch, precision, lr=LEARNING_RATE, device=device, hidden=shape.hidden)


def _mlp_torch_infer(mode, x, precision, device, shape):
    from ...reference.torch_mlp import mlp_infer_runner
    return mlp_infer_runner(mode, [x], precision, device=device, batches_per_round=1, hidden=shape.hidden,
                            outputs=shape.outputs)


MAX_BATCH_WORKLOADS = {"mlp": MaxBatchWorkload(WORKLOADS["mlp"], _mlp_data, _mlp_torch_train, _mlp_torch_infer)}


def get_workload(name: str) -> MaxBatchWorkload:
    if name not in MAX_BATCH_WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; max-batch trials know {', '.join(sorted(MAX_BATCH_WORKLOADS))}")
    return MAX_BATCH_WORKLOADS[name]
