"""PyTorch reference for the MNIST CNN (workloads/cnn.py; seed note 001, docs/seeds.md).

Conv2d(C, 16, 3, padding=1) -> ReLU -> MaxPool2d(2) -> Flatten -> Linear(16*14*14, 10),
cross-entropy on one-hot (probability) targets, Adam lr 1e-3: the note's
PyTorch program, initialised like the engine (Glorot/Xavier uniform weights,
zero biases) and named like it ("conv.weight", "conv.bias", "dense.weight",
"dense.bias"). Two layouts differ, and `engine_to_torch` / `torch_to_engine`
map them: conv filters are KRSC (out, kh, kw, in) in the engine and
(out, in, kh, kw) in torch; the engine flattens NHWC maps in (h, w, c) order,
torch NCHW maps in (c, h, w) order, so the dense weight's columns are permuted.
Data arrive as the engine's NHWC arrays and are handed to the shared runners
(`torch_common`) as NCHW; with `channels_last` the runners store them NHWC,
which is what cuDNN's fastest convolutions read.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
import torch
from torch import nn

from ..workloads.cnn import SEED_SHAPE, CNNShape
from .torch_common import TorchTrainRunner, host_array, to_nchw


class TorchCNN(nn.Module):
    def __init__(self, shape: CNNShape = SEED_SHAPE, seed: int = 0):
        super().__init__()
        self.shape = shape
        self.conv = nn.Conv2d(shape.channels, shape.filters, shape.kernel, padding=shape.kernel // 2)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(shape.pool)
        self.flatten = nn.Flatten()
        self.dense = nn.Linear(shape.filters * shape.pooled * shape.pooled, shape.classes)
        generator = torch.Generator().manual_seed(seed)   # deterministic without touching the global RNG
        for layer in (self.conv, self.dense):
            nn.init.xavier_uniform_(layer.weight, generator=generator)
            nn.init.zeros_(layer.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:   # x (N, C, H, W)
        return self.dense(self.flatten(self.pool(self.relu(self.conv(x)))))


def cnn_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy against probability rows (the engine's one-hot float32 targets)."""
    return nn.functional.cross_entropy(logits, target)


def _dense_columns(shape: CNNShape) -> np.ndarray:
    """torch column j of the dense weight is engine column _dense_columns(shape)[j]."""
    side = shape.pooled
    return np.arange(side * side * shape.filters).reshape(side, side, shape.filters).transpose(2, 0, 1).ravel()


def engine_to_torch(weights: Mapping[str, np.ndarray], shape: CNNShape = SEED_SHAPE) -> dict[str, np.ndarray]:
    """Engine-layout parameters as torch-layout arrays (same names)."""
    return {"conv.weight": np.asarray(weights["conv.weight"]).transpose(0, 3, 1, 2),
            "conv.bias": np.asarray(weights["conv.bias"]),
            "dense.weight": np.asarray(weights["dense.weight"])[:, _dense_columns(shape)],
            "dense.bias": np.asarray(weights["dense.bias"])}


def torch_to_engine(weights: Mapping, shape: CNNShape = SEED_SHAPE) -> dict[str, np.ndarray]:
    """Torch-layout parameters or gradients (tensors or arrays) in the engine's layouts."""
    host = {k: host_array(v) for k, v in weights.items()}
    dense = np.empty_like(host["dense.weight"])
    dense[:, _dense_columns(shape)] = host["dense.weight"]
    return {"conv.weight": host["conv.weight"].transpose(0, 2, 3, 1).copy(), "conv.bias": host["conv.bias"],
            "dense.weight": dense, "dense.bias": host["dense.bias"]}


@torch.no_grad()
def load_weights(model: TorchCNN, weights: Mapping[str, np.ndarray]) -> None:
    """Copy engine-layout arrays into the model; every key present, every shape exact."""
    params = dict(model.named_parameters())
    if set(weights) != set(params):
        raise KeyError(f"weights must have exactly the keys {sorted(params)}, got {sorted(weights)}")
    for key, value in engine_to_torch(weights, model.shape).items():
        if value.shape != tuple(params[key].shape):
            raise ValueError(f"{key}: expected torch shape {tuple(params[key].shape)}, got {value.shape}")
        params[key].copy_(torch.from_numpy(np.ascontiguousarray(value, dtype=np.float32)))


def build_model(shape: CNNShape = SEED_SHAPE, weights: Mapping[str, np.ndarray] | None = None,
                seed: int = 0) -> TorchCNN:
    model = TorchCNN(shape, seed)
    if weights is not None:
        load_weights(model, weights)
    return model


def cnn_train_runner(mode: str, x: np.ndarray, t: np.ndarray, batch_size: int, precision: str,
                     lr: float = 1e-3, device: str = "cuda", seed: int = 0, shape: CNNShape = SEED_SHAPE,
                     weights: Mapping[str, np.ndarray] | None = None, channels_last: bool = True,
                     **runner_options) -> TorchTrainRunner:
    """Train on engine arrays x (n, H, W, C) and one-hot t (n, classes), resident on `device`.

    `runner_options` go to TorchTrainRunner (compile_backend, compile_mode, warmup_steps, name,
    epochs_per_round).
    """
    if x.ndim != 4 or tuple(x.shape[1:]) != shape.image_shape or t.shape != (len(x), shape.classes):
        raise ValueError(f"x must be (n,) + {shape.image_shape} and t (n, {shape.classes}); got {x.shape}, {t.shape}")
    return TorchTrainRunner(mode, build_model(shape, weights, seed), cnn_loss, to_nchw(x),
                            t.astype(np.float32, copy=False), batch_size, precision, lr, device, seed,
                            channels_last=channels_last, **runner_options)


def twin_train_runner(mode, x, t, batch, precision, *, lr, device, shape, weights, buffers):
    """The workload table's one signature of a twin's training runner (gpuengine/workloads/workload.py)."""
    return cnn_train_runner(mode, x, t, batch, precision, lr=lr, device=device, shape=shape, weights=weights)


def twin_ddp_model(shape, x, t, weights, buffers):
    """(model, loss, channels_last, x as the model reads it) for PyTorch DDP from the engine's weights: the
    workload table's one signature (bench/dp_worker.py)."""
    return build_model(shape, weights), cnn_loss, True, to_nchw(x)
