"""The dense Rosenbrock MLP of seed note 000.

1000 inputs -> Dense 1000 (tanh) -> Dense 1, MSE loss, Adam lr 1e-3, on
synthetic Rosenbrock data resident on the device. Inference is timed at
batches 512/2000/8000/32000; training at batch 8000 with 1/4/12/50 batches
per epoch. The same sizes, shrunk, serve the CPU tier's smoke runs.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..data.rosenbrock import make_rosenbrock
from ..layers import Dense, Tanh
from ..losses import MSELoss
from ..model.network import Sequential
from .workload import Workload

LEARNING_RATE = 1e-3
INFER_BATCHES = (512, 2000, 8000, 32000)
TRAIN_BATCH = 8000
BATCHES_PER_EPOCH = (1, 4, 12, 50)


@dataclass(frozen=True)
class MLPShape:
    inputs: int = 1000
    hidden: int = 1000
    outputs: int = 1


SEED_SHAPE = MLPShape()
SMOKE_SHAPE = MLPShape(inputs=32, hidden=48)    # CPU tier: exercises the harness, not the GPU


def build_mlp(shape: MLPShape = SEED_SHAPE) -> Sequential:
    return Sequential([Dense(shape.hidden), Tanh(), Dense(shape.outputs)], MSELoss(), (shape.inputs,))


def mlp_data(samples: int, shape: MLPShape = SEED_SHAPE, seed: int = 0):
    """Standardised Rosenbrock regression data: (x (samples, inputs), t (samples, 1))."""
    if shape.outputs != 1:
        raise ValueError("the Rosenbrock target is one value per sample; use outputs=1")
    return make_rosenbrock(samples, shape.inputs, seed)


def parameter_count(shape: MLPShape = SEED_SHAPE) -> int:
    return shape.inputs * shape.hidden + shape.hidden + shape.hidden * shape.outputs + shape.outputs


WORKLOAD = Workload(
    "mlp", "MLP", "000", order=0,
    tests={"test_mlp_train": "training", "test_mlp_infer": "inference", "test_mlp_streamed": "training, streamed data",
           "test_mlp_max_batch": "max batch", "test_mlp_max_batch_pool_cost": "max batch by pool size",
           "test_mlp_train_energy": "training energy"},
    profiled=("test_mlp_train", "test_mlp_streamed"), batch=TRAIN_BATCH, smoke_batch=256,
    twin="gpuengine.reference.torch_mlp", lr=LEARNING_RATE, build=build_mlp, data=mlp_data, seed_shape=SEED_SHAPE,
    smoke_shape=SMOKE_SHAPE)
