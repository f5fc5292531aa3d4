"""Comparing the engine with PyTorch: a network's torch twin, and one comparison helper.

`torch_twin` rebuilds an engine `Sequential` of Dense and activation layers as a
torch `nn.Sequential` whose modules carry the engine's layer names, so its
parameters are named exactly like the engine's ("dense1.weight", ...) and, the
layouts being the same ((out, in) weights), take the engine's weights as they
are. `assert_matches_torch` compares a dict of engine arrays with a dict of
torch tensors (or arrays), key for key, with the tolerances as arguments, and
says which entry differed and by how much (the tinygrad helper's idea).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Mapping

import numpy as np
import pytest
import torch
from torch import nn

from gpuengine.layers.activations import Activation
from gpuengine.layers.dense import Dense
from gpuengine.losses.mse import MSELoss

_ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}
_LOSSES = {MSELoss: nn.functional.mse_loss}


def to_numpy(value) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def torch_twin(net, weights: Mapping[str, np.ndarray], dtype=torch.float32) -> nn.Sequential:
    """The torch module computing what `net` computes, holding `weights` (engine names and layouts)."""
    modules = OrderedDict()
    for layer, shape in ((node.layer, net.shapes[node.inputs[0]]) for node in net.nodes):
        if isinstance(layer, Dense):
            modules[layer.name] = nn.Linear(shape[0], layer.units, dtype=dtype)
        elif isinstance(layer, Activation):
            modules[layer.name] = _ACTIVATIONS[layer.kind]()
        else:
            raise TypeError(f"no torch twin for {layer!r}")
    model = nn.Sequential(modules)
    params = dict(model.named_parameters())
    if params.keys() != weights.keys():
        raise KeyError(f"engine weights {sorted(weights)} do not name the twin's parameters {sorted(params)}")
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(torch.from_numpy(np.asarray(weights[name])).to(dtype))
    return model


def torch_loss(net):
    """The torch function of `net`'s loss (mean reduction, as the engine's)."""
    return _LOSSES[type(net.loss)]


def torch_grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad for name, p in model.named_parameters()}


def assert_matches_torch(engine: Mapping[str, np.ndarray], reference: Mapping, *, rtol: float, atol: float = 0.0,
                         what: str = ""):
    """Every engine array equals its torch counterpart: same names, same shapes, values within tolerance."""
    if engine.keys() != reference.keys():
        raise AssertionError(f"{what}: engine has {sorted(engine)}, torch has {sorted(reference)}")
    for name in engine:
        ours = np.asarray(engine[name], dtype=np.float64)
        theirs = to_numpy(reference[name]).astype(np.float64)
        if ours.shape != theirs.shape:
            raise AssertionError(f"{what} {name}: engine shape {ours.shape}, torch shape {theirs.shape}")
        if not np.isfinite(ours).all():
            raise AssertionError(f"{what} {name}: the engine's values are not all finite")
        error = np.abs(ours - theirs)
        bound = atol + rtol * np.abs(theirs)
        if (error > bound).any():
            worst = np.unravel_index(np.argmax(error - bound), error.shape)
            raise AssertionError(f"{what} {name}: {int((error > bound).sum())} of {error.size} values differ; "
                                 f"worst at {tuple(int(i) for i in worst)}: engine {ours[worst]:.9g}, "
                                 f"torch {theirs[worst]:.9g} (rtol {rtol}, atol {atol})")


def torch_adam(model: nn.Module, lr: float) -> torch.optim.Adam:
    """torch's Adam with the engine's hyper-parameters (eps after the square root, no weight decay)."""
    return torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-8)


def first_step(trainer):
    """Exactly one training step (step 0), without the warm-up epoch `train()` would run."""
    with trainer.backend.activate():
        trainer.data.before_launch(0, 1)
        trainer.step()
        trainer.data.after_launch(0, 1)


@pytest.fixture(autouse=True)
def fixed_torch_threads():
    """Torch's CPU reductions depend on the thread count; keep it fixed for the comparison."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
