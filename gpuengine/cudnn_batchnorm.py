"""cuDNN frontend graphs of batch normalization (training), with the fusions seed note 002 used.

Forward: y = [relu]( BN(x) [+ residual] ), the running mean and variance
updated in place (the graph's in- and out-running statistics are one buffer)
and the batch mean and inverse standard deviation saved for backward.
Backward: dz = [relu'](dy) from the saved output y (y > 0 exactly where the
pre-activation was), then BN's data, scale and shift gradients; dz itself is a
graph output when a residual input needs it (the gradient of an add reaches
both addends). cuDNN docs, "Normalizations: Batchnorm Forward/Backward", and
the frontend's samples (BN + ReLU, dReLU + dBN). Where cuDNN has no fused engine
for a variant (an fp32 add, say), `CudnnUnsupported` tells the layer to run the
unfused graph and do the add/ReLU in its own kernel.

Epsilon and momentum are pass-by-value scalars: the graph reads them from host
memory that lives as long as the bound graph.
"""
from __future__ import annotations

import numpy as np

from .cudnn_graphs import BoundGraph, TensorSpec, _cudnn, _data_type, graph_key


_SCALAR = dict(dim=[1, 1, 1, 1], stride=[1, 1, 1, 1])


def _host_scalars(**values: float) -> dict:
    """Pass-by-value float32 scalars (epsilon, momentum) as host arrays the bound graph keeps alive."""
    return {name: np.array([value], np.float32) for name, value in values.items()}


def batchnorm_forward(runtime, precision: str, x, scale, bias, running_mean, running_var, y, saved_mean,
                      saved_inv_std, epsilon: float, momentum: float, residual=None, relu: bool = False,
                      allocator=None) -> BoundGraph:
    """One graph: BN training forward [+ residual] [+ ReLU] into y; running statistics updated in place."""
    inputs = {"x": x, "scale": scale, "bias": bias, "running_mean": running_mean, "running_var": running_var}
    if residual is not None:
        inputs["residual"] = residual
    outputs = {"y": y, "saved_mean": saved_mean, "saved_inv_std": saved_inv_std}
    scalars = _host_scalars(epsilon=epsilon, momentum=momentum)

    def define(g):
        t = {name: TensorSpec.of(a).make(g, name) for name, a in inputs.items()}
        t.update({name: g.tensor(name=name, data_type=_cudnn().data_type.FLOAT, is_pass_by_value=True, **_SCALAR)
                  for name in scalars})
        out, mean, inv_std, next_mean, next_var = g.batchnorm(
            name="bn", input=t["x"], scale=t["scale"], bias=t["bias"], in_running_mean=t["running_mean"],
            in_running_var=t["running_var"], epsilon=t["epsilon"], momentum=t["momentum"])
        if residual is not None:
            out = g.add(name="residual_add", a=out, b=t["residual"])
        if relu:
            out = g.relu(name="relu", input=out)
        TensorSpec.of(y).mark_output(out)
        for name, tensor in (("saved_mean", mean), ("saved_inv_std", inv_std)):
            TensorSpec.of(outputs[name]).mark_output(tensor)
        # The next running statistics overwrite the previous ones: both names point at one buffer.
        TensorSpec.of(running_mean).mark_output(next_mean)
        TensorSpec.of(running_var).mark_output(next_var)
        return t | {"y": out, "saved_mean": mean, "saved_inv_std": inv_std, "next_running_mean": next_mean,
                    "next_running_var": next_var}

    buffers = inputs | outputs | {"next_running_mean": running_mean, "next_running_var": running_var}
    scalar_key = tuple((name, float(a[0])) for name, a in sorted(scalars.items()))
    key = graph_key("batchnorm_fwd", precision, None, **inputs, **outputs) + (("relu", relu),) + scalar_key
    graph = runtime.graph(key, x.dtype, precision, define)
    return BoundGraph(runtime, graph, buffers, allocator, host_scalars=scalars, preserve=(running_mean, running_var))


def batchnorm_backward(runtime, precision: str, dy, x, scale, saved_mean, saved_inv_std, dx, dscale, dbias,
                       y=None, dz=None, allocator=None) -> BoundGraph:
    """One graph: [dz = relu'(dy) from the forward output y] -> BN backward into dx, dscale, dbias.

    `y` given: the forward ended in ReLU; `dz` given: the post-ReLU gradient is written out too.
    """
    inputs = {"dy": dy, "x": x, "scale": scale, "saved_mean": saved_mean, "saved_inv_std": saved_inv_std}
    if y is not None:
        inputs["y"] = y
    outputs = {"dx": dx, "dscale": dscale, "dbias": dbias} | ({"dz": dz} if dz is not None else {})

    def define(g):
        t = {name: TensorSpec.of(a).make(g, name) for name, a in inputs.items()}
        grad = t["dy"]
        if y is not None:
            grad = g.relu_backward(name="drelu", loss=t["dy"], input=t["y"])
            grad.set_data_type(_data_type(dy.dtype))
        if dz is not None:
            TensorSpec.of(dz).mark_output(grad)
        d_x, d_scale, d_bias = g.batchnorm_backward(name="dbn", grad=grad, input=t["x"], scale=t["scale"],
                                                    mean=t["saved_mean"], inv_variance=t["saved_inv_std"])
        for name, tensor in (("dx", d_x), ("dscale", d_scale), ("dbias", d_bias)):
            TensorSpec.of(outputs[name]).mark_output(tensor)
        return t | {"dx": d_x, "dscale": d_scale, "dbias": d_bias} | ({"dz": grad} if dz is not None else {})

    buffers = inputs | outputs
    graph = runtime.graph(graph_key("batchnorm_bwd", precision, None, **buffers), dy.dtype, precision, define)
    return BoundGraph(runtime, graph, buffers, allocator)
