"""PyTorch reference for the dense Rosenbrock MLP (workloads/mlp.py; seed note 000, docs/seeds.md).

Linear(inputs, hidden) -> Tanh -> Linear(hidden, outputs), mean-squared-error
loss, Adam lr 1e-3. Initialised like the engine (Glorot/Xavier uniform weights,
zero biases) and named like it: "dense1.weight" (hidden, inputs), "dense1.bias",
"dense2.weight" (outputs, hidden), "dense2.bias", torch's (out, in) layout, so
parity tests give both sides the same weights. The runners are the shared ones
of `torch_common` and `torch_infer` (eager, compiled, whole-step CUDA graph) and the streamed
DataLoader runner of `torch_streamed`.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import torch
from torch import nn

from .torch_common import TorchTrainRunner
from .torch_infer import TorchInferRunner
from .torch_streamed import TorchStreamedTrainRunner

SEED_HIDDEN = 1000   # the note's hidden width; runners take it from weights when given


class TorchMLP(nn.Module):
    def __init__(self, inputs: int, hidden: int, outputs: int = 1, seed: int = 0):
        super().__init__()
        self.dense1 = nn.Linear(inputs, hidden)
        self.tanh = nn.Tanh()
        self.dense2 = nn.Linear(hidden, outputs)
        generator = torch.Generator().manual_seed(seed)   # deterministic without touching the global RNG
        for layer in (self.dense1, self.dense2):
            nn.init.xavier_uniform_(layer.weight, generator=generator)
            nn.init.zeros_(layer.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense2(self.tanh(self.dense1(x)))


def mlp_loss(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(prediction, target)


def weight_shapes(inputs: int, hidden: int, outputs: int) -> dict[str, tuple[int, ...]]:
    return {"dense1.weight": (hidden, inputs), "dense1.bias": (hidden,),
            "dense2.weight": (outputs, hidden), "dense2.bias": (outputs,)}


@torch.no_grad()
def load_weights(model: TorchMLP, weights: Mapping[str, np.ndarray]) -> None:
    """Copy engine-layout arrays into the model; every key present, every shape exact."""
    params = dict(model.named_parameters())
    if set(weights) != set(params):
        raise KeyError(f"weights must have exactly the keys {sorted(params)}, got {sorted(weights)}")
    for key, value in weights.items():
        value = np.asarray(value)
        if value.shape != tuple(params[key].shape):
            raise ValueError(f"{key}: expected shape {tuple(params[key].shape)}, got {value.shape}")
        params[key].copy_(torch.from_numpy(value.astype(np.float32)))


def export_weights(model: TorchMLP) -> dict[str, np.ndarray]:
    """The model's parameters as float32 NumPy arrays in the engine's layout."""
    return {key: p.detach().to("cpu", torch.float32).numpy().copy() for key, p in model.named_parameters()}


def parameter_count(inputs: int, hidden: int, outputs: int = 1) -> int:
    return inputs * hidden + hidden + hidden * outputs + outputs


def _build(inputs: int, outputs: int, hidden: int | None, weights: Mapping | None, seed: int) -> TorchMLP:
    if weights is not None:
        from_weights = np.shape(weights["dense1.weight"])[0]
        if hidden is not None and hidden != from_weights:
            raise ValueError(f"hidden={hidden} disagrees with the weights' hidden width {from_weights}")
        hidden = from_weights
    model = TorchMLP(inputs, SEED_HIDDEN if hidden is None else hidden, outputs, seed)
    if weights is not None:
        load_weights(model, weights)
    return model


def mlp_train_runner(mode: str, x: np.ndarray, t: np.ndarray, batch_size: int, precision: str,
                     lr: float = 1e-3, device: str = "cuda", seed: int = 0,
                     weights: Mapping[str, np.ndarray] | None = None, hidden: int | None = None,
                     **runner_options) -> TorchTrainRunner:
    """Train on x (n, inputs), t (n, outputs), float32, resident on `device` before timing.

    `runner_options` go to TorchTrainRunner (compile_backend, compile_mode, warmup_steps, name).
    """
    if x.ndim != 2 or t.ndim != 2:
        raise ValueError(f"x must be (n, inputs) and t (n, outputs); got {x.shape} and {t.shape}")
    model = _build(x.shape[1], t.shape[1], hidden, weights, seed)
    return TorchTrainRunner(mode, model, mlp_loss, x.astype(np.float32, copy=False),
                            t.astype(np.float32, copy=False), batch_size, precision, lr, device, seed,
                            **runner_options)


def mlp_dataloader_runner(x: np.ndarray, t: np.ndarray, batch_size: int, precision: str, lr: float = 1e-3,
                          device: str = "cuda", seed: int = 0, weights: Mapping[str, np.ndarray] | None = None,
                          hidden: int | None = None, **runner_options) -> TorchStreamedTrainRunner:
    """Train on host arrays streamed through a DataLoader (pinned, non-blocking copies): the same model and
    step as `mlp_train_runner`'s torch_eager. `runner_options` go to TorchStreamedTrainRunner (workers,
    prefetch_factor, epochs_per_round, mode, warmup_steps, compile_backend, name)."""
    if x.ndim != 2 or t.ndim != 2:
        raise ValueError(f"x must be (n, inputs) and t (n, outputs); got {x.shape} and {t.shape}")
    model = _build(x.shape[1], t.shape[1], hidden, weights, seed)
    return TorchStreamedTrainRunner(model, mlp_loss, x, t, batch_size, precision, lr, device, seed, **runner_options)


def mlp_infer_runner(mode: str, x_batches: Sequence[np.ndarray], precision: str, device: str = "cuda",
                     weights: Mapping[str, np.ndarray] | None = None, batches_per_round: int = 20,
                     hidden: int | None = None, outputs: int = 1, seed: int = 0,
                     **runner_options) -> TorchInferRunner:
    """Forward passes over resident (batch, inputs) float32 batches, rotating through them.

    `runner_options` go to TorchInferRunner (compile_backend, compile_mode, warmup_passes, name).
    """
    if len(x_batches) == 0 or np.ndim(x_batches[0]) != 2:
        raise ValueError("x_batches must be a non-empty sequence of (batch, inputs) arrays")
    if weights is not None:
        outputs = np.shape(weights["dense2.weight"])[0]
    model = _build(np.shape(x_batches[0])[1], outputs, hidden, weights, seed)
    batches = [np.asarray(b, dtype=np.float32) for b in x_batches]
    return TorchInferRunner(mode, model, batches, precision, device, batches_per_round, **runner_options)


def twin_train_runner(mode, x, t, batch, precision, *, lr, device, shape, weights, buffers):
    """The workload table's one signature of a twin's training runner (gpuengine/workloads/workload.py)."""
    return mlp_train_runner(mode, x, t, batch, precision, lr=lr, device=device, weights=weights)


def twin_ddp_model(shape, x, t, weights, buffers):
    """(model, loss, channels_last, x as the model reads it) for PyTorch DDP from the engine's weights: the
    workload table's one signature (bench/dp_worker.py)."""
    return _build(x.shape[1], t.shape[1], None, weights, 0), mlp_loss, False, x
