"""Directional finite-difference gradient checks, float64 on the NumPy backend.

Chainer's `gradient_check.check_backward`: rather than differencing every
coordinate, pick a few random unit directions v in the joint (inputs,
parameters) space and compare the central difference
    (f(p + eps v) - f(p - eps v)) / (2 eps)
of a scalar objective f with the backprop inner product <grad f(p), v>. One
direction already catches a wrong, missing or transposed gradient term; a few
make a coincidence unlikely. In float64 with eps = 1e-6 the difference is
accurate to ~1e-9 relative, so a tight rtol leaves no room for a wrong formula.

A layer's objective is sum(y * dy) for a fixed random dy (so its backprop
gradient is exactly what the layer's backward computes from dy); a loss's
objective is the loss itself; a network's is its loss as a function of its
parameters. Everything runs through `layer_harness`, the path the trainer uses.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from gpuengine.runtime.precision import CHECK_PRECISION

from .layer_harness import run_layer, run_loss, run_network

Point = dict[str, np.ndarray]


def check_backward(op, *arrays, **options) -> list[tuple]:
    """One entry point: a layer (x), a loss or fused head (y, t) or a network (x, t, weights)."""
    if hasattr(op, "build_forward"):
        return check_layer_backward(op, *arrays, **options)
    if hasattr(op, "forward_backward"):
        return check_loss_backward(op, *arrays, **options)
    return check_network_backward(op, *arrays, **options)


def assert_not_trivial(pairs):
    """The checked directions must carry gradient: a zero backprop would pass any tolerance."""
    assert all(abs(backprop) > 1e-6 for _, backprop in pairs), pairs


def random_weights(specs, rng: np.random.Generator, scale: float = 0.5) -> Point:
    """Float64 values for every parameter, biases included (zeros would hide a bias term)."""
    return {s.name: rng.standard_normal(s.shape) * scale for s in specs}


def random_directions(point: Point, count: int, rng: np.random.Generator) -> list[Point]:
    """`count` directions of unit norm over all arrays of `point` together."""
    directions = []
    for _ in range(count):
        v = {name: rng.standard_normal(a.shape) for name, a in point.items()}
        norm = np.sqrt(sum(float((d * d).sum()) for d in v.values()))
        directions.append({name: d / norm for name, d in v.items()})
    return directions


def directional_check(objective: Callable[[Point], float], point: Point, gradient: Point, *, directions: int = 3,
                      eps: float = 1e-6, rtol: float = 1e-6, atol: float = 1e-9, seed: int = 0) -> list[tuple]:
    """Assert <gradient, v> matches the central difference of `objective` at `point` along random v.

    Returns the (finite difference, backprop) pairs, so callers can also check they are not trivial.
    """
    if not point:
        raise ValueError("nothing to differentiate: the point has no inputs and no parameters")
    if gradient.keys() != point.keys():
        raise ValueError(f"gradient names {sorted(gradient)} differ from the point's {sorted(point)}")
    rng = np.random.default_rng(seed)
    pairs = []
    for k, v in enumerate(random_directions(point, directions, rng)):
        plus = objective({n: point[n] + eps * v[n] for n in point})
        minus = objective({n: point[n] - eps * v[n] for n in point})
        numeric = (plus - minus) / (2 * eps)
        backprop = sum(float((gradient[n] * v[n]).sum()) for n in point)
        if not abs(numeric - backprop) <= atol + rtol * max(abs(numeric), abs(backprop)):
            raise AssertionError(f"direction {k}: finite difference {numeric:.12g} but backprop {backprop:.12g} "
                                 f"(relative error {abs(numeric - backprop) / max(abs(numeric), 1e-300):.3g})")
        pairs.append((numeric, backprop))
    return pairs


def check_layer_backward(layer, x, weights: Point | None = None, *, needs_input_grad: bool = True,
                         training: bool = True, buffers: Point | None = None, seed: int = 0,
                         **tolerances) -> list[tuple]:
    """Check a layer's input gradients (when it makes them) and every parameter gradient against f = sum(y * dy).

    `x` is a tuple of arrays for a layer of several inputs (their gradients are named x0, x1, ...).
    """
    rng = np.random.default_rng(seed)
    xs = x if isinstance(x, tuple) else (x,)
    names = ["x"] if len(xs) == 1 else [f"x{k}" for k in range(len(xs))]
    shapes = [tuple(a.shape[1:]) for a in xs]
    weights = random_weights(layer.param_specs(*shapes), rng) if weights is None else weights
    dy = rng.standard_normal((xs[0].shape[0],) + tuple(layer.output_shape(*shapes)))
    options = dict(precision=CHECK_PRECISION, training=training, buffers=buffers)
    base = run_layer(layer, x, dy, weights=weights or None, needs_input_grad=needs_input_grad, **options)
    made = [f"d{n}" in base for n in names]
    if any(made) != needs_input_grad:
        raise AssertionError(f"needs_input_grad={needs_input_grad} but input gradients made: {made}")
    point, gradient = dict(weights), {n: base[f"grad:{n}"] for n in weights}
    if needs_input_grad:   # without input gradients, the inputs are held fixed and only the parameters move
        point.update(zip(names, xs))
        gradient.update({n: base[f"d{n}"] for n in names})

    def objective(p: Point) -> float:
        moved = tuple(p.get(n, a) for n, a in zip(names, xs))
        params = {n: a for n, a in p.items() if n not in names}
        y = run_layer(layer, moved if len(xs) > 1 else moved[0], dy, weights=params or None, **options)["y"]
        return float((y * dy).sum())

    return directional_check(objective, point, gradient, seed=seed, **tolerances)


def check_loss_backward(loss, y: np.ndarray, t: np.ndarray, *, specs=(), weights: Point | None = None,
                        wrt: tuple[str, ...] | None = None, seed: int = 0, **tolerances) -> list[tuple]:
    """Check a loss's dL/dy and the gradients of the parameters named in `wrt` (default: all of them).

    A fused head also writes gradients of parameters that are not its inputs (the bias
    of the dense layer before it); leave those out of `wrt` and test them separately.
    """
    specs = list(specs)
    weights = random_weights(specs, np.random.default_rng(seed)) if weights is None else weights
    wrt = tuple(weights) if wrt is None else tuple(wrt)
    base = run_loss(loss, y, t, precision=CHECK_PRECISION, specs=specs, weights=weights or None)
    point = {"y": y} | {n: weights[n] for n in wrt}
    gradient = {"y": base["dy"]} | {n: base[f"grad:{n}"] for n in wrt}

    def objective(p: Point) -> float:
        moved = {n: a for n, a in p.items() if n != "y"}
        result = run_loss(loss, p["y"], t, precision=CHECK_PRECISION, specs=specs, weights=(weights | moved) or None)
        return result["loss"]

    return directional_check(objective, point, gradient, seed=seed, **tolerances)


def check_network_backward(net, x: np.ndarray, t: np.ndarray, weights: Point, *, fuse: bool = True, seed: int = 0,
                           **tolerances) -> list[tuple]:
    """Check a whole network's parameter gradients against its loss on the batch (x, t)."""
    base = run_network(net, x, t, precision=CHECK_PRECISION, weights=weights, fuse=fuse)
    gradient = {n: base[f"grad:{n}"] for n in weights}

    def objective(p: Point) -> float:
        return run_network(net, x, t, precision=CHECK_PRECISION, weights=p, fuse=fuse)["loss"]

    return directional_check(objective, dict(weights), gradient, seed=seed, **tolerances)
