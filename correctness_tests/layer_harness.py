"""Run one layer (or loss) in isolation on a backend, from host inputs to host outputs.

Shared by the gradient checks (NumPy, float64) and the GPU-vs-NumPy parity
tests, so every op is exercised through the same build/forward/backward path
the trainer uses. `run_network` does the same for a whole network's forward,
loss and backward (no optimizer), at precisions the trainer does not take.
"""
from __future__ import annotations

import numpy as np

from gpuengine.layers.base import BuildContext
from gpuengine.model.program import TrainingProgram
from gpuengine.runtime.backend import Backend
from gpuengine.runtime.memory import Allocator
from gpuengine.runtime.params import FlatParameters
from gpuengine.runtime.precision import CHECK_PRECISION, policy_for
from gpuengine.runtime.step_state import StepState


def make_context(device: str, precision: str, batch: int, specs, weights: dict | None, buffer_specs=(),
                 training: bool = True, batchnorm: str = "cudnn"):
    backend = Backend(device)
    policy = policy_for(precision)
    allocator = Allocator(backend)
    with backend.activate():
        params = (FlatParameters(specs, allocator, policy, seed=0, buffer_specs=buffer_specs)
                  if specs or buffer_specs else None)
        if params is not None and weights is not None:
            params.load(weights)
    return BuildContext(backend, policy, allocator, params, batch, training, batchnorm=batchnorm)


def _stage(ctx, host: np.ndarray, dtype, category: str):
    """A device (or NumPy-backend) buffer of `dtype` holding the host array."""
    buf = ctx.allocator.zeros(host.shape, dtype, category)
    buf[...] = ctx.backend.xp.asarray(host.astype(dtype))
    return buf


def run_layer(layer, x, dy: np.ndarray, *, device="cpu", precision="fp64", weights: dict | None = None,
              needs_input_grad=True, training: bool = True, buffers: dict | None = None,
              batchnorm: str = "cudnn") -> dict:
    """Forward then backward of `layer` on x (a tuple of arrays for a layer of several inputs) with output
    gradient dy; host copies of everything: y, dx (dx0, dx1, ... for several inputs), grads, buffers."""
    xs = x if isinstance(x, tuple) else (x,)
    batch, shapes = xs[0].shape[0], [tuple(a.shape[1:]) for a in xs]
    ctx = make_context(device, precision, batch, layer.param_specs(*shapes), weights, layer.buffer_specs(*shapes),
                       training, batchnorm)
    be = ctx.backend
    with be.activate():
        if buffers is not None:
            ctx.params.load_buffers(buffers)
        x_dev = [_stage(ctx, a, ctx.policy.compute_dtype, "batch") for a in xs]
        out = layer.build_forward(ctx, *x_dev)
        dy_dev = _stage(ctx, dy.reshape(out.shape), out.dtype, "activations")
        dx = layer.build_backward(ctx, dy_dev, needs_input_grad if len(xs) == 1 else (needs_input_grad,) * len(xs))
        layer.forward()
        layer.backward()
        layer.backward_params()
        be.synchronize()
    result = {"y": be.to_host(out).astype(np.float64)}
    named = {"dx": dx} if len(xs) == 1 else {f"dx{k}": d for k, d in enumerate(dx)}
    result.update({name: be.to_host(d).astype(np.float64) for name, d in named.items() if d is not None})
    if ctx.params is not None:
        result.update({f"grad:{k}": v.astype(np.float64) for k, v in ctx.params.grads_dict().items()})
        result.update({f"buffer:{k}": v.astype(np.float64) for k, v in ctx.params.buffers_dict().items()})
    return result


def run_loss(loss, y: np.ndarray, t: np.ndarray, *, device="cpu", precision="fp64", specs=(), weights=None,
             batch_innermost: bool = False) -> dict:
    """A loss (or fused head) on prediction y and target t: its input gradient, loss and grads (batch_innermost:
    y handed as the (B, H) view of an (H, B) buffer)."""
    ctx = make_context(device, precision, y.shape[0], list(specs), weights)
    be = ctx.backend
    with be.activate():
        state = _step_state(ctx)
        if batch_innermost:
            y_dev = _stage(ctx, np.ascontiguousarray(y.T), ctx.policy.compute_dtype, "activations").T
        else:
            y_dev = _stage(ctx, y, ctx.policy.compute_dtype, "activations")
        t_dev = _stage(ctx, t, np.float32, "batch")
        dy = loss.build(ctx, y_dev, t_dev, state)
        loss.forward_backward()
        be.synchronize()
    result = {"dy": be.to_host(dy).astype(np.float64), "loss": float(be.to_host(state.history)[0])}
    if ctx.params is not None:
        result.update({f"grad:{k}": v.astype(np.float64) for k, v in ctx.params.grads_dict().items()})
    return result


def run_network(net, x: np.ndarray, t: np.ndarray, *, device="cpu", precision="fp64", weights: dict | None = None,
                fuse=True, batchnorm: str = "cudnn", each_step: bool = False) -> dict:
    """One forward, loss and backward of a whole network on the batch (x, t): its loss and parameter grads
    (each_step: the program built as data parallel builds it)."""
    ctx = make_context(device, precision, x.shape[0], net.param_specs(), weights, net.buffer_specs(),
                       batchnorm=batchnorm)
    be = ctx.backend
    with be.activate():
        state = _step_state(ctx)
        x_dev = _stage(ctx, x, ctx.policy.compute_dtype, "batch")
        t_dev = _stage(ctx, t, np.float32, "batch")
        program = TrainingProgram(net, ctx, x_dev, t_dev, state, fuse, each_step=each_step)
        program.forward()
        program.loss_and_backward()
        be.synchronize()
    result = {"loss": float(be.to_host(state.history)[0]), "fused": program.fused}
    result.update({f"grad:{k}": v.astype(np.float64) for k, v in ctx.params.grads_dict().items()})
    result.update({f"buffer:{k}": v.astype(np.float64) for k, v in ctx.params.buffers_dict().items()})
    return result


def _step_state(ctx) -> StepState:
    """A one-step-per-epoch StepState; under fp64 on the CPU its loss slot is float64 too,
    so finite differences of the loss are not drowned by float32 rounding."""
    state = StepState(ctx.backend, ctx.allocator, steps_per_epoch=1)
    if ctx.policy.name == CHECK_PRECISION and not ctx.backend.is_gpu:
        state.history = np.zeros(state.capacity, np.float64)
    return state
